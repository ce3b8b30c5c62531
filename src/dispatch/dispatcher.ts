/**
 * The dispatcher: one per worker process, not one pg-boss `work()` per queue.
 *
 * For each window this process runs a loop that, while the window has pool
 * room and pacer tokens, makes one dispatch decision at a time:
 *   1. read the busy queues with the smallest virtual times (never idle tenants),
 *   2. choose one with the pure fair-order rules (scheduler/fair.ts),
 *   3. in ONE transaction: take the tenant's cap slots, fetch its jobs from
 *      pg-boss, claim them, reserve their credits against the quota, take the
 *      window's tokens and pool slots, advance the queue's virtual time,
 *   4. call the provider for each job, and settle the attempts: grouped, many
 *      per transaction every SETTLE_INTERVAL_MS, retried until they land.
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
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type postgres from 'postgres';
import type { JobWithMetadata, PgBoss } from 'pg-boss';
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import { publishJobEvents, type JobEvent } from '../events/bus.ts';
import { WORK_CHANNEL } from '../jobs/service.ts';
import { claimJobs, finishJob, requeueJob, unclaimJobs, upsertResult } from '../jobs/store.ts';
import { reactionTo } from '../provider/classify.ts';
import type { BatchOutcome, CallOutcome, ProviderClient } from '../provider/types.ts';
import { deferApiJobs, inTransaction, queueName, reinsertJobs, type JobClass } from '../queue/boss.ts';
import { classOrder, pickQueue, type Pick } from '../scheduler/fair.ts';
import { billedCredits, fitCount } from '../scheduler/ledger.ts';
import { msUntilTokens, takeable } from '../scheduler/pacer.ts';
import { LatencyTracker, poolSize } from '../scheduler/pool.ts';
import * as sched from '../scheduler/store.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import { quotaPeriod } from '../tenants/policy.ts';
import { errorCodeFor, planSettlement } from './retry.ts';
import { BreakerOpen, type Breakers } from './breakers.ts';
import { batchSpec, batchTake, planLease } from './batching.ts';
import type { Metrics } from '../metrics.ts';

export interface DispatcherOptions {
  sql: Sql;
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
  job: JobWithMetadata<JobData>;
  attempt: number;
  reservationId: string;
  credits: number;
  /** Local clock (ms): the lease is surely live until then (the last refresh's send time + the lease). */
  deadline: number;
  /** Aborts the call: the lease could not be refreshed in time, or it was superseded. */
  abort: AbortController;
}

/** One unit of settlement (one call: a single attempt or a batch's attempts), waiting to land. */
interface PendingSettle {
  w: WindowSpec;
  items: Array<{ a: Attempt; outcome: CallOutcome; s: { plan: ReturnType<typeof planSettlement>; billed: number } }>;
  /** The account-level reactions to the call's signals (one per kind). */
  reactions: CallOutcome[];
  done: () => void;
}

/** Most attempts settled in one transaction: small enough that a group holds its tenants' rows briefly. */
const SETTLE_GROUP_MAX = 32;
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

/** The window changed under us between the read and the take (another node was faster): decide again. */
class LostRace extends Error {}

export class Dispatcher {
  private readonly o: DispatcherOptions;
  private running = false;
  private readonly loops: Promise<void>[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private readonly wakers = new Set<() => void>();
  private unlisten: (() => Promise<void>) | null = null;
  readonly latency = new Map<string, LatencyTracker>();
  /** Tenants one of this process's loops is leasing right now: the other loops pick someone else. */
  private readonly leasing = new Set<string>();
  /** Oldest ready job's wait per class, refreshed by the sweeper for the starvation guard. */
  oldestWaitMs: Partial<Record<JobClass, number>> = {};
  /** This process's open attempts by reservation id: their leases are refreshed until they settle. */
  private readonly open = new Map<string, Attempt>();
  private leaseTimer: NodeJS.Timeout | null = null;
  private refreshing = false;
  /** Settlements waiting to land, in order; a flusher applies them in groups and retries until they land. */
  private readonly settleQueue: PendingSettle[] = [];
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
      this.o.log.warn({ open: this.open.size }, 'stop grace over: open attempts are left to their leases');
      for (const a of this.open.values()) a.abort.abort();
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
    const now = Date.now();
    const margin = this.leaseMs() / 4;
    for (const a of this.open.values()) if (now > a.deadline - margin && !a.abort.signal.aborted) a.abort.abort();
    if (this.refreshing || this.open.size === 0 || this.abandoned) return;
    this.refreshing = true;
    const ids = [...this.open.keys()];
    const sentAt = Date.now();
    sched
      .refreshLeases(this.o.sql, ids, this.o.leaseSeconds)
      .then(({ live, settled }) => {
        for (const id of ids) {
          const a = this.open.get(id);
          if (!a) continue;
          if (live.has(id)) a.deadline = Math.max(a.deadline, sentAt + this.leaseMs());
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
        if (err instanceof LostRace) continue;
        this.o.log.error({ err, window: w.name }, 'dispatch failed');
        await this.sleep(this.o.idlePollMs);
      }
    }
  }

  /** Makes one decision on this window; returns how long to wait before the next (0 = at once). */
  private async dispatchOnce(w: WindowSpec): Promise<number> {
    const [state] = await sched.readWindows(this.o.sql, [w.name]);
    if (!state) throw new Error(`window ${w.name} is not in the database`);
    // Credits exhausted: nothing leaves on any window until the renewal or an admin resumes.
    if (state.accountStoppedUntil !== null && state.accountStoppedUntil > state.dbNow) return this.o.idlePollMs;
    const pool = this.poolFor(w);
    const room = pool - state.inFlight;
    if (room <= 0) return Math.min(this.o.idlePollMs, 50); // a settle here pokes; another node's does not
    const tokens = takeable(state, state.dbNow);
    if (tokens < 1) return Math.min(this.o.idlePollMs, Math.max(1, msUntilTokens(state, state.dbNow, 1)));
    const maxTake = Math.min(room, tokens, this.o.leaseMax);
    const candidates = await sched.loadCandidates(this.o.sql, w.classes, 32);
    const order = classOrder(w.classes, this.oldestWaitMs, this.o.maxWaitMs);
    let pick = pickQueue(candidates, order, maxTake);
    if (!pick) return this.o.idlePollMs;
    if (this.leasing.has(pick.queue.tenantId)) {
      // Another loop here is leasing the fairest queue. Lease the next one in parallel only if it is
      // within one lease of the front: parallel loops must not let a tenant that is ahead jump the queue.
      const front = pick.queue;
      const next = pickQueue(candidates.filter((c) => !this.leasing.has(c.tenantId)), order, maxTake);
      const turn = Math.max(this.o.leaseMax, this.o.batchQuantum * front.weight) / front.weight;
      if (!next || next.queue.jobClass !== front.jobClass || next.queue.vtime > front.vtime + turn) return Math.min(this.o.idlePollMs, 20);
      pick = next;
    }
    const batchMax = this.o.batchMax ?? 1;
    if (batchMax > 1) {
      // The queue's next job batches: take up to a batch's worth (one pool slot, one token per item).
      const head = await sched.headApi(this.o.sql, pick.queue.tenantId, pick.queue.jobClass);
      const spec = head ? batchSpec(this.o.catalog, head) : null;
      if (spec) {
        const take = batchTake({ tokens, batchMax, apiMaxSize: spec.maxSize, capFree: pick.queue.cap - pick.queue.inFlight, singleTake: pick.take });
        // A batch is a deficit-round-robin turn: at most BATCH_QUANTUM items per unit of weight, so
        // tenants taking turns (in sequence or in parallel loops) get items in proportion to weight.
        pick = { ...pick, take: Math.max(pick.take, Math.min(take, this.o.batchQuantum * pick.queue.weight)) };
      }
    }
    this.leasing.add(pick.queue.tenantId);
    let leased: Leased;
    try {
      leased = await this.lease(w, pick, pool, room);
    } finally {
      this.leasing.delete(pick.queue.tenantId);
    }
    for (const a of leased.singles) this.track(this.run(w, a));
    for (const b of leased.batches) this.track(this.runBatch(w, b));
    return 0;
  }

  /**
   * The dispatch transaction: cap, fetch, claim, quota, tokens, virtual time,
   * all or nothing.
   */
  private async lease(w: WindowSpec, pick: Pick, pool: number, room: number): Promise<Leased> {
    const { sql, boss, catalog } = this.o;
    const { tenantId, jobClass } = pick.queue;
    const queue = queueName(tenantId, jobClass);
    const events: JobEvent[] = [];
    const probes: string[] = [];
    // The reservations' leases start inside the transaction, after this instant.
    const deadline = Date.now() + this.leaseMs();
    const attempts = await sql.begin(async (tx) => {
      const db = inTransaction(tx);
      const slots = await sched.claimTenantSlots(tx, tenantId, pick.take);
      if (slots.granted === 0) return { singles: [], batches: [] };
      const fetched = await boss.fetch<JobData>(queue, { batchSize: slots.granted, includeMetadata: true, db });
      if (fetched.length === 0) {
        await sched.releaseTenantSlots(tx, tenantId, slots.granted);
        await sched.refreshReadyAt(tx, tenantId, jobClass);
        return { singles: [], batches: [] };
      }
      const claimed = await claimJobs(tx, fetched.map((j) => j.id));
      // Cancelled or finished meanwhile: acknowledge without a call.
      const gone = fetched.filter((j) => !claimed.has(j.id));
      if (gone.length > 0) await boss.complete(queue, gone.map((j) => j.id), null, { db });
      const claimedLive = fetched.filter((j) => claimed.has(j.id));
      // Jobs for an API whose breaker is open wait for its probe; they take no token and no credit.
      const verdicts = claimedLive.map((j) => ({ j, v: this.o.breakers.admit(j.data.api) }));
      for (const { j, v } of verdicts) if (v === 'probe') probes.push(j.data.api);
      const admitted = new Set(verdicts.filter((x) => x.v !== 'hold').map((x) => x.j.id));
      const held = claimedLive.filter((j) => !admitted.has(j.id));
      if (held.length > 0) await this.holdForBreaker(tx, queue, tenantId, jobClass, held, events);
      const live = claimedLive.filter((j) => admitted.has(j.id));

      const period = quotaPeriod(slots.periodAnchor, new Date());
      const ledger = await sched.lockLedger(tx, tenantId, period.start);
      const costs = live.map((j) => catalog.get(j.data.api)?.creditCost ?? 1);
      const fit = fitCount(ledger.billed, ledger.reserved, slots.quota, costs);
      const go = live.slice(0, fit);
      const over = live.slice(fit);
      if (over.length > 0) await this.overQuota(tx, queue, tenantId, slots.quotaPolicy, over, costs[fit]!, events);

      // Group by API into batch calls (deduplicated) and single calls, within the window's room.
      const plan = planLease(go.map((j) => j.data), catalog, room, this.o.batchMax ?? 1);
      if (plan.back.length > 0) {
        const back = plan.back.map((i) => go[i]!);
        await unclaimJobs(tx, back.map((j) => j.id), 'QUEUED');
        await reinsertJobs(boss, tx, queue, back);
        for (const j of back) events.push({ jobId: j.id, tenantId, state: 'QUEUED' });
      }
      const kept = go.length - plan.back.length;
      await sched.releaseTenantSlots(tx, tenantId, slots.granted - kept);
      const attemptOf = new Map<number, Attempt>();
      const rows: sched.ReservationRow[] = [];
      const add = (i: number, windowSlot: boolean) => {
        const job = go[i]!;
        const row = { id: randomUUID(), jobId: job.id, attempt: claimed.get(job.id)!, credits: costs[i]!, windowSlot };
        rows.push(row);
        attemptOf.set(i, { queue, jobClass, job, attempt: row.attempt, reservationId: row.id, credits: row.credits, deadline, abort: new AbortController() });
      };
      for (const i of plan.singles) add(i, true);
      // A batch holds one pool slot: its first job's reservation carries it.
      for (const b of plan.batches) b.items.flatMap((it) => it.jobs).forEach((i, k) => add(i, k === 0));
      if (rows.length > 0) {
        await sched.reserve(tx, tenantId, period.start, w.name, this.o.nodeId, rows, this.o.leaseSeconds);
        // Fair share counts jobs, batched or not: a batch advances the queue by its item count.
        await sched.advanceQueue(tx, tenantId, jobClass, rows.length, slots.weight);
      }
      // The window (the hot row) last, in the lock order; it changed under us: decide again.
      if (kept > 0 && !(await sched.takeWindow(tx, w.name, plan.tokens, pool, plan.slots))) throw new LostRace();
      for (const r of rows) events.push({ jobId: r.jobId, tenantId, state: 'RUNNING' });
      await publishJobEvents(tx, events);
      if (rows.length > 0) this.o.metrics?.dispatched(w.name, jobClass, rows.length);
      return {
        singles: plan.singles.map((i) => attemptOf.get(i)!),
        batches: plan.batches.map((b) => ({ api: b.api, items: b.items.map((it) => ({ attempts: it.jobs.map((i) => attemptOf.get(i)!) })) })),
      };
    }).catch((err) => {
      for (const api of probes) this.o.breakers.release(api);
      throw err;
    });
    // A probe admitted but not sent (over quota, say) must not hold its API's breaker half-open forever.
    const sent = [...attempts.singles.map((a) => a.job.data.api), ...attempts.batches.map((b) => b.api)];
    for (const api of probes) if (!sent.includes(api)) this.o.breakers.release(api);
    for (const a of [...attempts.singles, ...attempts.batches.flatMap((b) => b.items.flatMap((it) => it.attempts))]) this.open.set(a.reservationId, a);
    return attempts;
  }

  /**
   * The next job would pass the tenant's quota. WAIT: the tenant's jobs wait,
   * visibly, in WAITING_QUOTA until the sweeper sees room again. FAIL: that job
   * fails with QUOTA_EXCEEDED. Either way the jobs not run go back to pg-boss.
   */
  private async overQuota(
    tx: postgres.TransactionSql,
    queue: string,
    tenantId: string,
    policy: 'WAIT' | 'FAIL',
    over: JobWithMetadata<JobData>[],
    neededCost: number,
    events: JobEvent[],
  ): Promise<void> {
    const { boss } = this.o;
    const db = inTransaction(tx);
    let back = over;
    if (policy === 'FAIL') {
      const [first, ...rest] = over;
      back = rest;
      await upsertResult(tx, first!.id, { data: null, errorCode: 'QUOTA_EXCEEDED', errorMessage: `the tenant's monthly credit quota has no room for this job (${neededCost} credits)`, httpStatus: null, creditsBilled: 0, attempts: 0 });
      await tx`update jobs set state = 'FAILED', attempts = greatest(attempts - 1, 0), finished_at = now(), updated_at = now() where id = ${first!.id}`;
      await boss.complete(queue, first!.id, null, { db });
      events.push({ jobId: first!.id, tenantId, state: 'FAILED' });
    }
    if (back.length === 0) return;
    await unclaimJobs(tx, back.map((j) => j.id), policy === 'WAIT' ? 'WAITING_QUOTA' : 'QUEUED');
    await reinsertJobs(boss, tx, queue, back);
    if (policy === 'WAIT') {
      const waiting = await sched.blockForQuota(tx, tenantId, neededCost);
      for (const id of waiting) events.push({ jobId: id, tenantId, state: 'WAITING_QUOTA' });
    }
  }

  /** Puts jobs back until their API's breaker lets a probe through. */
  private async holdForBreaker(tx: postgres.TransactionSql, queue: string, tenantId: string, jobClass: JobClass, held: JobWithMetadata<JobData>[], events: JobEvent[]): Promise<void> {
    const db = inTransaction(tx);
    // Until the probe is due, or (with a probe out) a second from now.
    const retryAt = Math.max(...held.map((j) => this.o.breakers.retryAt(j.data.api) ?? 0));
    const startAfter = new Date(Math.max(retryAt, Date.now() + 1000));
    await unclaimJobs(tx, held.map((j) => j.id), 'QUEUED', startAfter);
    await reinsertJobs(this.o.boss, tx, queue, held.map((j) => ({ id: j.id, data: j.data, startAfter })));
    // The queue's other jobs for those APIs wait too, so the next decisions serve its other APIs
    // (and other tenants) instead of fetching and holding them one by one.
    await deferApiJobs(tx, queue, tenantId, jobClass, [...new Set(held.map((j) => j.data.api))], startAfter);
    await sched.markQueuesReady(tx, tenantId, [jobClass], startAfter);
    for (const j of held) events.push({ jobId: j.id, tenantId, state: 'QUEUED' });
  }

  private track(p: Promise<void>): void {
    const tracked = p
      .catch((err) => this.o.log.error({ err }, 'job run failed'))
      .finally(() => {
        this.inFlight.delete(tracked);
        this.poke();
      });
    this.inFlight.add(tracked);
  }

  private async run(w: WindowSpec, a: Attempt): Promise<void> {
    let outcome: CallOutcome;
    try {
      outcome = await this.o.breakers.run(a.job.data.api, () =>
        this.o.client.call({ api: a.job.data.api, params: a.job.data.params, apiKey: w.apiKey, signal: a.abort.signal }),
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
    if (this.abandoned) return Promise.resolve();
    return new Promise<void>((done) => {
      this.settleQueue.push({ w, items, reactions, done });
      void this.flush();
    });
  }

  /**
   * A settlement flusher (up to SETTLE_FLUSHERS at once): waits
   * SETTLE_INTERVAL_MS for more outcomes, takes up to SETTLE_GROUP_MAX
   * attempts off the queue and applies them in ONE transaction, and repeats
   * while any wait. A group that fails (connection reset, Postgres restart, a
   * lock timeout) goes back on the queue and is retried with backoff until it
   * lands, never dropped; after a failure this flusher takes one unit at a
   * time, so a unit that keeps failing cannot hold the others. Retrying is
   * safe: every change is fenced by the reservation (an earlier try that
   * committed without our hearing it makes the next try change nothing). The
   * attempts stay open (their leases refreshed) until their settlement lands.
   */
  private async flush(): Promise<void> {
    if (this.flushers >= SETTLE_FLUSHERS) return;
    this.flushers++;
    let failures = 0;
    try {
      while (this.settleQueue.length > 0 && !this.abandoned) {
        const interval = this.o.settleIntervalMs ?? 2;
        if (failures === 0 && interval > 0) await new Promise((r) => setTimeout(r, interval));
        let n = 0;
        let count = 0;
        if (failures > 0) n = Math.min(1, this.settleQueue.length);
        else while (n < this.settleQueue.length && (n === 0 || count + this.settleQueue[n]!.items.length <= SETTLE_GROUP_MAX)) count += this.settleQueue[n++]!.items.length;
        const units = this.settleQueue.splice(0, n);
        if (units.length === 0) break;
        try {
          await this.applySettlements(units);
          for (const u of units) {
            for (const x of u.items) this.open.delete(x.a.reservationId);
            u.done();
          }
          failures = 0;
        } catch (err) {
          failures++;
          this.o.log.warn({ err, attempts: units.reduce((k, u) => k + u.items.length, 0), failures }, 'settlement failed; retrying');
          if (this.abandoned) {
            // Stopped past its grace: these are left to their leases (the sweeper settles them).
            for (const u of units) u.done();
            break;
          }
          this.settleQueue.push(...units);
          await new Promise((r) => setTimeout(r, Math.min(5_000, 50 * 2 ** Math.min(failures, 7))));
        }
      }
    } finally {
      this.flushers--;
    }
  }

  /**
   * One settlement transaction for many attempts, in the lock order:
   * the reservations still open (the fence: a superseded attempt changes
   * nothing), their tenants in id order, each job's state, result and
   * pg-boss ack (I6: the ack commits with the stored result), then the
   * reservations' bills and slots in one statement (sluice_settle: ledger,
   * then the windows, the hot rows, last), then the account reactions (a
   * rate-limit 429 pauses the window on every node, I2) and the events.
   */
  private async applySettlements(units: readonly PendingSettle[]): Promise<void> {
    await this.o.sql.begin(async (tx) => {
      const items = units.flatMap((u) => u.items);
      const live = await sched.lockOpenReservations(tx, items.map((x) => x.a.reservationId));
      const settling = items.filter((x) => live.has(x.a.reservationId));
      await sched.lockTenants(tx, settling.map((x) => x.a.job.data.tenantId));
      const events: JobEvent[] = [];
      for (const x of settling) events.push(...(await this.applyJobState(tx, x.a, x.outcome, x.s)));
      await sched.settleReservations(tx, settling.map((x) => ({ id: x.a.reservationId, billed: x.s.billed, outcome: x.outcome.kind })));
      // A provider signal is about the account, whoever's attempt carried it: react even when superseded.
      for (const u of units) for (const o of u.reactions) await this.react(tx, u.w, o);
      await publishJobEvents(tx, events);
    });
  }

  /** The plan and the bill of one attempt's outcome (and its metrics). */
  private prepare(a: Attempt, outcome: CallOutcome, opts: { putBack?: boolean }) {
    const planned = planSettlement(opts.putBack ? 'put_back' : reactionTo(outcome), outcome, a.attempt, this.o.retryLimit, this.o.retryDelaySeconds);
    // Out of credits or an unusable key: the account or window stop holds the job back, so it is
    // ready again the moment an admin resumes (no stale retry-after on top).
    const heldByStop = outcome.kind === 'credits_exhausted' || outcome.kind === 'key_unusable';
    const plan = heldByStop && planned.action === 'requeue' ? { ...planned, delaySeconds: 0 } : planned;
    const billed = billedCredits(outcome.kind, outcome.creditsBilled, a.credits);
    const m = this.o.metrics;
    m?.outcome(outcome.kind);
    if (outcome.kind === 'rate_limited') m?.provider429('rate');
    if (outcome.kind === 'credits_exhausted' && outcome.httpStatus === 429) m?.provider429('credits');
    m?.credits(billed, a.credits - billed);
    return { plan, billed };
  }

  /** The job's next state, its result and the pg-boss acknowledgement, fenced by the attempt; returns the events to publish. */
  private async applyJobState(tx: postgres.TransactionSql, a: Attempt, outcome: CallOutcome, s: { plan: ReturnType<typeof planSettlement>; billed: number }): Promise<JobEvent[]> {
    const { boss } = this.o;
    const { tenantId } = a.job.data;
    const { plan, billed } = s;
    const db = inTransaction(tx);
    if (plan.action === 'requeue') {
      if (!(await requeueJob(tx, a.job.id, a.attempt, plan.countsAsAttempt, plan.delaySeconds))) return [];
      await this.storeResult(tx, a, outcome, billed, plan.countsAsAttempt ? a.attempt : a.attempt - 1);
      // Delete and re-insert under the same id: the job waits out its delay
      // without spending pg-boss's own retry budget, kept for crash redelivery.
      const startAfter = new Date(Date.now() + plan.delaySeconds * 1000);
      await reinsertJobs(boss, tx, a.queue, [{ id: a.job.id, data: a.job.data, startAfter }]);
      await sched.markQueuesReady(tx, tenantId, [a.jobClass], startAfter);
      return [{ jobId: a.job.id, tenantId, state: 'QUEUED' }];
    }
    const state = plan.action === 'succeed' ? 'SUCCEEDED' : 'FAILED';
    if (!(await finishJob(tx, a.job.id, a.attempt, state))) return [];
    await this.storeResult(tx, a, outcome, billed, a.attempt);
    await boss.complete(a.queue, a.job.id, null, { db });
    return [{ jobId: a.job.id, tenantId, state }];
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

  private storeResult(tx: postgres.TransactionSql, a: Attempt, outcome: CallOutcome, billed: number, attempts: number) {
    return upsertResult(tx, a.job.id, {
      data: outcome.kind === 'billed' ? outcome.data : null,
      errorCode: errorCodeFor(outcome.kind),
      errorMessage: outcome.message,
      httpStatus: outcome.httpStatus,
      creditsBilled: billed,
      attempts,
    });
  }
}
