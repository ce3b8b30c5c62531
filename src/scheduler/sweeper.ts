/**
 * The sweeper: the slow half of the scheduler, run by every worker process
 * every SWEEP_INTERVAL_MS.
 *  - Heartbeats this node, and publishes its measured latency and pool sizes.
 *  - Refreshes the oldest-wait figures the starvation guard uses.
 *  - Under an advisory lock (one sweeper at a time): settles the open
 *    reservations of nodes that stopped heartbeating (I5 through crashes),
 *    returns their jobs to QUEUED (pg-boss hands them out again after its own
 *    heartbeat check), and lifts quota blocks that no longer hold.
 */
import type { Logger } from 'pino';
import type postgres from 'postgres';
import type { AlertNotifier } from '../alerts/notifier.ts';
import type { DesiredAlert } from '../alerts/rules.ts';
import { syncAlerts, type AlertRow } from '../alerts/store.ts';
import type { Sql } from '../db/client.ts';
import { publishJobEvents } from '../events/bus.ts';
import { releaseLostJob } from '../jobs/store.ts';
import { quotaPeriod } from '../tenants/policy.ts';
import { billedCredits } from './ledger.ts';
import * as sched from './store.ts';

/** Arbitrary, fixed: only one process sweeps at a time. */
const SWEEP_LOCK = 0x736c7377;

export interface SweeperOptions {
  sql: Sql;
  nodeId: string;
  role: string;
  intervalMs: number;
  nodeTimeoutSeconds: number;
  timeoutBilling: 'billed' | 'refunded';
  /** Called each round before the sweep: publish pools, breakers and provider status, refresh the guard. */
  onRound?: () => Promise<void>;
  /** The alerts that should be active now (evaluated by the one sweeping node). */
  desiredAlerts?: (tx: postgres.TransactionSql) => Promise<DesiredAlert[]>;
  notifier?: AlertNotifier;
  /** Puts back (or fails) waiting jobs whose pg-boss job is gone (scheduler/reconcile.ts). */
  reconcile?: (tx: postgres.TransactionSql) => Promise<unknown>;
  log: Logger;
}

export class Sweeper {
  private readonly o: SweeperOptions;
  private timer: NodeJS.Timeout | null = null;
  private round: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(o: SweeperOptions) {
    this.o = o;
  }

  async start(): Promise<void> {
    await sched.heartbeatNode(this.o.sql, this.o.nodeId, this.o.role);
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
    await sched.removeNode(this.o.sql, this.o.nodeId).catch(() => {});
  }

  /** One round; exported for tests that drive the sweep themselves. */
  async sweepOnce(): Promise<{ released: number; unblocked: number }> {
    const { sql } = this.o;
    await sched.heartbeatNode(sql, this.o.nodeId, this.o.role);
    await this.o.onRound?.();
    let transitions: { raised: AlertRow[]; cleared: AlertRow[] } = { raised: [], cleared: [] };
    const result = await sql.begin(async (tx) => {
      const [lock] = await tx`select pg_try_advisory_xact_lock(${SWEEP_LOCK}) as ok`;
      if (!lock!.ok) return { released: 0, unblocked: 0 };
      let released = 0;
      for (const r of await sched.orphanReservations(tx, this.o.nodeTimeoutSeconds)) {
        // No result was stored (result and settlement commit together), so the
        // outcome is unknown: the same rule as a timeout decides the bill.
        const billed = billedCredits('timeout', this.o.timeoutBilling === 'billed' ? r.credits : 0, r.credits);
        if (!(await sched.settleReservation(tx, r.id, billed, 'node_lost'))) continue;
        released++;
        const job = await releaseLostJob(tx, r.jobId, r.attempt);
        if (job) {
          await sched.markQueuesReady(tx, job.tenantId, [job.priority]);
          await publishJobEvents(tx, [{ jobId: r.jobId, tenantId: job.tenantId, state: 'QUEUED' }]);
        }
      }
      if (released > 0) this.o.log.warn({ released }, 'released the reservations of a lost worker node');
      let unblocked = 0;
      const now = new Date();
      for (const t of await sched.unblockableTenants(tx)) {
        const period = quotaPeriod(t.periodAnchor, now);
        const ledger = await sched.ledgerFor(tx, t.tenantId, period.start);
        if (ledger.billed + ledger.reserved + t.cost <= t.quota) {
          unblocked += await sched.unblockQuota(tx, t.tenantId);
        }
      }
      await sched.forgetDeadNodes(tx, this.o.nodeTimeoutSeconds);
      await this.o.reconcile?.(tx);
      if (this.o.desiredAlerts) transitions = await syncAlerts(tx, await this.o.desiredAlerts(tx));
      return { released, unblocked };
    });
    // Tell humans after the alert rows are committed, outside the transaction (a webhook may be slow).
    for (const a of transitions.raised) await this.o.notifier?.raised(a);
    for (const a of transitions.cleared) await this.o.notifier?.cleared(a);
    return result;
  }
}
