/**
 * The sweeper: the slow half of the scheduler, run by every worker process
 * every SWEEP_INTERVAL_MS. Each round runs a list of steps, each in its own
 * short transaction(s), so no step holds locks across another and one failing
 * step does not stop the rest:
 *  - heartbeat this node (the node list only; it decides nothing about attempts),
 *  - publish measured latency, pool sizes, breakers (onRound),
 *  - settle the reservations whose ATTEMPT LEASE expired (the one liveness
 *    authority; the dispatcher refreshes its attempts' leases on its own
 *    timer, so a slow sweep never frees a live node's slots), a batch per
 *    transaction (a failing row isolated by halving), and put their jobs back
 *    in QUEUED and in pg-boss, or fail them past their attempt limit; not
 *    until one lease after both Postgres and this node are back from an
 *    outage (dispatch/liveness.ts expiryHoldMs), so live owners store the
 *    outcomes they hold first,
 *  - lift quota blocks that no longer hold, one tenant per transaction,
 *  - forget long-dead nodes,
 *  - alerts, in their own transaction, on one sweeping node at a time.
 * One more periodic step is one more entry in `steps`.
 */
import { reclaimExpiredRooms } from '../admission/store.ts';
import type { Logger } from 'pino';
import type postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import type { AlertNotifier } from '../alerts/notifier.ts';
import type { DesiredAlert } from '../alerts/rules.ts';
import { syncAlerts, type AlertRow } from '../alerts/store.ts';
import type { Sql } from '../db/client.ts';
import { publishJobEvents } from '../events/bus.ts';
import { queuedTrace } from '../tracing/job-trace.ts';
import { finishJobs, releaseLostJobs } from '../jobs/store.ts';
import { isDatabaseUnavailable } from '../db/availability.ts';
import { queueName, reinsertJobs } from '../queue/boss.ts';
import { type JobClass } from '../config/classes.ts';
import { quotaPeriod } from '../tenants/policy.ts';
import { expiryHoldMs } from '../dispatch/liveness.ts';
import { ATTEMPT_LOST_CODE, attemptLostMessage, expirySettlement, lostAttemptFates } from './ledger.ts';
import { compareQueueKeys } from './lock-order.ts';
import { ledgerFor } from './sql/ledger.ts';
import { databaseUpForMs, forgetDeadNodes, heartbeatNode, removeNode } from './sql/nodes.ts';
import { markQueuesReady } from './sql/queues.ts';
import { expiredReservationIds, lockExpiredReservations, recordExpiryFailure, settleReservations } from './sql/reservations.ts';
import { lockTenants, unblockableTenants, unblockQuota } from './sql/tenants.ts';

/** Arbitrary, fixed: only one process evaluates alerts at a time. */
const SWEEP_LOCK = 0x736c7377;
/** Expired reservations settled per short transaction. */
const EXPIRED_BATCH = 200;
/** At most this many batches per round: a huge backlog of expiries is worked off over rounds, and the other steps still run. */
const MAX_EXPIRY_PASSES = 50;
/** A reservation whose expiry failed alone is tried again after this long (EXPIRY_RETRY_SECONDS). */
export const EXPIRY_RETRY_SECONDS = 600;

export interface SweeperOptions {
  sql: Sql;
  boss: PgBoss;
  nodeId: string;
  role: string;
  intervalMs: number;
  nodeTimeoutSeconds: number;
  timeoutBilling: 'billed' | 'refunded';
  /** JOB_RETRY_LIMIT: a lost (sent) attempt past it fails the job with ATTEMPT_LOST; absent: no limit. */
  retryLimit?: number;
  /** How long a reservation whose expiry failed alone is skipped before it is tried again (default EXPIRY_RETRY_SECONDS). */
  expiryRetrySeconds?: number;
  /** The attempt lease (ATTEMPT_LEASE_SECONDS); default nodeTimeoutSeconds, as in the configuration. */
  leaseSeconds?: number;
  /** Called each round before the sweep: publish pools, breakers and provider status, refresh the guard. */
  onRound?: () => Promise<void>;
  /** The alerts that should be active now (evaluated by the one sweeping node). */
  desiredAlerts?: (tx: postgres.TransactionSql) => Promise<DesiredAlert[]>;
  notifier?: AlertNotifier;
  /** Puts back (or fails) waiting jobs whose pg-boss job is gone (scheduler/reconcile.ts). */
  reconcile?: (tx: postgres.TransactionSql) => Promise<unknown>;
  log: Logger;
}

export interface SweepResult {
  released: number;
  unblocked: number;
  /** Expired admission reservations deleted (their bulk submission never wrote its jobs). */
  reclaimedRooms: number;
}

export class Sweeper {
  private readonly o: SweeperOptions;
  private timer: NodeJS.Timeout | null = null;
  private round: Promise<void> = Promise.resolve();
  private stopped = false;
  /** The last heartbeat failed: this node could not reach Postgres. */
  private cutOff = false;
  /** When (monotonic ms) this node reached Postgres again after failing to; null if it never failed. */
  private backAt: number | null = null;
  /** The current expiry hold was logged (once per hold, not every round). */
  private holdLogged = false;
  /** The periodic steps, in order; each runs on its own (short transactions, errors logged). */
  private readonly steps: ReadonlyArray<{ name: string; run: (r: SweepResult) => Promise<void> }> = [
    { name: 'heartbeat', run: () => this.heartbeat() },
    { name: 'publish', run: async () => this.o.onRound?.() },
    { name: 'expired leases', run: async (r) => void (r.released += await this.releaseExpired()) },
    { name: 'quota blocks', run: async (r) => void (r.unblocked += await this.liftQuotaBlocks()) },
    { name: 'dead nodes', run: () => forgetDeadNodes(this.o.sql, this.o.nodeTimeoutSeconds) },
    // Room reserved by a bulk submission whose process died before writing its jobs (admission/store.ts).
    { name: 'admission reservations', run: async (r) => void (r.reclaimedRooms += await reclaimExpiredRooms(this.o.sql)) },
    { name: 'reconcile', run: () => this.reconcile() },
    { name: 'alerts', run: () => this.syncAlerts() },
  ];

  constructor(o: SweeperOptions) {
    this.o = o;
  }

  async start(): Promise<void> {
    await heartbeatNode(this.o.sql, this.o.nodeId, this.o.role);
    const tick = () => {
      if (this.stopped) return;
      this.round = this.sweepOnce()
        .then(() => {})
        .catch((err) => this.o.log.error({ err }, 'sweep failed'))
        .finally(() => {
          if (!this.stopped) this.timer = setTimeout(tick, this.o.intervalMs);
        });
    };
    this.timer = setTimeout(tick, this.o.intervalMs);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.round;
    await removeNode(this.o.sql, this.o.nodeId).catch(() => {});
  }

  /** One round; exported for tests that drive the sweep themselves. */
  async sweepOnce(): Promise<SweepResult> {
    const result: SweepResult = { released: 0, unblocked: 0, reclaimedRooms: 0 };
    for (const step of this.steps) {
      try {
        await step.run(result);
      } catch (err) {
        this.o.log.error({ err, step: step.name }, 'sweep step failed');
      }
    }
    return result;
  }

  /** The node list's heartbeat, which also tells when this node reaches Postgres again after failing to. */
  private async heartbeat(): Promise<void> {
    try {
      await heartbeatNode(this.o.sql, this.o.nodeId, this.o.role);
    } catch (err) {
      this.cutOff = true;
      throw err;
    }
    if (this.cutOff) {
      this.cutOff = false;
      this.backAt = performance.now();
    }
  }

  /**
   * Settles reservations whose attempt lease expired, EXPIRED_BATCH per short
   * transaction, once expiryHoldMs allows: right after Postgres or this node
   * is back from an outage, an expired lease may belong to a live owner that
   * holds its outcome and has not reconnected yet. No result was stored (result and settlement commit
   * together), so the outcome is unknown: a reservation its node marked sent
   * is billed by the timeout rule, one never marked is refunded (nothing went
   * upstream). The bill reaches the job's creditsBilled in the same statement
   * (sluice_settle), and a settlement arriving later is reconciled
   * (dispatch/late-settlement.ts).
   *
   * A lost attempt that was sent counts toward the job's attempt limit: past
   * JOB_RETRY_LIMIT the job ends FAILED with ATTEMPT_LOST instead of running
   * again (a call that kills its worker would otherwise run, and bill, for ever).
   *
   * A batch whose settlement fails is split in halves and retried, down to
   * one reservation; one that fails alone is recorded on its row with the
   * reason (recordExpiryFailure), skipped for EXPIRY_RETRY_SECONDS and named
   * by an alert, and the rest of the batch goes on. A database outage is not
   * a bad row: it ends the step (the next round tries again).
   */
  private async releaseExpired(): Promise<number> {
    const { sql } = this.o;
    const hold = expiryHoldMs({
      leaseMs: (this.o.leaseSeconds ?? this.o.nodeTimeoutSeconds) * 1000,
      dbUpForMs: await databaseUpForMs(sql),
      nodeBackForMs: this.backAt === null ? Infinity : performance.now() - this.backAt,
    });
    if (hold > 0) {
      if (!this.holdLogged) this.o.log.info({ holdMs: Math.round(hold) }, 'Postgres or this node (re)started recently: expired leases are left to their owners for one more lease');
      this.holdLogged = true;
      return 0;
    }
    this.holdLogged = false;
    let released = 0;
    // Bounded: each pass settles or records every id it read, and recorded ones are not read again this round.
    for (let pass = 0; pass < MAX_EXPIRY_PASSES; pass++) {
      const ids = await expiredReservationIds(sql, EXPIRED_BATCH, this.o.expiryRetrySeconds ?? EXPIRY_RETRY_SECONDS);
      if (ids.length === 0) break;
      released += await this.expireIsolated(ids);
      if (ids.length < EXPIRED_BATCH) break;
    }
    if (released > 0) this.o.log.warn({ released }, 'settled the reservations of attempts whose lease expired');
    return released;
  }

  /** `ids` in one transaction; on a failure that is not an outage, each half alone, down to one reservation, which is recorded. */
  private async expireIsolated(ids: readonly string[]): Promise<number> {
    try {
      return await this.o.sql.begin((tx) => this.expire(tx, ids));
    } catch (err) {
      if (isDatabaseUnavailable(err)) throw err;
      if (ids.length === 1) {
        const reason = err instanceof Error ? err.message : String(err);
        await recordExpiryFailure(this.o.sql, ids[0]!, reason);
        this.o.log.error({ reservation: ids[0], reason }, 'an expired reservation could not be settled: recorded and skipped; the others go on');
        return 0;
      }
      const mid = Math.ceil(ids.length / 2);
      return (await this.expireIsolated(ids.slice(0, mid))) + (await this.expireIsolated(ids.slice(mid)));
    }
  }

  /**
   * One transaction's expiry. Lock order: reservations, tenants (id order), jobs, pgboss.job,
   * sched_queues, ledger, windows (inside sluice_settle, last).
   */
  private async expire(tx: postgres.TransactionSql, ids: readonly string[]): Promise<number> {
    const { boss, retryLimit } = this.o;
    const expired = await lockExpiredReservations(tx, ids);
    if (expired.length === 0) return 0;
    await lockTenants(tx, expired.map((r) => r.tenantId));
    const { release, fail } = lostAttemptFates(expired, retryLimit ?? Infinity);
    const jobs = await releaseLostJobs(tx, release.map((r) => ({ jobId: r.jobId, attempt: r.attempt })));
    const byQueue = new Map<string, { tenantId: string; jobClass: JobClass; jobs: typeof jobs }>();
    for (const j of jobs) {
      const queue = queueName(j.tenantId, j.priority);
      const g = byQueue.get(queue) ?? { tenantId: j.tenantId, jobClass: j.priority, jobs: [] };
      g.jobs.push(j);
      byQueue.set(queue, g);
    }
    // Queue key order (tenant id, class), as every multi-row writer of sched_queues takes them
    // (releaseLostJobs' depth trigger has locked these rows already, in that order).
    for (const [queue, g] of [...byQueue].sort(([, a], [, b]) => compareQueueKeys(a, b))) {
      // A traced job keeps its trace: the next lease continues it, with the lost lease as its wait's reason.
      await reinsertJobs(boss, tx, queue, g.jobs.map((j) => ({ id: j.id, data: { tenantId: j.tenantId, api: j.api, params: j.params, ...(j.traceParent ? queuedTrace(j.traceParent, 'LEASE_LOST') : {}) } })));
      await markQueuesReady(tx, g.tenantId, [g.jobClass]);
    }
    // Past the attempt limit: FAILED with its own code, its result stored and pg-boss acked with it.
    const failed = await finishJobs(tx, fail.map((r) => ({
      id: r.jobId,
      attempt: r.attempt,
      state: 'FAILED' as const,
      queue: queueName(r.tenantId, r.jobClass),
      result: { data: null, errorCode: ATTEMPT_LOST_CODE, errorMessage: attemptLostMessage(r.attempt), httpStatus: null },
    })));
    if (failed.size > 0) this.o.log.warn({ jobs: [...failed].slice(0, 20), count: failed.size }, 'jobs whose attempts kept being lost (their worker died or never settled) failed with ATTEMPT_LOST');
    // Never marked sent: refunded (nothing went upstream); sent: the timeout rule (ledger.ts).
    await settleReservations(tx, expired.map((r) => ({ id: r.id, ...expirySettlement(r.credits, r.sent, this.o.timeoutBilling) })));
    await publishJobEvents(tx, [
      ...jobs.map((j) => ({ jobId: j.id, tenantId: j.tenantId, state: 'QUEUED' as const })),
      ...fail.filter((r) => failed.has(r.jobId)).map((r) => ({ jobId: r.jobId, tenantId: r.tenantId, state: 'FAILED' as const })),
    ]);
    return expired.length;
  }

  /** Quota-blocked tenants whose next job now fits: one short transaction each. */
  private async liftQuotaBlocks(): Promise<number> {
    const { sql } = this.o;
    let unblocked = 0;
    const now = new Date();
    // Found fitting by one statement, then re-checked under the tenant's row (unblockQuota is
    // conditional on the block): a lease may have reserved meanwhile, which the next round sees.
    for (const t of await unblockableTenants(sql)) {
      const period = quotaPeriod(t.periodAnchor, now);
      const ledger = await ledgerFor(sql, t.tenantId, period.start);
      if (ledger.billed + ledger.reserved + t.cost <= t.quota) unblocked += await sql.begin((tx) => unblockQuota(tx, t.tenantId));
    }
    return unblocked;
  }

  /** Waiting jobs whose pg-boss job is gone, in their own transaction, on one sweeping node at a time. */
  private async reconcile(): Promise<void> {
    const reconcile = this.o.reconcile;
    if (!reconcile) return;
    await this.o.sql.begin(async (tx) => {
      const [lock] = await tx`select pg_try_advisory_xact_lock(${SWEEP_LOCK}) as ok`;
      if (lock!.ok) await reconcile(tx);
    });
  }

  /** Alerts in their own transaction, on one node at a time; humans are told after the commit (a webhook may be slow). */
  private async syncAlerts(): Promise<void> {
    const desired = this.o.desiredAlerts;
    if (!desired) return;
    const transitions = await this.o.sql.begin(async (tx): Promise<{ raised: AlertRow[]; cleared: AlertRow[] }> => {
      const [lock] = await tx`select pg_try_advisory_xact_lock(${SWEEP_LOCK}) as ok`;
      if (!lock!.ok) return { raised: [], cleared: [] };
      return syncAlerts(tx, await desired(tx));
    });
    for (const a of transitions.raised) await this.o.notifier?.raised(a);
    for (const a of transitions.cleared) await this.o.notifier?.cleared(a);
  }
}
