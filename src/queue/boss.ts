/**
 * pg-boss, owned here: queue naming, queue creation and its policies. Every
 * tenant has one pg-boss queue per class, all in pg-boss's shared job table
 * (no partition per queue: thousands of tenants must not mean thousands of
 * tables). Nothing calls `work()`: one dispatcher per process fetches from the
 * queues it chooses.
 */
import { PgBoss } from 'pg-boss';
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import { readSetting, writeSetting } from '../db/settings.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';


/** `t.<tenantId>.<class>`; pg-boss names must match [\w.\-/]. */
export function queueName(tenantId: string, jobClass: JobClass): string {
  return `t.${tenantId}.${jobClass.toLowerCase()}`;
}

export interface QueuePolicy {
  retryLimit: number;
  retryDelaySeconds: number;
  /** Upper bound on one attempt, whatever the heartbeat says. */
  expireInSeconds: number;
  /** pg-boss deletes finished jobs after this long: JOB_RETENTION_SECONDS, so it agrees with our retention. */
  deleteAfterSeconds?: number;
}

/**
 * `supervise`: pg-boss's own maintenance timer in this instance (a raw
 * pg-boss setup). Sluice processes pass false and run it through
 * `BossMaintenance`, on one process at a time.
 */
export async function startBoss(url: string, opts: { max?: number; supervise?: boolean } = {}): Promise<PgBoss> {
  const boss = new PgBoss({
    connectionString: url,
    max: opts.max ?? 10,
    application_name: 'sluice-pgboss',
    supervise: opts.supervise ?? true,
    schedule: false,
    // The monitor is what notices a stale heartbeat: run it often so a crashed
    // worker's job comes back in seconds, not a minute.
    monitorIntervalSeconds: 2,
    superviseIntervalSeconds: 2,
    // pg-boss re-reads every queue row into its cache this often (default 60 s). Sluice needs no
    // complete cache (a queue missing from it is read on its own when pg-boss inserts into it), and
    // with 100,000 tenants (300,000 queues) each refresh read ~2 s of rows in every process.
    queueCacheIntervalSeconds: 3600,
  });
  boss.on('error', (err: unknown) => {
    // pg-boss reports background failures here; without a listener they would crash the process.
    process.emitWarning(`pg-boss: ${err instanceof Error ? err.message : String(err)}`);
  });
  await boss.start();
  return boss;
}

/**
 * How long pg-boss keeps a waiting job before its maintenance deletes it. A
 * job may wait for a month and more (a quota WAIT until the tenant's next
 * period, a credits-exhausted stop until the account's renewal, each retry
 * re-inserting it), so tenant queues keep waiting jobs far longer than any
 * wait: 400 days. pg-boss's default (14 days) would silently drop them.
 */
export const TENANT_QUEUE_RETENTION_SECONDS = 400 * 86_400;

/**
 * Migrates queues created with a shorter retention (before it was set) and
 * their waiting jobs, whose deadline (keep_until) was fixed at insert.
 * Idempotent: once extended, a queue is not touched again. Returns the queues extended.
 */
export async function extendTenantQueueRetention(sql: Sql): Promise<number> {
  const rows = await sql`
    with q as (
      update pgboss.queue set retention_seconds = ${TENANT_QUEUE_RETENTION_SECONDS}
      where name like 't.%' and retention_seconds < ${TENANT_QUEUE_RETENTION_SECONDS}
      returning name
    ), j as (
      update pgboss.job set keep_until = start_after + make_interval(secs => ${TENANT_QUEUE_RETENTION_SECONDS})
      where name in (select name from q) and state in ('created', 'retry')
        and keep_until < start_after + make_interval(secs => ${TENANT_QUEUE_RETENTION_SECONDS})
      returning 1
    )
    select (select count(*) from q)::int as queues, (select count(*) from j)::int as jobs`;
  return rows[0]!.queues as number;
}

/** Creates a tenant's class queues; safe to repeat. */
export async function ensureTenantQueues(boss: PgBoss, tenantId: string, policy: QueuePolicy): Promise<void> {
  for (const jobClass of CLASSES) {
    const name = queueName(tenantId, jobClass);
    const existing = await boss.getQueue(name);
    if (existing) continue;
    try {
      await boss.createQueue(name, {
        retryLimit: policy.retryLimit,
        retryDelay: policy.retryDelaySeconds,
        retryBackoff: true,
        expireInSeconds: policy.expireInSeconds,
        retentionSeconds: TENANT_QUEUE_RETENTION_SECONDS,
        ...(policy.deleteAfterSeconds !== undefined ? { deleteAfterSeconds: policy.deleteAfterSeconds } : {}),
      });
    } catch (err) {
      // Another process created it between our check and our create.
      if (!(await boss.getQueue(name))) throw err;
    }
  }
}

/**
 * Brings every tenant queue's finished-job deletion to JOB_RETENTION_SECONDS
 * (queues created before it was set, or under another value), in one
 * statement on pg-boss's queue table rather than one call per tenant. Only the
 * deletion of finished jobs: how long waiting jobs are kept is not touched.
 */
export async function applyFinishedJobRetention(sql: Sql, seconds: number): Promise<void> {
  await sql`update pgboss.queue set deletion_seconds = ${seconds} where name like 't.%' and deletion_seconds <> ${seconds}`;
}

/**
 * Room kept free on every page of pg-boss's shared job table (a storage parameter, not its
 * schema): Sluice writes each job's row twice after its insert (activation, completion), and a new
 * version that fits on the old one's page saves a WAL record per write (the lock Postgres logs
 * before it moves a row to another page) and most of the new version's bytes. Pages already full
 * keep their rows; new rows go to pages filled to this percentage.
 */
export const BOSS_JOB_FILLFACTOR = 70;

/**
 * The storage setting above and the three tenant-queue migrations above (heartbeats off, the long retention, finished-job
 * deletion), run at a process's start only when the settings row says they have not yet run for
 * these values. Each one scans every row of pgboss.queue (`name like 't.%'` cannot use its key):
 * with 100,000 tenants (300,000 queues) that was most of a worker's 14 s start, on every start of
 * every process, though queues Sluice creates already carry these values (ensureTenantQueues).
 * The marker is written after they ran, so a crash in between only means they run again; a
 * different JOB_RETENTION_SECONDS changes the marker and runs them again. Returns the queues whose
 * retention was extended, or null when skipped.
 */
export async function alignTenantQueues(sql: Sql, finishedJobRetentionSeconds: number): Promise<number | null> {
  const marker = `v1 retention=${TENANT_QUEUE_RETENTION_SECONDS} deletion=${finishedJobRetentionSeconds} heartbeat=off fillfactor=${BOSS_JOB_FILLFACTOR}`;
  if ((await readSetting(sql, QUEUE_POLICY_SETTING)) === marker) return null;
  try {
    await sql.unsafe(`alter table pgboss.job_common set (fillfactor = ${BOSS_JOB_FILLFACTOR})`);
  } catch (err) {
    // Another role owns pg-boss's tables (set up by hand): a tuning, not a need; the rest goes on.
    if ((err as { code?: string }).code !== '42501') throw err;
    process.emitWarning(`pg-boss's job table keeps its fillfactor: ${(err as Error).message}`);
  }
  await disableBossHeartbeats(sql);
  const extended = await extendTenantQueueRetention(sql);
  await applyFinishedJobRetention(sql, finishedJobRetentionSeconds);
  await writeSetting(sql, QUEUE_POLICY_SETTING, marker);
  return extended;
}

/** The settings row recording which tenant-queue policy values every queue was last brought to. */
export const QUEUE_POLICY_SETTING = 'tenant_queue_policy';

/**
 * Postgres array literal for a JS array. pg-boss passes id lists as plain
 * arrays (pg serializes them); postgres.js has no serializer for e.g. uuid[]
 * parameters, but the server parses a literal into any array type.
 */
export function arrayLiteral(values: readonly unknown[]): string {
  const item = (v: unknown): string => {
    if (v === null || v === undefined) return 'NULL';
    if (Array.isArray(v)) return arrayLiteral(v);
    const s = typeof v === 'object' ? JSON.stringify(v) : String(v);
    return `"${s.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;
  };
  return `{${values.map(item).join(',')}}`;
}

/** A pg-boss `db` adapter over a postgres.js transaction, so jobs insert atomically with our rows. */
export function inTransaction(tx: Sql | postgres.TransactionSql) {
  return {
    executeSql: async (text: string, values: unknown[] = []) => ({
      rows: await tx.unsafe(text, values.map((v) => (Array.isArray(v) ? arrayLiteral(v) : v)) as postgres.ParameterOrJSON<never>[]),
    }),
  };
}

/**
 * Queues created before the attempt lease had a pg-boss heartbeat: turn it
 * off (one statement at start), so pg-boss's monitor never expires a live
 * attempt on its own. Tenant queues only (`t.` prefix).
 */
export async function disableBossHeartbeats(sql: Sql): Promise<void> {
  await sql`update pgboss.queue set heartbeat_seconds = null where name like 't.%' and heartbeat_seconds is not null`;
}

/**
 * Puts jobs back in their pg-boss queue under the same ids (delete, then
 * insert), with the same priority: they wait out `startAfter` without
 * spending pg-boss's retry budget. pg-boss is the queue of record; our jobs row says the job waits.
 */
export async function reinsertJobs(
  boss: PgBoss,
  tx: Sql | postgres.TransactionSql,
  queue: string,
  jobs: ReadonlyArray<{ id: string; data: object; startAfter?: Date | undefined }>,
): Promise<void> {
  if (jobs.length === 0) return;
  const db = inTransaction(tx);
  // The job keeps its priority: its rank among its tenant's fairness keys (scheduler/fair-keys.ts),
  // so a retry is served at its rank when due, as pg-boss's own retry is, not behind every key.
  const rows = await tx`select id, priority from pgboss.job where name = ${queue} and id = any(${jobs.map((j) => j.id)}::uuid[])`;
  const priority = new Map(rows.map((r) => [r.id as string, r.priority as number]));
  await boss.deleteJob(queue, jobs.map((j) => j.id), { db });
  await boss.insert(queue, jobs.map((j) => ({ id: j.id, data: j.data, priority: priority.get(j.id) ?? 0, ...(j.startAfter ? { startAfter: j.startAfter } : {}) })), { db });
}

/**
 * Locks a waiting job's pg-boss row before its jobs row (the lock order for
 * waiting jobs, the one a lease follows: fetch, then claim). Only a waiting
 * row (pg-boss's states before `active`): a running job's row belongs to its
 * settlement, which takes its tenant's row after it (sluice_settle_group), so
 * a cancel holding the tenant must never wait for it (that was a deadlock);
 * a running job is not cancellable anyway.
 */
export async function lockBossJob(tx: postgres.TransactionSql, queue: string, id: string): Promise<void> {
  await tx`select 1 from pgboss.job where name = ${queue} and id = ${id} and state < 'active' for update`;
}

/** lockBossJob for many jobs in one statement (cancelJobs), in id order like every other path that locks several. */
export async function lockBossJobs(tx: postgres.TransactionSql, queues: readonly string[], ids: readonly string[]): Promise<void> {
  if (ids.length === 0) return;
  await tx`select 1 from pgboss.job where name = any(${queues as string[]}::text[]) and id = any(${ids as string[]}::uuid[]) and state < 'active' order by id for update`;
}

/**
 * Deletes a waiting job's pg-boss row (pg-boss's states before `active`): a
 * late settlement finished the job while it waited to run again
 * (dispatch/late-settlement.ts), so nothing may fetch it. The caller locked
 * it first (lockBossJob) and finished the jobs row in the same transaction.
 */
export async function deleteWaitingBossJob(tx: postgres.TransactionSql, queue: string, id: string): Promise<boolean> {
  const rows = await tx`delete from pgboss.job where name = ${queue} and id = ${id} and state < 'active' returning id`;
  return rows.length > 0;
}

/**
 * Where the next maintenance page starts: after this page's last name, or
 * from the beginning again when this page was the last (shorter than a page).
 */
export function nextMaintenanceCursor(names: readonly string[], pageSize: number): string | undefined {
  return names.length >= pageSize ? names[names.length - 1] : undefined;
}

/** Arbitrary, fixed: the session advisory lock of the one process running pg-boss's maintenance. */
const MAINTENANCE_LOCK = 0x736c6d74;

/**
 * pg-boss's maintenance (supervise: per queue, stats, expiry of over-long
 * attempts, deletion of finished jobs past retention) on ONE process at a
 * time, and a bounded PAGE of queues per pass.
 *
 * Why paged: `boss.supervise()` with no argument walks every queue, several
 * statements per 100 queues plus the stats aggregate. With 100,000 tenants
 * (300,000 queues) one pass outlasts the interval, so maintenance ran without
 * pause, rewriting `pgboss.queue` rows and keeping an autovacuum of that table
 * busy beside the hot path. Nothing in it is urgent for Sluice: an attempt's
 * liveness is the attempt lease (the sweeper), not pg-boss's expiry, and
 * retention counts in days. So each pass supervises the next `pageSize`
 * queues in name order and wraps around: the cost of a pass is bounded
 * whatever the tenant count, and every queue is visited once per
 * ceil(queues / pageSize) passes (docs/SCALING.md gives the cycle time).
 *
 * The process whose reserved connection holds a session advisory lock runs
 * it every `intervalMs`; when that process dies its session ends, the lock is
 * free, and another takes over within an interval. The lock is taken on
 * `lockSql`, a session to Postgres itself (DATABASE_DIRECT_URL): through a
 * transaction-mode pooler the next statement of a "session" may land on
 * another server connection, so the lock could neither be checked nor released.
 */
export class BossMaintenance {
  private timer: NodeJS.Timeout | null = null;
  private leader: postgres.ReservedSql | null = null;
  private running: Promise<void> = Promise.resolve();
  private stopped = false;
  private readonly boss: PgBoss;
  private readonly sql: Sql;
  private readonly intervalMs: number;
  private readonly onError: (err: unknown) => void;
  private readonly pageSize: number;
  private readonly lockSql: Sql;
  /** The last queue name of the previous page; undefined: start from the first queue. */
  private cursor: string | undefined;

  constructor(boss: PgBoss, sql: Sql, intervalMs: number, onError: (err: unknown) => void, pageSize = 1000, lockSql: Sql = sql) {
    this.boss = boss;
    this.sql = sql;
    this.lockSql = lockSql;
    this.intervalMs = intervalMs;
    this.onError = onError;
    this.pageSize = pageSize;
  }

  get isLeader(): boolean {
    return this.leader !== null;
  }

  start(): void {
    const tick = () => {
      if (this.stopped) return;
      this.running = this.pass()
        .catch((err) => this.onError(err))
        .finally(() => {
          if (!this.stopped) this.timer = setTimeout(tick, this.intervalMs);
        });
    };
    this.timer = setTimeout(tick, Math.min(this.intervalMs, 1000));
  }

  /** One turn: become the maintenance process if no one is, and if this is it, supervise once. */
  async pass(): Promise<void> {
    if (!this.leader) {
      // On a separate session pool, look first (one pooled statement): while another process holds
      // the lock, this one opens no session connection every interval just to be refused.
      if (this.lockSql !== this.sql && (await this.lockHeldElsewhere())) return;
      const conn = await this.lockSql.reserve();
      try {
        const [row] = await conn`select pg_try_advisory_lock(${MAINTENANCE_LOCK}) as ok`;
        if (row!.ok) this.leader = conn;
        else conn.release();
      } catch (err) {
        conn.release();
        throw err;
      }
    } else {
      try {
        // The lock lives as long as this session: check it is still there.
        await this.leader`select 1`;
      } catch (err) {
        this.leader.release();
        this.leader = null;
        throw err;
      }
    }
    if (this.leader && !this.stopped) await this.superviseNextPage();
  }

  /** Whether some session holds the maintenance lock in this database (pg_locks: a bigint key is classid, objid, objsubid 1). */
  private async lockHeldElsewhere(): Promise<boolean> {
    const [row] = await this.sql`
      select exists (
        select 1 from pg_locks
        where locktype = 'advisory' and granted and objsubid = 1
          and classid = ${Math.floor(MAINTENANCE_LOCK / 2 ** 32)}::bigint::oid and objid = ${MAINTENANCE_LOCK % 2 ** 32}::bigint::oid
          and database = (select oid from pg_database where datname = current_database())
      ) as held`;
    return row!.held as boolean;
  }

  /**
   * Supervises the next page of queues (name order, wrapping around) that
   * hold any pg-boss row, and returns the names supervised. pg-boss's `supervise` takes a list of queue rows as
   * returned by `getQueues` (its typings only name the one-queue form; the
   * contract test holds it to the list form).
   */
  async superviseNextPage(): Promise<string[]> {
    const page = await this.boss.getQueues(undefined, { limit: this.pageSize, ...(this.cursor !== undefined ? { after: this.cursor } : {}) });
    this.cursor = nextMaintenanceCursor(page.map((q) => q.name), this.pageSize);
    // A queue without a single pg-boss row has nothing to expire, count or delete, and most
    // registered tenants' queues are such; pg-boss's per-queue deletion walk (several
    // statements per queue) would still run for each. One indexed probe per page skips them.
    const names = page.map((q) => q.name);
    const withRows = new Set(
      names.length === 0
        ? []
        : (await this.sql`select n from unnest(${names}::text[]) as n where exists (select 1 from pgboss.job j where j.name = n)`).map((r) => r.n as string),
    );
    const due = page.filter((q) => withRows.has(q.name));
    // Called even with no queue due: the pass's tail (vacuum and index checks, warnings, instances) still runs.
    await (this.boss as unknown as { supervise(queues: typeof page): Promise<void> }).supervise(due);
    return due.map((q) => q.name);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.running;
    if (this.leader) {
      await this.leader`select pg_advisory_unlock(${MAINTENANCE_LOCK})`.catch(() => {});
      this.leader.release();
      this.leader = null;
    }
  }
}
