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
 *    transaction, and put their jobs back in QUEUED and in pg-boss; not
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
import { releaseLostJobs } from '../jobs/store.ts';
import { queueName, reinsertJobs } from '../queue/boss.ts';
import { type JobClass } from '../config/classes.ts';
import { quotaPeriod } from '../tenants/policy.ts';
import { expiryHoldMs } from '../dispatch/liveness.ts';
import { expirySettlement } from './ledger.ts';
import { compareQueueKeys } from './lock-order.ts';
import { ledgerFor } from './sql/ledger.ts';
import { databaseUpForMs, forgetDeadNodes, heartbeatNode, removeNode } from './sql/nodes.ts';
import { markQueuesReady } from './sql/queues.ts';
import { lockExpiredReservations, settleReservations } from './sql/reservations.ts';
import { lockTenants, unblockableTenants, unblockQuota } from './sql/tenants.ts';

/** Arbitrary, fixed: only one process evaluates alerts at a time. */
const SWEEP_LOCK = 0x736c7377;
/** Expired reservations settled per short transaction. */
const EXPIRED_BATCH = 200;

export interface SweeperOptions {
  sql: Sql;
  boss: PgBoss;
  nodeId: string;
  role: string;
  intervalMs: number;
  nodeTimeoutSeconds: number;
  timeoutBilling: 'billed' | 'refunded';
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
   * Lock order: reservations, tenants (id order), jobs, pgboss.job,
   * sched_queues, ledger, windows (inside sluice_settle, last).
   */
  private async releaseExpired(): Promise<number> {
    const { sql, boss } = this.o;
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
    for (;;) {
      const n = await sql.begin(async (tx) => {
        const expired = await lockExpiredReservations(tx, EXPIRED_BATCH);
        if (expired.length === 0) return 0;
        await lockTenants(tx, expired.map((r) => r.tenantId));
        const jobs = await releaseLostJobs(tx, expired.map((r) => ({ jobId: r.jobId, attempt: r.attempt })));
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
          await reinsertJobs(boss, tx, queue, g.jobs.map((j) => ({ id: j.id, data: { tenantId: j.tenantId, api: j.api, params: j.params } })));
          await markQueuesReady(tx, g.tenantId, [g.jobClass]);
        }
        // Never marked sent: refunded (nothing went upstream); sent: the timeout rule (ledger.ts).
        await settleReservations(tx, expired.map((r) => ({ id: r.id, ...expirySettlement(r.credits, r.sent, this.o.timeoutBilling) })));
        await publishJobEvents(tx, jobs.map((j) => ({ jobId: j.id, tenantId: j.tenantId, state: 'QUEUED' as const })));
        return expired.length;
      });
      released += n;
      if (n < EXPIRED_BATCH) break;
    }
    if (released > 0) this.o.log.warn({ released }, 'settled the reservations of attempts whose lease expired');
    return released;
  }

  /** Quota-blocked tenants whose next job now fits: one short transaction each. */
  private async liftQuotaBlocks(): Promise<number> {
    const { sql } = this.o;
    let unblocked = 0;
    const now = new Date();
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
