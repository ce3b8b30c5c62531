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

export const CLASSES = ['INTERACTIVE', 'STANDARD', 'BULK'] as const;
export type JobClass = (typeof CLASSES)[number];

/** `t.<tenantId>.<class>`; pg-boss names must match [\w.\-/]. */
export function queueName(tenantId: string, jobClass: JobClass): string {
  return `t.${tenantId}.${jobClass.toLowerCase()}`;
}

export interface QueuePolicy {
  retryLimit: number;
  retryDelaySeconds: number;
  /** A fetched job whose worker stops touching it comes back after this long. */
  heartbeatSeconds: number;
  /** Upper bound on one attempt, whatever the heartbeat says. */
  expireInSeconds: number;
  /** pg-boss deletes finished jobs after this long: JOB_RETENTION_SECONDS, so it agrees with our retention. */
  deleteAfterSeconds?: number;
}

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
  });
  boss.on('error', (err: unknown) => {
    // pg-boss reports background failures here; without a listener they would crash the process.
    process.emitWarning(`pg-boss: ${err instanceof Error ? err.message : String(err)}`);
  });
  await boss.start();
  return boss;
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
        heartbeatSeconds: policy.heartbeatSeconds,
        expireInSeconds: policy.expireInSeconds,
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
 * Defers a queue's waiting jobs for some APIs until `until`: their breaker is
 * open. pg-boss has no bulk "start later" call, so this updates its job table
 * directly (documented as supported for such uses) together with our rows.
 */
export async function deferApiJobs(
  tx: postgres.TransactionSql,
  queue: string,
  tenantId: string,
  jobClass: JobClass,
  apis: readonly string[],
  until: Date,
): Promise<void> {
  await tx`
    update pgboss.job set start_after = ${until}
    where name = ${queue} and state in ('created', 'retry') and data->>'api' = any(${apis as string[]}::text[]) and start_after < ${until}`;
  await tx`
    update jobs set run_after = ${until}
    where tenant_id = ${tenantId} and priority = ${jobClass} and state = 'QUEUED' and api = any(${apis as string[]}::text[]) and run_after < ${until}`;
}
