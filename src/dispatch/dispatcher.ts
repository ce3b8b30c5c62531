/**
 * The dispatcher: one per worker process, not one pg-boss `work()` per queue.
 *
 * For each window this process runs a few loops (DISPATCH_LOOPS), each one
 * lease after another:
 *   1. the class order (starvation guard) and the APIs held by open breakers,
 *      decided here (pure, scheduler/fair.ts),
 *   2. ONE call of sluice_lease (drizzle/functions/sluice_lease.sql; its pure model is
 *      scheduler/lease.ts planPicks): in one transaction, across as many
 *      tenants as the weighted fair order allows, it takes their cap slots,
 *      activates their pg-boss jobs, claims them, reserves their credits
 *      against the quota, advances the queues' virtual times, and takes the
 *      window's tokens and pool slots once for all of them,
 *   3. call the provider (a batch call may carry many tenants' batch turns), and settle the
 *      attempts: grouped, many per transaction every SETTLE_INTERVAL_MS,
 *      retried until they land.
 * Every limit is checked by a conditional statement in Postgres, so any number
 * of processes can run this loop against one database.
 *
 * Liveness has ONE authority: the attempt lease. Every reservation carries a
 * lease (reservations.lease_expires_at) that this process refreshes on its own
 * timer while the attempt is open (called or settling). The sweeper settles
 * only expired leases; pg-boss's job heartbeat is off. A call whose lease this
 * process could not refresh in time is aborted before the lease can expire,
 * so a second call is never made while the first can still be in flight, and
 * a superseded attempt's late settlement changes nothing (fenced by its
 * reservation id).
 */
import type { Logger } from 'pino';
import type postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import { publishJobEvents, type JobEvent } from '../events/bus.ts';
import { WORK_CHANNEL } from '../jobs/service.ts';
import { requeueJob, upsertResult, type ResultRecord } from '../jobs/store.ts';
import { reactionTo } from '../provider/classify.ts';
import type { BatchOutcome, CallOutcome, ProviderClient } from '../provider/types.ts';
import { reinsertJobs } from '../queue/boss.ts';
import { type JobClass } from '../config/classes.ts';
import { classOrder } from '../scheduler/fair.ts';
import { leaseBatchSpecs, leaseCosts } from '../scheduler/lease.ts';
import { billedCredits } from '../scheduler/ledger.ts';
import { msUntilTokens, takeable } from '../scheduler/pacer.ts';
import { reactionOrder, requeueOrder } from '../scheduler/lock-order.ts';
import { LatencyTracker, poolSize } from '../scheduler/pool.ts';
import * as sched from '../scheduler/store.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import { planSettlement, resultOf } from './retry.ts';
import { BreakerOpen, type Breakers } from './breakers.ts';
import { dedupKey } from './batching.ts';
import { classifySettleError, pickSettleUnits, planSettleFailure, sqlState, type SettleFailureStep } from './settle-groups.ts';
import { reconcileLateSettlements } from './late-settlement.ts';
import { leaseDeadline, leaseLost, refreshedDeadline, settleRetryDelayMs, unexpectedOutcome } from './liveness.ts';
import type { Metrics } from '../metrics.ts';

export interface DispatcherOptions {
  sql: Sql;
  /**
   * The attempt leases' refresh runs here: a connection of its own, so it never queues behind the
   * hot path's statements on `sql` (a refresh that waits there could let a live lease expire).
   * Default `sql`.
   */
  leaseSql?: Sql;
  boss: PgBoss;
  client: ProviderClient;
  catalog: ApiCatalog;
  windows: readonly WindowSpec[];
  nodeId: string;
  poolMax: number;
  initialLatencyMs: number;
  leaseMax: number;
  /** Items per unit of weight one batch turn may take. */
  batchQuantum: number;
  /** Decision loops per window in this process: leases of different tenants run side by side. */
  loopsPerWindow: number;
  /** Most jobs one decision takes when the queue's head API batches (1 = never batch). Default 1. */
  batchMax?: number;
  idlePollMs: number;
  maxWaitMs: Partial<Record<JobClass, number>>;
  retryLimit: number;
  retryDelaySeconds: number;
  /** The attempt lease: how long an open attempt stays live without a refresh (the sweeper settles it after). */
  leaseSeconds: number;
  /** Settlements are grouped: one transaction per this interval (0 = as soon as one is ready). Default 2. */
  settleIntervalMs?: number;
  timeoutBilling: 'billed' | 'refunded';
  breakers: Breakers;
  /** How long a credits-exhausted account stops when the provider gave no renewal time. */
  creditsStopSeconds: number;
  metrics?: Metrics | undefined;
  log: Logger;
}

export interface JobData {
  tenantId: string;
  api: string;
  params: Record<string, unknown>;
}

/** One dispatched attempt: the fetched pg-boss job, its attempt number and its reservation. */
interface Attempt {
  queue: string;
  jobClass: JobClass;
  job: { id: string; data: JobData };
  attempt: number;
  reservationId: string;
  credits: number;
  /**
   * Monotonic clock (performance.now, ms): the lease is surely live until then (from when the lease
   * returned, then from each refresh's send time; dispatch/liveness.ts).
   */
  deadline: number;
  /** Aborts the call: the lease could not be refreshed in time, or it was superseded. */
  abort: AbortController;
  /** The provider client said the request may have left (CallRequest.onSent): a throw after this may have been billed. */
  sent: boolean;
  /** Its outcome is queued for settlement (or landed): an unexpected throw after this needs no settling. */
  settling: boolean;
}

/** One unit of settlement (one call: a single attempt or a batch's attempts), waiting to land. */
interface PendingSettle {
  w: WindowSpec;
  items: Array<{ a: Attempt; outcome: CallOutcome; s: { plan: ReturnType<typeof planSettlement>; billed: number; errorCode?: string } }>;
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

/** One batch call: its distinct items, each with the attempts that share its input (the first is the one sent). */
interface BatchAttempt {
  api: string;
  items: Array<{ attempts: Attempt[] }>;
}

interface Leased {
  singles: Attempt[];
  batches: BatchAttempt[];
}

/** Every attempt of a lease: its singles and each batch item's attempts (duplicates included). */
function attemptsOf(l: Leased): Attempt[] {
  return [...l.singles, ...l.batches.flatMap((b) => b.items.flatMap((it) => it.attempts))];
}

/**
 * Most jobs one lease call takes (singles are bounded by the pool's room anyway; batches carry
 * more): bounds how long one call holds its tenants' rows.
 */
const LEASE_CALL_MAX = 256;

/** How long a loop waits when another node's lease of its window is under way (a poke wakes it sooner). */
const LEASE_BUSY_RETRY_MS = 10;

export class Dispatcher {
  private readonly o: DispatcherOptions;
  private running = false;
  private readonly loops: Promise<void>[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private readonly wakers = new Set<() => void>();
  private unlisten: (() => Promise<void>) | null = null;
  readonly latency = new Map<string, LatencyTracker>();
  /** Oldest ready job's wait per class, refreshed by the sweeper for the starvation guard. */
  oldestWaitMs: Partial<Record<JobClass, number>> = {};
  /** This process's open attempts by reservation id: their leases are refreshed until they settle. */
  private readonly open = new Map<string, Attempt>();
  /** Windows one of this process's loops is leasing right now. */
  private readonly leasing = new Set<string>();
  private leaseTimer: NodeJS.Timeout | null = null;
  private refreshing = false;
  /** Settlements waiting to land, in order; a flusher applies them in groups and retries until they land. */
  private readonly settleQueue: PendingSettle[] = [];
  /** Tenants whose settlement a flusher of this process has under way (pickSettleUnits). */
  private readonly settlingTenants = new Set<string>();
  /** Flushers running now (at most SETTLE_FLUSHERS). */
  private flushers = 0;
  /** Stopped past its grace: open attempts are left to their leases, nothing more is written. */
  private abandoned = false;

  constructor(options: DispatcherOptions) {
    this.o = options;
    for (const w of options.windows) this.latency.set(w.name, new LatencyTracker(500, options.initialLatencyMs));
  }

  poolFor(w: WindowSpec): number {
    return poolSize(w.pacedPerMinute, this.latency.get(w.name)!.percentile(95), { concurrentLimit: w.concurrentLimit, max: this.o.poolMax });
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    const { unlisten } = await this.o.sql.listen(WORK_CHANNEL, () => this.poke());
    this.unlisten = unlisten;
    this.leaseTimer = setInterval(() => this.leaseTick(), this.leaseMs() / 5);
    for (const w of this.o.windows) for (let i = 0; i < this.o.loopsPerWindow; i++) this.loops.push(this.windowLoop(w));
  }

  /**
   * Stops leasing at once, waits up to `graceMs` (default 30 s) for the calls
   * in flight to finish and their settlements to land (retried through a
   * database outage), and resolves. Past the grace, what is still open is
   * abandoned: its calls are aborted and nothing more is written, and its
   * reservations are settled by the sweeper by the timeout rule when their
   * attempt leases expire (never called twice, never reserved forever).
   */
  async stop(opts: { graceMs?: number } = {}): Promise<{ unsettled: number }> {
    if (!this.running) return { unsettled: 0 };
    this.running = false;
    this.poke();
    const graceMs = opts.graceMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), graceMs)));
    const drained = (async () => {
      await Promise.allSettled(this.loops);
      await Promise.allSettled([...this.inFlight]);
      return true as const;
    })();
    const clean = await Promise.race([drained, graceOver]);
    clearTimeout(timer);
    const unsettled = clean ? 0 : this.open.size;
    if (!clean) {
      this.abandoned = true;
      // Past the grace: what is still open is left to its lease. Say which jobs, and whether their
      // outcome was known (it will be settled by the timeout rule, and the job called again).
      const open = [...this.open.values()];
      this.o.log.warn(
        { open: open.length, knownOutcomes: open.filter((a) => a.settling).map((a) => a.job.id), callsAborted: open.filter((a) => !a.settling).map((a) => a.job.id) },
        'stop grace over: open attempts are abandoned to their leases (known outcomes not stored)',
      );
      for (const a of open) a.abort.abort();
      for (const u of this.settleQueue.splice(0)) u.done();
    }
    if (this.leaseTimer) clearInterval(this.leaseTimer);
    this.leaseTimer = null;
    await this.unlisten?.().catch(() => {});
    return { unsettled };
  }

  private leaseMs(): number {
    return this.o.leaseSeconds * 1000;
  }

  /**
   * The attempt lease's own timer. Aborts a call whose lease this process
   * could not refresh for three quarters of its length (well before the
   * database lets the sweeper take it), then refreshes the leases of all open
   * attempts in one statement. An attempt the refresh does not find open was
   * settled by the sweeper: its call stops and its settlement will change
   * nothing.
   */
  private leaseTick(): void {
    const now = performance.now();
    for (const a of this.open.values()) if (leaseLost(now, a.deadline, this.leaseMs()) && !a.abort.signal.aborted) a.abort.abort();
    if (this.refreshing || this.open.size === 0 || this.abandoned) return;
    this.refreshing = true;
    const ids = [...this.open.keys()];
    const sentAt = performance.now();
    sched
      .refreshLeases(this.o.leaseSql ?? this.o.sql, ids, this.o.leaseSeconds)
      .then(({ live, settled }) => {
        for (const id of ids) {
          const a = this.open.get(id);
          if (!a) continue;
          if (live.has(id)) a.deadline = refreshedDeadline(a.deadline, sentAt, this.leaseMs());
          else if (settled.has(id)) a.abort.abort();
        }
      })
      .catch((err) => this.o.log.warn({ err }, 'attempt lease refresh failed'))
      .finally(() => {
        this.refreshing = false;
      });
  }

  /** Wakes every sleeping window loop (new work, a freed slot, stop). */
  poke(): void {
    for (const wake of this.wakers) wake();
  }

  private async sleep(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    let wake!: () => void;
    await new Promise<void>((resolve) => {
      wake = resolve;
      this.wakers.add(wake);
      timer = setTimeout(resolve, Math.max(1, ms));
    });
    clearTimeout(timer);
    this.wakers.delete(wake);
  }

  private async windowLoop(w: WindowSpec): Promise<void> {
    while (this.running) {
      try {
        const wait = await this.dispatchOnce(w);
        if (wait > 0) await this.sleep(wait);
      } catch (err) {
        this.o.log.error({ err, window: w.name }, 'dispatch failed');
        await this.sleep(this.o.idlePollMs);
      }
    }
  }

  /**
   * Leases on this window in ONE round trip (drizzle/functions/sluice_lease.sql):
   * as many jobs, across as many tenants, as the fair order, the caps, the
   * quotas and the window's tokens and room allow. Returns how long to wait
   * before the next lease (0 = at once). Only an empty lease reads the window
   * to know how long to wait.
   */
  private async dispatchOnce(w: WindowSpec): Promise<number> {
    // One lease per window at a time (sluice_lease would answer a second 'busy'): this process's
    // other loops wait here, without a round trip, until a settlement or the lease's end pokes them.
    if (this.leasing.has(w.name)) return this.o.idlePollMs;
    this.leasing.add(w.name);
    try {
      return await this.leaseOnce(w);
    } finally {
      this.leasing.delete(w.name);
    }
  }

  private async leaseOnce(w: WindowSpec): Promise<number> {
    const pool = this.poolFor(w);
    const order = classOrder(w.classes, this.oldestWaitMs, this.o.maxWaitMs);
    // Jobs for an API whose breaker is open wait for its probe: the lease does not take them.
    const hold: string[] = [];
    const probes: string[] = [];
    for (const { api, state } of this.o.breakers.states()) {
      if (state === 'CLOSED') continue;
      const v = this.o.breakers.admit(api);
      if (v === 'hold') hold.push(api);
      else if (v === 'probe') probes.push(api);
    }
    let leased: Leased | 'busy' | 'changed';
    try {
      leased = await this.lease(w, pool, order, hold);
    } catch (err) {
      for (const api of probes) this.o.breakers.release(api);
      throw err;
    }
    if (leased === 'busy' || leased === 'changed') {
      for (const api of probes) this.o.breakers.release(api);
      // Another loop (here or on another node) is leasing this window: it fills the room; wake on
      // its settlements' poke, or look again shortly. Changed: the window moved under the call
      // (a pause, a stop), which wrote nothing: decide again at once.
      return leased === 'busy' ? LEASE_BUSY_RETRY_MS : 0;
    }
    if (leased.singles.length + leased.batches.length > 0) {
      // Marked sent and sent off the window's lease path: the next lease does not wait for the mark.
      this.track(w, attemptsOf(leased), () => this.send(w, leased, probes));
      return 0;
    }
    for (const api of probes) this.o.breakers.release(api);
    const [state] = await sched.readWindows(this.o.sql, [w.name]);
    if (!state) throw new Error(`window ${w.name} is not in the database`);
    // Credits exhausted: nothing leaves on any window until the renewal or an admin resumes.
    if (state.accountStoppedUntil !== null && state.accountStoppedUntil > state.dbNow) return this.o.idlePollMs;
    if (pool - state.inFlight <= 0) return Math.min(this.o.idlePollMs, 50); // a settle here pokes; another node's does not
    if (takeable(state, state.dbNow) < 1) return Math.min(this.o.idlePollMs, Math.max(1, msUntilTokens(state, state.dbNow, 1)));
    return this.o.idlePollMs;
  }

  /**
   * The lease: one call of sluice_lease (cap, fetch, claim, quota, tokens,
   * virtual time, all or nothing, for many tenants), then its rows grouped
   * into calls: the batched jobs of one `call` (many tenants' batch turns may
   * share it) are one batch call (each tenant's items deduplicated), the
   * rest single calls.
   */
  private async lease(w: WindowSpec, pool: number, order: readonly JobClass[], hold: readonly string[]): Promise<Leased | 'busy' | 'changed'> {
    const { catalog } = this.o;
    const batchMax = this.o.batchMax ?? 1;
    const { status, rows } = await sched.leaseJobs(this.o.sql, {
      window: w.name,
      nodeId: this.o.nodeId,
      pool,
      max: LEASE_CALL_MAX,
      leaseMax: this.o.leaseMax,
      classes: order,
      leaseSeconds: this.o.leaseSeconds,
      costs: leaseCosts(catalog),
      hold,
      batch: batchMax > 1 ? leaseBatchSpecs(catalog) : {},
      batchMax,
      batchQuantum: this.o.batchQuantum,
    });
    // The reservations' leases start inside the call, after any lock it waited on: count from its return.
    const deadline = leaseDeadline(performance.now(), this.leaseMs());
    if (status !== 'leased') return status;
    const out: Leased = { singles: [], batches: [] };
    // Per batch call (many tenants' turns may share one): the call and its items by tenant and input,
    // so a duplicate finds its item at once. Inputs fold within a tenant only: each tenant is billed
    // for its own items (the lease took a token for each), never for another's.
    const calls = new Map<number, { call: BatchAttempt; byKey: Map<string, BatchAttempt['items'][number]> }>();
    const perClass = new Map<JobClass, number>();
    for (const r of rows) {
      const a: Attempt = {
        queue: r.queue,
        jobClass: r.jobClass,
        job: { id: r.jobId, data: r.data },
        attempt: r.attempt,
        reservationId: r.reservationId,
        credits: r.credits,
        deadline,
        abort: new AbortController(),
        sent: false,
        settling: false,
      };
      this.open.set(a.reservationId, a);
      perClass.set(r.jobClass, (perClass.get(r.jobClass) ?? 0) + 1);
      if (!r.batched) {
        out.singles.push(a);
        continue;
      }
      const callNo = r.call ?? r.turn;
      let b = calls.get(callNo);
      if (!b) {
        b = { call: { api: r.data.api, items: [] }, byKey: new Map() };
        calls.set(callNo, b);
        out.batches.push(b.call);
      }
      // A tenant's duplicates ride on its first job with their input (only that one is sent and billed).
      const key = `${r.tenantId}\u0000${dedupKey(r.data.api, r.data.params)}`;
      const item = b.byKey.get(key);
      if (item) item.attempts.push(a);
      else {
        const fresh = { attempts: [a] };
        b.byKey.set(key, fresh);
        b.call.items.push(fresh);
      }
    }
    for (const [jobClass, n] of perClass) this.o.metrics?.dispatched(w.name, jobClass, n);
    return out;
  }

  /**
   * Marks a lease's attempts sent (one statement), then sends what it marked. Resolves when all
   * its calls have settled, so `stop()` waiting for it waits for them (each is tracked too: its end
   * pokes the loops).
   */
  private async send(w: WindowSpec, leased: Leased, probes: readonly string[]): Promise<void> {
    const { marked, unsent } = await this.markSent(w, leased);
    // A probe admitted but not sent must not hold its API's breaker half-open forever.
    const sent = new Set([...marked.singles.map((a) => a.job.data.api), ...marked.batches.map((b) => b.api)]);
    for (const api of probes) if (!sent.has(api)) this.o.breakers.release(api);
    const calls = [...marked.singles.map((a) => this.track(w, [a], () => this.run(w, a))), ...marked.batches.map((b) => this.track(w, attemptsOf({ singles: [], batches: [b] }), () => this.runBatch(w, b)))];
    await Promise.allSettled([...calls, ...unsent]);
  }

  /**
   * The "sent" mark (migration 0028): ONE statement for every reservation
   * this lease returned, before any of their calls is sent. Returns what may
   * be sent (the attempts it marked) and the settlements of the others. The others are settled at once as never
   * sent (refunded, put back, not counted as an attempt): one not marked was
   * settled meanwhile (its lease expired first), and when the mark itself
   * fails we cannot know whether it committed, so nothing is sent (an expiry
   * that finds the mark bills by the timeout rule, and this settlement, late,
   * corrects it to 0: dispatch/late-settlement.ts).
   */
  private async markSent(w: WindowSpec, leased: Leased): Promise<{ marked: Leased; unsent: Promise<void>[] }> {
    const all = attemptsOf(leased);
    let marked: Set<string>;
    try {
      marked = await sched.markSent(this.o.sql, all.map((a) => a.reservationId));
    } catch (err) {
      this.o.log.warn({ err, attempts: all.length }, 'could not mark leased attempts sent: none is sent, all are put back');
      marked = new Set();
    }
    const notSent = all.filter((a) => !marked.has(a.reservationId));
    const outcome: CallOutcome = { kind: 'server_error', httpStatus: null, creditsBilled: 0, data: null, message: 'not sent: the attempt could not be marked sent', status: null, retryAfterSeconds: 0, latencyMs: 0 };
    const unsent = notSent.map((a) => this.track(w, [a], () => this.settle(w, a, outcome, { putBack: true })));
    if (notSent.length === 0) return { marked: leased, unsent };
    const batches: BatchAttempt[] = [];
    for (const b of leased.batches) {
      const items = b.items.map((it) => ({ attempts: it.attempts.filter((a) => marked.has(a.reservationId)) })).filter((it) => it.attempts.length > 0);
      if (items.length > 0) batches.push({ api: b.api, items });
    }
    return { marked: { singles: leased.singles.filter((a) => marked.has(a.reservationId)), batches }, unsent };
  }

  /**
   * Runs one call's work and keeps it in `inFlight` until its settlement lands. A throw that
   * escapes it (a client bug, an unreadable answer the client did not classify, our own code)
   * must not leave its attempts open, their leases refreshed for the life of the process: each
   * attempt not yet queued for settlement is settled here (settleUnexpected).
   */
  private track(w: WindowSpec, attempts: readonly Attempt[], work: () => Promise<void>): Promise<void> {
    const tracked = (async () => {
      try {
        await work();
      } catch (err) {
        await this.settleUnexpected(w, attempts, err);
      }
    })().finally(() => {
      this.inFlight.delete(tracked);
      this.poke();
    });
    this.inFlight.add(tracked);
    return tracked;
  }

  /**
   * The attempts of a run that threw, not yet queued for settlement: nothing sent, a refunded
   * put-back (QUEUED again, no attempt used); possibly sent, settled like a timeout (billed per
   * TIMEOUT_BILLING, retried). Their calls are aborted first, in case the request still runs.
   * If even that throws, they are dropped from this process's open attempts, so their leases
   * expire and the sweeper settles them (timeout rule): never open for the life of the process.
   */
  private async settleUnexpected(w: WindowSpec, attempts: readonly Attempt[], err: unknown): Promise<void> {
    const left = attempts.filter((a) => !a.settling && this.open.has(a.reservationId));
    const message = err instanceof Error ? err.message : String(err);
    this.o.log.error({ err, jobs: left.map((a) => ({ jobId: a.job.id, sent: a.sent })) }, 'job run failed unexpectedly: its attempts are settled');
    if (left.length === 0) return;
    for (const a of left) a.abort.abort();
    try {
      await Promise.all(
        left.map((a) => {
          const { outcome, putBack } = unexpectedOutcome(a.sent, a.credits, this.o.timeoutBilling, message);
          return this.settle(w, a, outcome, { putBack });
        }),
      );
    } catch (again) {
      for (const a of left) if (!a.settling) this.open.delete(a.reservationId);
      this.o.log.error({ err: again, jobIds: left.map((a) => a.job.id) }, 'could not settle the attempts of a failed run: left to their leases');
    }
  }

  private async run(w: WindowSpec, a: Attempt): Promise<void> {
    let outcome: CallOutcome;
    try {
      outcome = await this.o.breakers.run(a.job.data.api, () =>
        this.o.client.call({ api: a.job.data.api, params: a.job.data.params, apiKey: w.apiKey, signal: a.abort.signal, onSent: () => void (a.sent = true) }),
      );
    } catch (err) {
      if (!(err instanceof BreakerOpen)) throw err;
      // The breaker opened after this job was leased: no call was made; it waits for the probe.
      const retryAt = this.o.breakers.retryAt(err.api) ?? Date.now() + 1000;
      outcome = { kind: 'server_error', httpStatus: null, creditsBilled: 0, data: null, message: err.message, status: null, retryAfterSeconds: Math.max(1, Math.ceil((retryAt - Date.now()) / 1000)), latencyMs: 0 };
      await this.settle(w, a, outcome, { putBack: true });
      return;
    }
    if (outcome.httpStatus !== null) this.latency.get(w.name)!.record(outcome.latencyMs);
    await this.settle(w, a, outcome);
  }

  /** Calls one batch for its distinct items and settles every attempt from its item's outcome. */
  private async runBatch(w: WindowSpec, b: BatchAttempt): Promise<void> {
    const all = b.items.flatMap((it) => it.attempts);
    // The batch is one call: it stops when any of its attempts' leases is lost.
    const abort = new AbortController();
    for (const a of all) a.abort.signal.addEventListener('abort', () => abort.abort(), { once: true });
    let batch: BatchOutcome | null = null;
    try {
      await this.o.breakers.run(b.api, async () => {
        batch = await this.o.client.callBatch({
          api: b.api,
          items: b.items.map((it, i) => ({ id: String(i), params: it.attempts[0]!.job.data.params })),
          apiKey: w.apiKey,
          signal: abort.signal,
          // Only an item's first attempt is sent; its duplicates ride on it and are never billed.
          onSent: () => {
            for (const it of b.items) it.attempts[0]!.sent = true;
          },
        });
        return batch.call;
      });
    } catch (err) {
      if (!(err instanceof BreakerOpen)) throw err;
      const retryAt = this.o.breakers.retryAt(err.api) ?? Date.now() + 1000;
      const outcome: CallOutcome = { kind: 'server_error', httpStatus: null, creditsBilled: 0, data: null, message: err.message, status: null, retryAfterSeconds: Math.max(1, Math.ceil((retryAt - Date.now()) / 1000)), latencyMs: 0 };
      await this.settleBatch(w, b, b.items.map(() => outcome), { putBack: true });
      return;
    }
    const result = batch as BatchOutcome | null;
    if (!result) throw new Error('batch call returned nothing');
    const call = result.call;
    if (call.httpStatus !== null) this.latency.get(w.name)!.record(call.latencyMs);
    const outcomes: CallOutcome[] = b.items.map((it, i) => {
      const item = result.items[i];
      // Refused as a whole (or no usable answer): every item shares the call's outcome; a worst-case bill is per item.
      if (!item) return { ...call, creditsBilled: call.creditsBilled > 0 ? it.attempts[0]!.credits : 0 };
      const { id: _id, ...rest } = item;
      return { ...rest, status: call.status, latencyMs: call.latencyMs };
    });
    await this.settleBatch(w, b, outcomes);
  }

  /** Settles one attempt: queued for the next settlement group; resolves when it has landed. */
  private settle(w: WindowSpec, a: Attempt, outcome: CallOutcome, opts: { putBack?: boolean } = {}): Promise<void> {
    return this.enqueueSettle(w, [{ a, outcome, s: this.prepare(a, outcome, opts) }], [outcome]);
  }

  /**
   * Settles every attempt of a batch, each from its item's outcome, as one
   * unit. Duplicates share the sent item's outcome and result; only the sent
   * one is billed. The account reactions apply once per kind.
   */
  private settleBatch(w: WindowSpec, b: BatchAttempt, outcomes: CallOutcome[], opts: { putBack?: boolean } = {}): Promise<void> {
    const items: PendingSettle['items'] = [];
    b.items.forEach((it, i) => {
      it.attempts.forEach((a, k) => {
        const outcome = k === 0 ? outcomes[i]! : { ...outcomes[i]!, creditsBilled: 0 };
        items.push({ a, outcome, s: this.prepare(a, outcome, opts) });
      });
    });
    const reactions = new Map<string, CallOutcome>();
    for (const o of outcomes) {
      const prev = reactions.get(o.kind);
      if (!prev || (o.retryAfterSeconds ?? 0) > (prev.retryAfterSeconds ?? 0)) reactions.set(o.kind, o);
    }
    return this.enqueueSettle(w, items, [...reactions.values()]);
  }

  private enqueueSettle(w: WindowSpec, items: PendingSettle['items'], reactions: CallOutcome[]): Promise<void> {
    for (const x of items) x.a.settling = true;
    if (this.abandoned) return Promise.resolve();
    return new Promise<void>((done) => {
      this.settleQueue.push({ w, items, reactions, done, tenants: [...new Set(items.map((x) => x.a.job.data.tenantId))], size: items.length });
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
      while (this.settleQueue.length > 0 && !this.abandoned) {
        const interval = this.o.settleIntervalMs ?? 2;
        if (failures === 0 && interval > 0) await new Promise((r) => setTimeout(r, interval));
        const take = pickSettleUnits(this.settleQueue, this.settlingTenants, SETTLE_GROUP_MAX, failures > 0);
        // Nothing this flusher may take: the flushers holding those tenants look again when done.
        if (take.length === 0) break;
        const units = take.map((i) => this.settleQueue[i]!);
        for (let k = take.length - 1; k >= 0; k--) this.settleQueue.splice(take[k]!, 1);
        const held = units.flatMap((u) => u.tenants);
        for (const t of held) this.settlingTenants.add(t);
        try {
          try {
            await this.applySettlements(units);
          } finally {
            // The transaction is over: its tenants' rows are free for the other flushers.
            for (const t of held) this.settlingTenants.delete(t);
          }
          for (const u of units) {
            for (const x of u.items) this.open.delete(x.a.reservationId);
            u.done();
          }
          failures = 0;
        } catch (err) {
          failures++;
          const error = classifySettleError(err);
          const first = units[0]!;
          if (error !== 'outage' && units.length === 1) first.faults = (first.faults ?? 0) + 1;
          const step = planSettleFailure({ error, units: units.length, attempts: first.items.length, faults: first.faults ?? 0, final: first.final ?? false });
          this.o.log.warn({ err, sqlState: sqlState(err), error, step, attempts: units.reduce((k, u) => k + u.items.length, 0), failures }, 'settlement failed');
          if (this.abandoned) {
            // Stopped past its grace: these are left to their leases (the sweeper settles them).
            for (const u of units) u.done();
            break;
          }
          this.afterSettleFailure(units, step, err);
          // A data error is not passing: the split units go at once. Anything else backs off (shorter while stopping).
          if (error !== 'data') await new Promise((r) => setTimeout(r, settleRetryDelayMs(failures, !this.running)));
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
  private afterSettleFailure(units: PendingSettle[], step: SettleFailureStep, err: unknown): void {
    switch (step) {
      case 'retry':
        this.settleQueue.push(...units);
        return;
      case 'split':
        this.settleQueue.unshift(...units.map((u) => ({ ...u, solo: true })));
        return;
      case 'split_attempts': {
        const u = units[0]!;
        let left = u.items.length;
        const done = () => {
          if (--left === 0) u.done();
        };
        // The account reactions ride on the first attempt only: they apply once.
        this.settleQueue.unshift(
          ...u.items.map((x, i) => ({ w: u.w, items: [x], reactions: i === 0 ? u.reactions : [], done, tenants: [x.a.job.data.tenantId], size: 1, solo: true, final: u.final ?? false })),
        );
        return;
      }
      case 'fail_final': {
        const u = units[0]!;
        const state = sqlState(err);
        const message = `Sluice could not store this attempt's result (the database refused it${state ? `, SQLSTATE ${state}` : ''}); the job is failed, billed as the provider billed it`;
        for (const x of u.items) {
          this.o.log.error({ err, jobId: x.a.job.id, tenantId: x.a.job.data.tenantId, reservationId: x.a.reservationId, sqlState: state }, 'settlement refused by the database: the attempt is settled as failed, RESULT_NOT_STORED');
        }
        const fail = { action: 'fail' as const, delaySeconds: 0, countsAsAttempt: true };
        this.settleQueue.unshift({
          ...u,
          items: u.items.map((x) => ({ a: x.a, outcome: { ...x.outcome, data: null, message }, s: { plan: fail, billed: x.s.billed, errorCode: RESULT_NOT_STORED } })),
          solo: true,
          final: true,
          faults: 0,
        });
        return;
      }
      case 'leave_to_lease': {
        const u = units[0]!;
        // Its lease is no longer refreshed: it expires and the sweeper settles the reservation (timeout rule).
        for (const x of u.items) {
          this.open.delete(x.a.reservationId);
          this.o.log.error({ err, jobId: x.a.job.id, tenantId: x.a.job.data.tenantId, reservationId: x.a.reservationId, sqlState: sqlState(err) }, 'settlement refused even as a failure: left to its attempt lease');
        }
        u.done();
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
  private async applySettlements(units: readonly PendingSettle[]): Promise<void> {
    const items = units.flatMap((u) => u.items);
    const groupItem = (x: (typeof items)[number]): sched.SettleGroupItem => {
      const { a, outcome, s } = x;
      return {
        id: a.reservationId,
        tenantId: a.job.data.tenantId,
        billed: s.billed,
        outcome: outcome.kind,
        ...(s.plan.action === 'requeue'
          ? {}
          : { finish: { id: a.job.id, attempt: a.attempt, state: s.plan.action === 'succeed' ? ('SUCCEEDED' as const) : ('FAILED' as const), queue: a.queue, result: resultOf(outcome, a.attempt, s.errorCode) } }),
      };
    };
    // react() acts on exactly the put-back signals (rate limit, credits, key).
    const oneCall = items.every((x) => x.s.plan.action !== 'requeue') && units.every((u) => u.reactions.every((o) => reactionTo(o) !== 'put_back'));
    let settled: Set<string>;
    if (oneCall) {
      settled = await sched.settleGroup(this.o.sql, items.map(groupItem));
    } else {
      settled = await this.settleInTransaction(units, items, groupItem);
    }
    // Found settled already: by this settlement's own earlier try (nothing to do), or by the
    // sweeper when the lease expired first: reconciled, never dropped (dispatch/late-settlement.ts).
    // A failure here retries the whole unit, which then finds every reservation settled: fenced.
    const late = items.filter((x) => !settled.has(x.a.reservationId));
    if (late.length > 0) {
      await reconcileLateSettlements(
        this.o.sql,
        late.map(({ a, outcome, s }) => ({ reservationId: a.reservationId, jobId: a.job.id, tenantId: a.job.data.tenantId, queue: a.queue, attempt: a.attempt, outcome, billed: s.billed })),
        this.o.log,
      );
    }
  }

  /** A settlement group with a retry, a put-back or an account signal: the same locks first, requeues, then settleGroup. */
  private async settleInTransaction(units: readonly PendingSettle[], items: PendingSettle['items'], groupItem: (x: PendingSettle['items'][number]) => sched.SettleGroupItem): Promise<Set<string>> {
    return this.o.sql.begin(async (tx) => {
      const live = await sched.lockOpenReservations(tx, items.map((x) => x.a.reservationId));
      const settling = items.filter((x) => live.has(x.a.reservationId));
      await sched.lockTenants(tx, settling.map((x) => x.a.job.data.tenantId));
      const events: JobEvent[] = [];
      // In queue key order (tenant id, class): each requeue moves its queue's depth (the trigger
      // locks the row), and a submission group locks its queues in that order too.
      const requeues = settling.filter((x) => x.s.plan.action === 'requeue');
      for (const i of requeueOrder(requeues.map((x) => ({ tenantId: x.a.job.data.tenantId, jobClass: x.a.jobClass, id: x.a.job.id })))) {
        const x = requeues[i]!;
        events.push(...(await this.requeue(tx, x.a, x.outcome, x.s)));
      }
      await sched.settleGroup(tx, settling.map(groupItem));
      // A provider signal is about the account, whoever's attempt carried it: react even when
      // superseded. Windows (by name) before account_state: the lock order.
      const reactions = units.flatMap((u) => u.reactions.map((o) => ({ window: u.w, o })));
      for (const i of reactionOrder(reactions.map((r) => ({ window: r.window.name, account: r.o.kind === 'credits_exhausted' })))) {
        await this.react(tx, reactions[i]!.window, reactions[i]!.o);
      }
      await publishJobEvents(tx, events);
      return live;
    });
  }

  /** The plan and the bill of one attempt's outcome (and its metrics). */
  private prepare(a: Attempt, outcome: CallOutcome, opts: { putBack?: boolean }) {
    const planned = planSettlement(opts.putBack ? 'put_back' : reactionTo(outcome), outcome, a.attempt, this.o.retryLimit, this.o.retryDelaySeconds);
    // Out of credits or an unusable key: the account or window stop holds the job back, so it is
    // ready again the moment an admin resumes (no stale retry-after on top).
    const heldByStop = outcome.kind === 'credits_exhausted' || outcome.kind === 'key_unusable';
    const plan = heldByStop && planned.action === 'requeue' ? { ...planned, delaySeconds: 0 } : planned;
    const billed = billedCredits(outcome.creditsBilled, a.credits);
    const m = this.o.metrics;
    m?.outcome(outcome.kind);
    if (outcome.kind === 'rate_limited') m?.provider429('rate');
    if (outcome.kind === 'credits_exhausted' && outcome.httpStatus === 429) m?.provider429('credits');
    m?.credits(billed, a.credits - billed);
    return { plan, billed };
  }

  /** A retry or put-back: the job back to QUEUED after its delay, its result, re-inserted in pg-boss, fenced by the attempt. */
  private async requeue(tx: postgres.TransactionSql, a: Attempt, outcome: CallOutcome, s: { plan: ReturnType<typeof planSettlement> }): Promise<JobEvent[]> {
    const { tenantId } = a.job.data;
    const { plan } = s;
    if (plan.action !== 'requeue') return [];
    if (!(await requeueJob(tx, a.job.id, a.attempt, plan.countsAsAttempt, plan.delaySeconds))) return [];
    await upsertResult(tx, a.job.id, resultOf(outcome, plan.countsAsAttempt ? a.attempt : a.attempt - 1));
    // Delete and re-insert under the same id: the job waits out its delay
    // without spending pg-boss's own retry budget, kept for crash redelivery.
    const startAfter = new Date(Date.now() + plan.delaySeconds * 1000);
    await reinsertJobs(this.o.boss, tx, a.queue, [{ id: a.job.id, data: a.job.data, startAfter }]);
    await sched.markQueuesReady(tx, tenantId, [a.jobClass], startAfter);
    return [{ jobId: a.job.id, tenantId, state: 'QUEUED' }];
  }

  /**
   * The account-level reactions to a provider signal, committed with the
   * settlement so every node sees them before this attempt is acknowledged:
   * a rate-limit 429 pauses the window (I2); credits exhausted stops all
   * dispatch until the renewal; an unusable key stops its window only.
   */
  private async react(tx: postgres.TransactionSql, w: WindowSpec, outcome: CallOutcome): Promise<void> {
    switch (outcome.kind) {
      case 'rate_limited':
        await sched.pauseWindow(tx, w.name, Math.max(1, outcome.retryAfterSeconds ?? 1), 'RATE_LIMITED');
        return;
      case 'credits_exhausted': {
        const renewal = outcome.status?.renewalAt?.getTime();
        const until = renewal && renewal > Date.now() ? new Date(renewal) : new Date(Date.now() + this.o.creditsStopSeconds * 1000);
        await sched.stopAccount(tx, until, 'CREDITS_EXHAUSTED');
        this.o.log.error({ until, window: w.name, message: outcome.message }, 'provider credits exhausted: all dispatch stopped');
        return;
      }
      case 'key_unusable':
        await sched.stopWindow(tx, w.name, 'KEY_UNUSABLE');
        this.o.log.error({ window: w.name, status: outcome.httpStatus, message: outcome.message }, 'upstream key unusable: its window is stopped');
        return;
      default:
        return;
    }
  }
}
