/**
 * The settler: stores the outcomes of this process's attempts. Outcomes wait
 * on the settlement queue; flushers (up to SETTLE_FLUSHERS at once) take them
 * off in groups, many attempts per transaction, and retry until they land
 * (an outage is retried without bound, anything else is bounded:
 * settle-groups.ts). A unit the database refuses is isolated so the rest of
 * its group lands. A settlement that finds its lease already expired is
 * reconciled (late-settlement.ts). Retries and put-backs go back on their
 * queues; provider signals about the account (rate limit, credits, key)
 * pause or stop dispatch, committed with the settlement. The attempt stays
 * open (its lease refreshed: attempt-leases.ts) until its settlement lands.
 *
 * The decisions are pure and live elsewhere: what an outcome does to its job
 * (retry.ts), which units a flusher takes and what a failure does next
 * (settle-groups.ts), what a late settlement changes (late-settlement.ts).
 */
import type { Logger } from 'pino';
import type postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import type { Sql } from '../db/client.ts';
import { publishJobEvents, type JobEvent, type OwnEvents } from '../events/bus.ts';
import { requeueJob } from '../jobs/store.ts';
import { reactionTo } from '../provider/classify.ts';
import type { CallOutcome } from '../provider/types.ts';
import { reinsertJobs } from '../queue/boss.ts';
import { billedCredits } from '../scheduler/ledger.ts';
import { reactionOrder, requeueOrder } from '../scheduler/lock-order.ts';
import { stopAccount } from '../scheduler/sql/account.ts';
import { anyQueueReady, markQueuesReady } from '../scheduler/sql/queues.ts';
import { lockOpenReservations, settleGroup, warmSettleGroup, type SettleGroupItem } from '../scheduler/sql/reservations.ts';
import { lockTenants } from '../scheduler/sql/tenants.ts';
import { pauseWindow, recordCappedAsk, stopWindow, type RateLimitPace } from '../scheduler/sql/windows.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import type { Attempt, AttemptLeases, BatchAttempt } from './attempt-leases.ts';
import { creditsStopUntil, planSettlement, resultOf, type SettlePlan } from './retry.ts';
import { classifySettleError, pickSettleUnits, planSettleFailure, sqlState, type SettleFailureStep } from './settle-groups.ts';
import { reconcileLateSettlements } from './late-settlement.ts';
import { tracing } from '../tracing/tracer.ts';
import { requeuedData, settledTrace } from '../tracing/job-trace.ts';
import { requeueReason } from '../tracing/attributes.ts';
import { settleRetryDelayMs } from './liveness.ts';

/** The error code of a job whose settlement the database refused: failed without its data, billed as the provider billed. */
export const RESULT_NOT_STORED = 'RESULT_NOT_STORED';

/**
 * Most attempts settled in one group (one statement, sluice_settle_group). Every group's commit
 * queues on Postgres's global NOTIFY lock (its events) and on its tenants' rows, so fewer, larger
 * groups cost less per job: bench dispatch, 10 x 2,000, Postgres CPU per job 1.07 -> 0.82 ms with
 * 1 worker and 1.25 -> 0.90 ms with 4 going from 32 to 128, and commits waiting on the NOTIFY lock
 * fell from 10-14% of busy backends to under 1%. One statement of 128 holds its rows for a few ms.
 */
const SETTLE_GROUP_MAX = 128;
/**
 * Settlement transactions of one process at once (each a group): a slow one does not hold the
 * others' slots. With hundreds of calls in flight (long latencies) fewer left settled calls
 * queueing behind each other and the pool full of finished calls (bad-day bench).
 */
const SETTLE_FLUSHERS = 12;

/** What an attempt's outcome does to its job, and its bill. */
interface Settlement {
  plan: SettlePlan;
  billed: number;
  errorCode?: string;
}

/** One attempt to settle: the attempt, its call's outcome and what that outcome does. */
interface SettleItem {
  attempt: Attempt;
  outcome: CallOutcome;
  settlement: Settlement;
}

/** One unit of settlement (one call: a single attempt or a batch's attempts), waiting to land. */
interface PendingSettle {
  window: WindowSpec;
  items: SettleItem[];
  /** The account-level reactions to the call's signals (one per kind). */
  reactions: CallOutcome[];
  done: () => void;
  /** The tenants of its items and how many there are (fixed at enqueue; pickSettleUnits reads them). */
  tenants: string[];
  size: number;
  /** Settled alone (split off a group the database refused). */
  solo?: boolean;
  /** Non-outage failures so far (bounded: planSettleFailure). */
  faults?: number;
  /** Already the final failure of a settlement the database refused. */
  final?: boolean;
}

/** An attempt's outcome, planned and billed, queued to be settled (for metrics). */
export interface SettledAttempt {
  outcome: CallOutcome;
  /** Credits billed for it. */
  billed: number;
  /** Credits its reservation held (what is not billed is refunded). */
  reserved: number;
}

export interface SettlerOptions {
  sql: Sql;
  boss: PgBoss;
  leases: AttemptLeases;
  retryLimit: number;
  retryDelaySeconds: number;
  /** Settlements are grouped: one transaction per this interval (0 = as soon as one is ready). Default 2. */
  settleIntervalMs?: number | undefined;
  /** What a rate-limit 429 does to the learned pace (PACE_DECREASE, PACE_MIN); absent = the rate is left as it is. */
  rateLimitPace?: RateLimitPace | undefined;
  /** How long a credits-exhausted account stops when the provider gave no renewal time. */
  creditsStopSeconds: number;
  /** The dispatcher is stopping: a failed settlement is retried sooner. */
  stopping: () => boolean;
  /**
   * The size of the pool `sql` the settlement is warmed on when the dispatcher starts
   * (warmSettleGroup): all its connections but WARM_SPARE_CONNECTIONS run it once; 0 (the default)
   * behind a transaction-mode pooler, where a statement may land on any server connection.
   */
  warmConnections?: number | undefined;
  /**
   * This process's event bus, when it serves subscribers: a settlement's final events are delivered
   * to them as soon as its commit is acknowledged, not when their NOTIFY comes back (EventBus).
   */
  ownEvents?: OwnEvents | undefined;
  /** Called once per attempt when its outcome is planned and billed, as it is queued to settle. */
  onSettled?: ((s: SettledAttempt) => void) | undefined;
  log: Logger;
}

const tenantOf = (a: Attempt): string => a.job.data.tenantId;

/** Connections of the pool the settlement's warm-up leaves free for the dispatch loop (Settler.warm). */
const WARM_SPARE_CONNECTIONS = 2;

/** How long start-up waits for the settlement's warm-up (Settler.warm) before it goes on without it. */
const WARM_TIMEOUT_MS = 5_000;

export class Settler {
  private readonly options: SettlerOptions;
  /** Settlements waiting to land, in order; a flusher applies them in groups and retries until they land. */
  private readonly queue: PendingSettle[] = [];
  /** Tenants whose settlement a flusher of this process has under way (pickSettleUnits). */
  private readonly settlingTenants = new Set<string>();
  /** Flushers running now (at most SETTLE_FLUSHERS). */
  private flushers = 0;

  constructor(options: SettlerOptions) {
    this.options = options;
  }

  private get abandoned(): boolean {
    return this.options.leases.abandoned;
  }

  /**
   * Runs the settlement with nothing to settle once on each of the pool's connections, before
   * the dispatcher starts leasing (a step of start-up, so of readiness: `/readyz`), unless a queue is
   * ready to lease already: the first settlements of a process that starts idle (an API-facing worker
   * waiting for jobs) then do not plan it inside their own transactions, and the connections it
   * opens and plans on (a burst of Postgres CPU) are not opened while the first requests arrive.
   * A process that starts with a backlog skips it: opening and warming every connection then made
   * each one pay for its own first leases too (bench dispatch 10x2000 about a fifth slower), while
   * its connections warm by use within its first seconds anyway. Waited for at most `timeoutMs`
   * (start-up goes on; the warm-up finishes in the background); a failure is only logged (a
   * settlement on a cold connection still lands).
   */
  async warm(timeoutMs = WARM_TIMEOUT_MS): Promise<void> {
    // The warm-up holds each connection it warms for the whole warm-up, and the API's requests run
    // on the same pool once it listens: two stay free for them.
    const n = (this.options.warmConnections ?? 0) - WARM_SPARE_CONNECTIONS;
    if (n <= 0) return;
    let timer: NodeJS.Timeout | undefined;
    const warmed = (async () => {
      if (await anyQueueReady(this.options.sql)) return;
      await warmSettleGroup(this.options.sql, n);
    })().catch((err: unknown) => this.options.log.debug({ err }, 'warming the settlement connections failed'));
    await Promise.race([warmed, new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs).unref()))]);
    clearTimeout(timer);
  }

  /** Stopped past its grace: the settlements still waiting are let go (left to their leases). */
  dropQueued(): void {
    for (const unit of this.queue.splice(0)) unit.done();
  }

  /** Settles one attempt: queued for the next settlement group; resolves when it has landed. */
  settle(window: WindowSpec, attempt: Attempt, outcome: CallOutcome, opts: { putBack?: boolean } = {}): Promise<void> {
    const landed = this.enqueue(window, [{ attempt, outcome, settlement: this.prepare(attempt, outcome, opts) }], [outcome]);
    return attempt.trace ? traceSettled([attempt], landed) : landed;
  }

  /**
   * Settles every attempt of a batch, each from its item's outcome, as one
   * unit. Duplicates share the sent item's outcome and result; only the sent
   * one is billed. The account reactions apply once per kind.
   */
  settleBatch(window: WindowSpec, batch: BatchAttempt, outcomes: CallOutcome[], opts: { putBack?: boolean } = {}): Promise<void> {
    const items: SettleItem[] = [];
    batch.items.forEach((it, i) => {
      it.attempts.forEach((attempt, k) => {
        const outcome = k === 0 ? outcomes[i]! : { ...outcomes[i]!, creditsBilled: 0 };
        items.push({ attempt, outcome, settlement: this.prepare(attempt, outcome, opts) });
      });
    });
    const reactions = new Map<string, CallOutcome>();
    for (const o of outcomes) {
      const prev = reactions.get(o.kind);
      if (!prev || (o.retryAfterSeconds ?? 0) > (prev.retryAfterSeconds ?? 0)) reactions.set(o.kind, o);
    }
    const landed = this.enqueue(window, items, [...reactions.values()]);
    return tracing.on && items.some((x) => x.attempt.trace) ? traceSettled(items.map((x) => x.attempt), landed) : landed;
  }

  private enqueue(window: WindowSpec, items: SettleItem[], reactions: CallOutcome[]): Promise<void> {
    for (const x of items) x.attempt.settling = true;
    if (this.abandoned) return Promise.resolve();
    return new Promise<void>((done) => {
      this.queue.push({ window, items, reactions, done, tenants: [...new Set(items.map((x) => tenantOf(x.attempt)))], size: items.length });
      void this.flush();
    });
  }

  /**
   * A settlement flusher (up to SETTLE_FLUSHERS at once): waits
   * SETTLE_INTERVAL_MS for more outcomes, takes up to SETTLE_GROUP_MAX
   * attempts off the queue and applies them in ONE transaction, and repeats
   * while any wait. A group that fails for an outage (connection reset,
   * Postgres restart) goes back on the queue and is retried with backoff until
   * it lands, never dropped; after a failure this flusher takes one unit at a
   * time. Any other failure is bounded (settle-groups.ts planSettleFailure): a
   * group the database refuses (SQLSTATE class 22/23: a value it cannot store)
   * is split so the rest lands, and the unit at fault is settled again as a
   * final failure (RESULT_NOT_STORED, billed as the provider billed); other
   * errors are retried SETTLE_MAX_FAULTS times first. Retrying is safe: every
   * change is fenced by the reservation (an earlier try that committed without
   * our hearing it makes the next try change nothing). The attempts stay open
   * (their leases refreshed) until their settlement lands.
   */
  private async flush(): Promise<void> {
    if (this.flushers >= SETTLE_FLUSHERS) return;
    this.flushers++;
    let failures = 0;
    try {
      while (this.queue.length > 0 && !this.abandoned) {
        const interval = this.options.settleIntervalMs ?? 2;
        if (failures === 0 && interval > 0) await new Promise((r) => setTimeout(r, interval));
        const take = pickSettleUnits(this.queue, this.settlingTenants, SETTLE_GROUP_MAX, failures > 0);
        // Nothing this flusher may take: the flushers holding those tenants look again when done.
        if (take.length === 0) break;
        const units = take.map((i) => this.queue[i]!);
        for (let k = take.length - 1; k >= 0; k--) this.queue.splice(take[k]!, 1);
        const held = units.flatMap((u) => u.tenants);
        for (const t of held) this.settlingTenants.add(t);
        const jobIds = this.options.ownEvents ? units.flatMap((u) => u.items.map((x) => x.attempt.job.id)) : [];
        this.options.ownEvents?.settling(jobIds);
        try {
          try {
            await this.apply(units, jobIds);
          } catch (err) {
            this.options.ownEvents?.settled(jobIds, null);
            throw err;
          } finally {
            // The transaction is over: its tenants' rows are free for the other flushers.
            for (const t of held) this.settlingTenants.delete(t);
          }
          for (const u of units) {
            for (const x of u.items) this.options.leases.release(x.attempt.reservationId);
            u.done();
          }
          failures = 0;
        } catch (err) {
          failures++;
          const error = classifySettleError(err);
          const first = units[0]!;
          if (error !== 'outage' && units.length === 1) first.faults = (first.faults ?? 0) + 1;
          const step = planSettleFailure({ error, units: units.length, attempts: first.items.length, faults: first.faults ?? 0, final: first.final ?? false });
          this.options.log.warn({ err, sqlState: sqlState(err), error, step, attempts: units.reduce((k, u) => k + u.items.length, 0), failures }, 'settlement failed');
          if (this.abandoned) {
            // Stopped past its grace: these are left to their leases (the sweeper settles them).
            for (const u of units) u.done();
            break;
          }
          this.afterFailure(units, step, err);
          // A data error is not passing: the split units go at once. Anything else backs off (shorter while stopping).
          if (error !== 'data') await new Promise((r) => setTimeout(r, settleRetryDelayMs(failures, this.options.stopping())));
        }
      }
    } finally {
      this.flushers--;
    }
  }

  /**
   * Puts units that failed to settle back on the queue as `step` says
   * (planSettleFailure): as they were (at the end, behind the others), or
   * split into solo units, or as their final failure (both at the front: the
   * rest of their group waits on them), or lets them go to their leases.
   */
  private afterFailure(units: PendingSettle[], step: SettleFailureStep, err: unknown): void {
    const { log } = this.options;
    switch (step) {
      case 'retry':
        this.queue.push(...units);
        return;
      case 'split':
        this.queue.unshift(...units.map((u) => ({ ...u, solo: true })));
        return;
      case 'split_attempts': {
        const unit = units[0]!;
        let left = unit.items.length;
        const done = () => {
          if (--left === 0) unit.done();
        };
        // The account reactions ride on the first attempt only: they apply once.
        this.queue.unshift(
          ...unit.items.map((x, i) => ({ window: unit.window, items: [x], reactions: i === 0 ? unit.reactions : [], done, tenants: [tenantOf(x.attempt)], size: 1, solo: true, final: unit.final ?? false })),
        );
        return;
      }
      case 'fail_final': {
        const unit = units[0]!;
        const state = sqlState(err);
        const message = `Sluice could not store this attempt's result (the database refused it${state ? `, SQLSTATE ${state}` : ''}); the job is failed, billed as the provider billed it`;
        for (const { attempt } of unit.items) {
          log.error({ err, jobId: attempt.job.id, tenantId: tenantOf(attempt), reservationId: attempt.reservationId, sqlState: state }, 'settlement refused by the database: the attempt is settled as failed, RESULT_NOT_STORED');
        }
        const fail = { action: 'fail' as const, delaySeconds: 0, countsAsAttempt: true };
        this.queue.unshift({
          ...unit,
          items: unit.items.map((x) => ({
            attempt: x.attempt,
            outcome: { ...x.outcome, data: null, message },
            settlement: { plan: fail, billed: x.settlement.billed, errorCode: RESULT_NOT_STORED },
          })),
          solo: true,
          final: true,
          faults: 0,
        });
        return;
      }
      case 'leave_to_lease': {
        const unit = units[0]!;
        // Its lease is no longer refreshed: it expires and the sweeper settles the reservation (timeout rule).
        for (const { attempt } of unit.items) {
          this.options.leases.release(attempt.reservationId);
          log.error({ err, jobId: attempt.job.id, tenantId: tenantOf(attempt), reservationId: attempt.reservationId, sqlState: sqlState(err) }, 'settlement refused even as a failure: left to its attempt lease');
        }
        unit.done();
        return;
      }
    }
  }

  /**
   * One settlement group: the reservations still open (the fence: a
   * superseded attempt changes nothing), each job's state, result and pg-boss
   * ack (I6: the ack commits with the stored result), the events, the
   * reservations' bills and slots (their tenants' rows, the ledger, the
   * window's slot deltas), then the account reactions (a rate-limit 429
   * pauses the window on every node, I2). docs/ARCHITECTURE.md "Lock order"
   * says why the tenants' rows may come after the jobs' here.
   *
   * Nearly every group holds final states only (complete or fail): it is ONE
   * statement, sluice_settle_group, outside any transaction, so no tenant row
   * stays locked between round trips (with 4 workers, 41% of busy backends
   * were settlements idle in transaction). A group with a retry or put-back
   * (re-inserted in pg-boss) or an account signal runs in a transaction: it
   * takes the same locks first, requeues, then the same settleGroup call.
   */
  private async apply(units: readonly PendingSettle[], jobIds: readonly string[]): Promise<void> {
    const { sql, log } = this.options;
    const items = units.flatMap((u) => u.items);
    // react() acts on exactly the put-back signals (rate limit, credits, key).
    const oneCall = items.every((x) => x.settlement.plan.action !== 'requeue') && units.every((u) => u.reactions.every((o) => reactionTo(o) !== 'put_back'));
    // Committed once the call resolves (a lone statement commits before its answer; sql.begin
    // resolves after its COMMIT): the final events go to this process's subscribers now.
    const { settled, events } = oneCall ? await settleGroup(sql, items.map(groupItem)) : await this.settleInTransaction(units, items);
    this.options.ownEvents?.settled(jobIds, events);
    // Found settled already: by this settlement's own earlier try (nothing to do), or by the
    // sweeper when the lease expired first: reconciled, never dropped (dispatch/late-settlement.ts).
    // A failure here retries the whole unit, which then finds every reservation settled: fenced.
    const late = items.filter((x) => !settled.has(x.attempt.reservationId));
    if (late.length > 0) {
      await reconcileLateSettlements(
        sql,
        late.map(({ attempt, outcome, settlement }) => ({
          reservationId: attempt.reservationId,
          jobId: attempt.job.id,
          tenantId: tenantOf(attempt),
          queue: attempt.queue,
          attempt: attempt.attempt,
          outcome,
          billed: settlement.billed,
        })),
        log,
      );
    }
  }

  /** A settlement group with a retry, a put-back or an account signal: the same locks first, requeues, then settleGroup. */
  private async settleInTransaction(units: readonly PendingSettle[], items: readonly SettleItem[]): Promise<{ settled: Set<string>; events: string[] }> {
    return this.options.sql.begin(async (tx) => {
      const live = await lockOpenReservations(
        tx,
        items.map((x) => x.attempt.reservationId),
      );
      const settling = items.filter((x) => live.has(x.attempt.reservationId));
      await lockTenants(
        tx,
        settling.map((x) => tenantOf(x.attempt)),
      );
      const events: JobEvent[] = [];
      // In queue key order (tenant id, class): each requeue moves its queue's depth (the trigger
      // locks the row), and a submission group locks its queues in that order too.
      const requeues = settling.filter((x) => x.settlement.plan.action === 'requeue');
      for (const i of requeueOrder(requeues.map((x) => ({ tenantId: tenantOf(x.attempt), jobClass: x.attempt.jobClass, id: x.attempt.job.id })))) {
        const x = requeues[i]!;
        events.push(...(await this.requeue(tx, x.attempt, x.outcome, x.settlement)));
      }
      const { events: sent } = await settleGroup(tx, settling.map(groupItem));
      // A provider signal is about the account, whoever's attempt carried it: react even when
      // superseded. Windows (by name) before account_state: the lock order.
      const reactions = units.flatMap((u) => u.reactions.map((outcome) => ({ window: u.window, outcome })));
      for (const i of reactionOrder(reactions.map((r) => ({ window: r.window.name, account: r.outcome.kind === 'credits_exhausted' })))) {
        await this.react(tx, reactions[i]!.window, reactions[i]!.outcome);
      }
      await publishJobEvents(tx, events);
      return { settled: live, events: sent };
    });
  }

  /** The plan and the bill of one attempt's outcome (told to onSettled). */
  private prepare(attempt: Attempt, outcome: CallOutcome, opts: { putBack?: boolean }): Settlement {
    const { retryLimit, retryDelaySeconds, onSettled } = this.options;
    const planned = planSettlement(opts.putBack ? 'put_back' : reactionTo(outcome), outcome, attempt.attempt, retryLimit, retryDelaySeconds);
    // Out of credits or an unusable key: the account or window stop holds the job back, so it is
    // ready again the moment an admin resumes (no stale retry-after on top).
    const heldByStop = outcome.kind === 'credits_exhausted' || outcome.kind === 'key_unusable';
    const plan = heldByStop && planned.action === 'requeue' ? { ...planned, delaySeconds: 0 } : planned;
    const billed = billedCredits(outcome.creditsBilled, attempt.credits);
    onSettled?.({ outcome, billed, reserved: attempt.credits });
    if (attempt.trace) Object.assign(attempt.trace, { billed, outcome: outcome.kind, state: plan.action === 'succeed' ? 'SUCCEEDED' : plan.action === 'fail' ? 'FAILED' : 'QUEUED' });
    return { plan, billed };
  }

  /** A retry or put-back: the job back to QUEUED after its delay, its result, re-inserted in pg-boss, fenced by the attempt. */
  private async requeue(tx: postgres.TransactionSql, attempt: Attempt, outcome: CallOutcome, settlement: Settlement): Promise<JobEvent[]> {
    const { job } = attempt;
    const { tenantId } = job.data;
    const { plan } = settlement;
    if (plan.action !== 'requeue') return [];
    if (!(await requeueJob(tx, job.id, attempt.attempt, plan.countsAsAttempt, plan.delaySeconds, resultOf(outcome)))) return [];
    // Delete and re-insert under the same id: the job waits out its delay
    // without spending pg-boss's own retry budget, kept for crash redelivery.
    const startAfter = new Date(Date.now() + plan.delaySeconds * 1000);
    // A traced job's wait starts again, marked with why (a retry's delay, a put-back) and until when.
    const data = job.data.tp ? requeuedData(job.data, requeueReason(plan.countsAsAttempt), Date.now(), startAfter.getTime()) : job.data;
    await reinsertJobs(this.options.boss, tx, attempt.queue, [{ id: job.id, data, startAfter }]);
    await markQueuesReady(tx, tenantId, [attempt.jobClass], startAfter);
    return [{ jobId: job.id, tenantId, state: 'QUEUED' }];
  }

  /**
   * The account-level reactions to a provider signal, committed with the
   * settlement so every node sees them before this attempt is acknowledged:
   * a rate-limit 429 pauses the window (I2) and lowers its learned rate; credits exhausted stops all
   * dispatch until the renewal; an unusable key stops its window only.
   */
  private async react(tx: postgres.TransactionSql, window: WindowSpec, outcome: CallOutcome): Promise<void> {
    const { log } = this.options;
    switch (outcome.kind) {
      case 'rate_limited':
        // An ask beyond the cap was capped: the window reopens with one probe call, not a burst.
        await pauseWindow(tx, window.name, Math.max(1, outcome.retryAfterSeconds ?? 1), 'RATE_LIMITED', this.options.rateLimitPace, outcome.askedRetryAfterSeconds !== undefined);
        if (outcome.askedRetryAfterSeconds !== undefined) {
          await recordCappedAsk(tx, window.name, outcome.askedRetryAfterSeconds);
          log.warn({ window: window.name, askedSeconds: outcome.askedRetryAfterSeconds, pausedSeconds: outcome.retryAfterSeconds }, 'the provider asked for a pause beyond RETRY_AFTER_MAX_SECONDS: capped');
        }
        return;
      case 'credits_exhausted': {
        const until = creditsStopUntil(outcome.status?.renewalAt ?? null, Date.now(), this.options.creditsStopSeconds);
        await stopAccount(tx, until, 'CREDITS_EXHAUSTED');
        log.error({ until, window: window.name, message: outcome.message }, 'provider credits exhausted: all dispatch stopped');
        return;
      }
      case 'key_unusable':
        await stopWindow(tx, window.name, 'KEY_UNUSABLE');
        log.error({ window: window.name, status: outcome.httpStatus, message: outcome.message }, 'upstream key unusable: its window is stopped');
        return;
      default:
        return;
    }
  }
}

/**
 * Once a traced attempt's settlement has landed (or been let go): its settle span, from now (its
 * outcome queued) to then, and the end of its lease span. Each attempt once.
 */
function traceSettled(attempts: readonly Attempt[], landed: Promise<void>): Promise<void> {
  const queuedMs = Date.now();
  const end = (error?: string) => {
    for (const a of attempts) {
      if (!a.trace) continue;
      settledTrace(a.trace, queuedMs, error);
      a.trace = null;
    }
  };
  return landed.then(
    () => end(),
    (err: unknown) => {
      end('settlement_failed');
      throw err;
    },
  );
}

/** One attempt as sluice_settle_group takes it: its reservation's bill, and its job's final state unless it is requeued. */
function groupItem({ attempt, outcome, settlement }: SettleItem): SettleGroupItem {
  return {
    id: attempt.reservationId,
    tenantId: tenantOf(attempt),
    billed: settlement.billed,
    outcome: outcome.kind,
    ...(settlement.plan.action === 'requeue'
      ? {}
      : {
          finish: {
            id: attempt.job.id,
            attempt: attempt.attempt,
            state: settlement.plan.action === 'succeed' ? ('SUCCEEDED' as const) : ('FAILED' as const),
            queue: attempt.queue,
            result: resultOf(outcome, settlement.errorCode),
          },
        }),
  };
}
