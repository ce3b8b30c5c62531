/**
 * The window loops of one process: for each window a few loops
 * (DISPATCH_LOOPS), each one lease after another:
 *   1. the class order (starvation guard) and the APIs held by open breakers,
 *      decided here (pure, scheduler/fair.ts),
 *   2. ONE call of sluice_lease (drizzle/functions/sluice_lease.sql; its pure model is
 *      scheduler/lease.ts planPicks): in one transaction, across as many
 *      tenants as the weighted fair order allows, it takes their cap slots,
 *      activates their pg-boss jobs, claims them, reserves their credits
 *      against the quota, advances the queues' virtual times, and takes the
 *      window's tokens and pool slots once for all of them,
 *   3. mark the lease's attempts sent (attempt-leases.ts), call the provider
 *      (a batch call may carry many tenants' batch turns), and hand each
 *      call's outcomes to the settler (settler.ts).
 * Every call runs tracked: a throw that escapes it settles its attempts
 * (never left open for the life of the process).
 */
import type { Logger } from 'pino';
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import type { BatchOutcome, CallOutcome, ProviderClient } from '../provider/types.ts';
import { type JobClass } from '../config/classes.ts';
import { classOrder } from '../scheduler/fair.ts';
import { leaseBatchSpecs, leaseCosts } from '../scheduler/lease.ts';
import { msUntilTokens, takeable } from '../scheduler/pacer.ts';
import { LatencyTracker, poolSize } from '../scheduler/pool.ts';
import { leaseJobs } from '../scheduler/sql/reservations.ts';
import { readWindows } from '../scheduler/sql/windows.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import { BreakerOpen, type Breakers } from './breakers.ts';
import { dedupKey } from './batching.ts';
import { unexpectedOutcome } from './liveness.ts';
import type { Attempt, AttemptLeases, BatchAttempt } from './attempt-leases.ts';
import type { Settler } from './settler.ts';
import { tracing } from '../tracing/tracer.ts';
import { leaseTrace } from '../tracing/job-trace.ts';
import { apiHoldKey, HoldLog, windowHoldKey } from '../tracing/holds.ts';

export interface WindowLoopsOptions {
  sql: Sql;
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
  batchMax?: number | undefined;
  idlePollMs: number;
  maxWaitMs: Partial<Record<JobClass, number>>;
  /** The attempt lease: how long an open attempt stays live without a refresh (the sweeper settles it after). */
  leaseSeconds: number;
  timeoutBilling: 'billed' | 'refunded';
  breakers: Breakers;
  leases: AttemptLeases;
  settler: Settler;
  /** The dispatcher runs: the loops lease while it does. */
  running: () => boolean;
  /** Called with every answer the provider gave on the window (a batch call once): the learned pace's samples. */
  onAnswer?: ((window: WindowSpec, outcome: CallOutcome) => void) | undefined;
  /** The window's pace as this process last read it (the learned pace); absent: the configured one. */
  paceOf?: ((window: WindowSpec) => number | null) | undefined;
  /** Called once per lease with how many jobs of each class it dispatched on the window. */
  onLeased?: ((window: string, jobClass: JobClass, jobs: number) => void) | undefined;
  log: Logger;
}

interface Leased {
  singles: Attempt[];
  batches: BatchAttempt[];
}

/** Every attempt of a lease: its singles and each batch item's attempts (duplicates included). */
function attemptsOf(l: Leased): Attempt[] {
  return [...l.singles, ...l.batches.flatMap((b) => b.items.flatMap((it) => it.attempts))];
}

/** The outcome of a call the breaker refused after its job was leased: no call was made; it waits for the probe. */
function breakerOpenOutcome(breakers: Breakers, err: BreakerOpen): CallOutcome {
  const retryAt = breakers.retryAt(err.api) ?? Date.now() + 1000;
  return { kind: 'server_error', httpStatus: null, creditsBilled: 0, data: null, message: err.message, status: null, retryAfterSeconds: Math.max(1, Math.ceil((retryAt - Date.now()) / 1000)), latencyMs: 0 };
}

/**
 * Most jobs one lease call takes (singles are bounded by the pool's room anyway; batches carry
 * more): bounds how long one call holds its tenants' rows.
 */
const LEASE_CALL_MAX = 256;

/** How long a loop waits when another node's lease of its window is under way (a poke wakes it sooner). */
const LEASE_BUSY_RETRY_MS = 10;

export class WindowLoops {
  private readonly options: WindowLoopsOptions;
  private readonly loops: Promise<void>[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  /** Each sleeping loop's wake-up, with its window. */
  private readonly wakers = new Map<() => void, string>();
  /**
   * Windows whose last lease came back empty for want of tokens, of pool room, or because the
   * account is stopped: more work cannot help them before their next lease (which the wait for the
   * tokens, a settlement's poke or the idle poll brings), so new-work pokes leave their loops asleep.
   * Without this, every submission's commit (one NOTIFY per group) woke each worker's loops of a
   * paced window into a lease and a window read that could take nothing.
   */
  private readonly workCannotHelp = new Set<string>();
  readonly latency = new Map<string, LatencyTracker>();
  /**
   * How long a call holds its pool slot, per window: from the lease's return to its settlement
   * landing (the mark, the call, the settlement's commit). This, not the call's latency, is the W of
   * Little's law for the pool: a slot is free again only when the settlement commits, so a pool
   * sized by the call alone falls short of the paced rate whenever commits are slow.
   */
  readonly held = new Map<string, LatencyTracker>();
  /** Oldest ready job's wait per class, refreshed by the sweeper for the starvation guard. */
  oldestWaitMs: Partial<Record<JobClass, number>> = {};
  /** Windows one of this process's loops is leasing right now. */
  private readonly leasing = new Set<string>();
  /** What held the windows and APIs, as this process saw it: traced jobs' wait reasons (only while tracing). */
  private readonly holds = new HoldLog();

  constructor(options: WindowLoopsOptions) {
    this.options = options;
    for (const w of options.windows) {
      this.latency.set(w.name, new LatencyTracker(500, options.initialLatencyMs));
      this.held.set(w.name, new LatencyTracker(500, options.initialLatencyMs));
    }
  }

  /** Little's law: the paced rate × the p95 time a call holds its slot (`held`). */
  poolFor(w: WindowSpec): number {
    return poolSize(w.pacedPerMinute, this.held.get(w.name)!.percentile(95), { concurrentLimit: w.concurrentLimit, max: this.options.poolMax });
  }

  start(): void {
    const { windows, loopsPerWindow } = this.options;
    for (const w of windows) for (let i = 0; i < loopsPerWindow; i++) this.loops.push(this.windowLoop(w));
  }

  /** Resolves when every loop has ended and every call in flight has settled (stop the dispatcher first). */
  async drained(): Promise<void> {
    await Promise.allSettled(this.loops);
    await Promise.allSettled([...this.inFlight]);
  }

  /** Wakes every sleeping window loop (a freed slot, stop). */
  poke(): void {
    for (const wake of this.wakers.keys()) wake();
  }

  /** New work was submitted: wakes the loops of the windows it could help (see `workCannotHelp`). */
  pokeWork(): void {
    for (const [wake, window] of this.wakers) if (!this.workCannotHelp.has(window)) wake();
  }

  private async sleep(ms: number, window: string): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    let wake!: () => void;
    await new Promise<void>((resolve) => {
      wake = resolve;
      this.wakers.set(wake, window);
      timer = setTimeout(resolve, Math.max(1, ms));
    });
    clearTimeout(timer);
    this.wakers.delete(wake);
  }

  private async windowLoop(w: WindowSpec): Promise<void> {
    while (this.options.running()) {
      try {
        const wait = await this.dispatchOnce(w);
        if (wait > 0) await this.sleep(wait, w.name);
      } catch (err) {
        this.options.log.error({ err, window: w.name }, 'dispatch failed');
        await this.sleep(this.options.idlePollMs, w.name);
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
    if (this.leasing.has(w.name)) return this.options.idlePollMs;
    this.leasing.add(w.name);
    try {
      return await this.leaseOnce(w);
    } finally {
      this.leasing.delete(w.name);
    }
  }

  private async leaseOnce(w: WindowSpec): Promise<number> {
    const { sql, breakers, idlePollMs, maxWaitMs } = this.options;
    this.workCannotHelp.delete(w.name);
    const pool = this.poolFor(w);
    const order = classOrder(w.classes, this.oldestWaitMs, maxWaitMs);
    // Jobs for an API whose breaker is open wait for its probe: the lease does not take them.
    const hold: string[] = [];
    const probes: string[] = [];
    for (const { api, state } of breakers.states()) {
      if (state === 'CLOSED') continue;
      const v = breakers.admit(api);
      if (v === 'hold') hold.push(api);
      else if (v === 'probe') probes.push(api);
    }
    if (tracing.on) for (const api of hold) this.holds.note(apiHoldKey(api), 'BREAKER_OPEN', Date.now());
    let leased: Leased | 'busy' | 'changed';
    try {
      leased = await this.lease(w, pool, order, hold);
    } catch (err) {
      for (const api of probes) breakers.release(api);
      throw err;
    }
    if (leased === 'busy' || leased === 'changed') {
      for (const api of probes) breakers.release(api);
      // Another loop (here or on another node) is leasing this window: it fills the room; wake on
      // its settlements' poke, or look again shortly. Changed: the window moved under the call
      // (a pause, a stop), which wrote nothing: decide again at once.
      return leased === 'busy' ? LEASE_BUSY_RETRY_MS : 0;
    }
    if (leased.singles.length + leased.batches.length > 0) {
      // Marked sent and sent off the window's lease path: the next lease does not wait for the mark.
      const sending = leased;
      this.track(w, attemptsOf(sending), () => this.send(w, sending, probes));
      return 0;
    }
    for (const api of probes) breakers.release(api);
    const [state] = await readWindows(sql, [w.name]);
    if (!state) throw new Error(`window ${w.name} is not in the database`);
    if (tracing.on) this.noteWindowHold(w, state);
    // Credits exhausted: nothing leaves on any window until the renewal or an admin resumes.
    const stopped = state.accountStoppedUntil !== null && state.accountStoppedUntil > state.dbNow;
    const full = pool - state.inFlight <= 0;
    const dry = takeable(state, state.dbNow) < 1;
    if (stopped || full || dry) this.workCannotHelp.add(w.name);
    if (stopped) return idlePollMs;
    if (full) return Math.min(idlePollMs, 50); // a settle here pokes; another node's does not
    if (dry) return Math.min(idlePollMs, Math.max(1, msUntilTokens(state, state.dbNow, 1)));
    return idlePollMs;
  }

  /** A window seen stopped or paused after an empty lease: a hold, until when the row says (wall clock). */
  private noteWindowHold(w: WindowSpec, state: { dbNow: number; accountStoppedUntil: number | null; pausedUntil: number | null; pauseReason: string | null }): void {
    const now = Date.now();
    const until = (at: number) => now + (at - state.dbNow);
    if (state.accountStoppedUntil !== null && state.accountStoppedUntil > state.dbNow) this.holds.note(windowHoldKey(w.name), 'CREDITS_EXHAUSTED', now, until(state.accountStoppedUntil));
    else if (state.pausedUntil !== null && state.pausedUntil > state.dbNow) this.holds.note(windowHoldKey(w.name), state.pauseReason === 'KEY_UNUSABLE' ? 'KEY_UNUSABLE' : 'WINDOW_PAUSED', now, until(state.pausedUntil));
  }

  /**
   * The lease: one call of sluice_lease (cap, fetch, claim, quota, tokens,
   * virtual time, all or nothing, for many tenants), then its rows grouped
   * into calls: the batched jobs of one `call` (many tenants' batch turns may
   * share it) are one batch call (each tenant's items deduplicated), the
   * rest single calls.
   */
  private async lease(w: WindowSpec, pool: number, order: readonly JobClass[], hold: readonly string[]): Promise<Leased | 'busy' | 'changed'> {
    const { sql, catalog, nodeId, leaseMax, leaseSeconds, batchQuantum, leases, onLeased } = this.options;
    const batchMax = this.options.batchMax ?? 1;
    // Wall clock for spans only (the lease's own timing is the database's).
    const leaseStartMs = tracing.on ? Date.now() : 0;
    const { status, rows } = await leaseJobs(sql, {
      window: w.name,
      nodeId,
      pool,
      max: LEASE_CALL_MAX,
      leaseMax,
      classes: order,
      leaseSeconds,
      costs: leaseCosts(catalog),
      hold,
      batch: batchMax > 1 ? leaseBatchSpecs(catalog) : {},
      batchMax,
      batchQuantum,
    });
    // The reservations' leases start inside the call, after any lock it waited on: count from its return.
    const deadline = leases.deadlineFromNow();
    const leasedAt = performance.now();
    if (status !== 'leased') return status;
    const out: Leased = { singles: [], batches: [] };
    // Per batch call (many tenants' turns may share one): the call and its items by tenant and input,
    // so a duplicate finds its item at once. Inputs fold within a tenant only: each tenant is billed
    // for its own items (the lease took a token for each), never for another's.
    const calls = new Map<number, { call: BatchAttempt; byKey: Map<string, BatchAttempt['items'][number]> }>();
    const perClass = new Map<JobClass, number>();
    const leaseFacts = tracing.on ? { window: w.name, pacedPerMinute: this.options.paceOf?.(w) ?? w.pacedPerMinute, pool, jobs: rows.length, startMs: leaseStartMs, endMs: Date.now(), holds: this.holds } : null;
    for (const r of rows) {
      const a: Attempt = {
        queue: r.queue,
        jobClass: r.jobClass,
        job: { id: r.jobId, data: r.data },
        attempt: r.attempt,
        reservationId: r.reservationId,
        credits: r.credits,
        deadline,
        leasedAt,
        abort: new AbortController(),
        sent: false,
        settling: false,
      };
      // A traced job (its data has a traceparent): its wait and lease spans, on this node.
      if (leaseFacts && r.data.tp) a.trace = leaseTrace({ jobId: r.jobId, tenantId: r.tenantId, jobClass: r.jobClass, attempt: r.attempt, credits: r.credits, data: r.data }, leaseFacts);
      leases.add(a);
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
    for (const [jobClass, n] of perClass) onLeased?.(w.name, jobClass, n);
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
    for (const api of probes) if (!sent.has(api)) this.options.breakers.release(api);
    const calls = [...marked.singles.map((a) => this.track(w, [a], () => this.run(w, a))), ...marked.batches.map((b) => this.track(w, attemptsOf({ singles: [], batches: [b] }), () => this.runBatch(w, b)))];
    await Promise.allSettled([...calls, ...unsent]);
  }

  /**
   * The "sent" mark (attempt-leases.ts) for every reservation
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
    // A batch item's duplicates ride on its first attempt: fenced, never marked sent (nor billed on expiry).
    const riders = leased.batches.flatMap((b) => b.items.flatMap((it) => it.attempts.slice(1)));
    const riding = new Set(riders);
    const fenced = await this.options.leases.markSent(all.filter((a) => !riding.has(a)), riders);
    // A rider whose item's first attempt was not marked is not sent either: it must not go upstream unmarked.
    const orphans = new Set(leased.batches.flatMap((b) => b.items.filter((it) => !fenced.has(it.attempts[0]!.reservationId)).flatMap((it) => it.attempts.slice(1).map((a) => a.reservationId))));
    const marked = orphans.size === 0 ? fenced : new Set([...fenced].filter((id) => !orphans.has(id)));
    const notSent = all.filter((a) => !marked.has(a.reservationId));
    const outcome: CallOutcome = { kind: 'server_error', httpStatus: null, creditsBilled: 0, data: null, message: 'not sent: the attempt could not be marked sent', status: null, retryAfterSeconds: 0, latencyMs: 0 };
    const unsent = notSent.map((a) => this.track(w, [a], () => this.options.settler.settle(w, a, outcome, { putBack: true })));
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
    const { leases, settler, timeoutBilling, log } = this.options;
    const left = attempts.filter((a) => !a.settling && leases.has(a.reservationId));
    const message = err instanceof Error ? err.message : String(err);
    log.error({ err, jobs: left.map((a) => ({ jobId: a.job.id, sent: a.sent })) }, 'job run failed unexpectedly: its attempts are settled');
    if (left.length === 0) return;
    for (const a of left) a.abort.abort();
    try {
      await Promise.all(
        left.map((a) => {
          const { outcome, putBack } = unexpectedOutcome(a.sent, a.credits, timeoutBilling, message);
          return settler.settle(w, a, outcome, { putBack });
        }),
      );
    } catch (again) {
      for (const a of left) if (!a.settling) leases.release(a.reservationId);
      log.error({ err: again, jobIds: left.map((a) => a.job.id) }, 'could not settle the attempts of a failed run: left to their leases');
    }
  }

  private async run(w: WindowSpec, a: Attempt): Promise<void> {
    const { breakers, client, settler } = this.options;
    const { api, params } = a.job.data;
    let outcome: CallOutcome;
    try {
      outcome = await breakers.run(api, () =>
        client.call({ api, params, apiKey: w.apiKey, signal: a.abort.signal, onSent: () => void (a.sent = true), ...(a.trace ? { trace: { parent: a.trace.leaseParent } } : {}) }),
      );
    } catch (err) {
      if (!(err instanceof BreakerOpen)) throw err;
      // The breaker opened after this job was leased: no call was made; it waits for the probe.
      await settler.settle(w, a, breakerOpenOutcome(breakers, err), { putBack: true });
      return;
    }
    if (outcome.httpStatus !== null) {
      this.latency.get(w.name)!.record(outcome.latencyMs);
      this.options.onAnswer?.(w, outcome);
    }
    await settler.settle(w, a, outcome);
    if (outcome.httpStatus !== null) this.held.get(w.name)!.record(performance.now() - a.leasedAt);
  }

  /** Calls one batch for its distinct items and settles every attempt from its item's outcome. */
  private async runBatch(w: WindowSpec, b: BatchAttempt): Promise<void> {
    const { breakers, client, settler } = this.options;
    const all = b.items.flatMap((it) => it.attempts);
    // The batch is one call: it stops when any of its attempts' leases is lost.
    const abort = new AbortController();
    for (const a of all) a.abort.signal.addEventListener('abort', () => abort.abort(), { once: true });
    let batch: BatchOutcome | null = null;
    // One call for many jobs: its span starts a trace of its own and links to each traced job's lease.
    const links = tracing.on ? all.flatMap((a) => (a.trace?.leaseParent ? [{ traceparent: a.trace.leaseParent, attributes: { 'sluice.job.id': a.job.id, 'sluice.tenant.id': a.job.data.tenantId } }] : [])) : [];
    try {
      await breakers.run(b.api, async () => {
        batch = await client.callBatch({
          api: b.api,
          items: b.items.map((it, i) => ({ id: String(i), params: it.attempts[0]!.job.data.params })),
          apiKey: w.apiKey,
          signal: abort.signal,
          ...(links.length > 0 ? { trace: { links } } : {}),
          // Only an item's first attempt is sent; its duplicates ride on it and are never billed.
          onSent: () => {
            for (const it of b.items) it.attempts[0]!.sent = true;
          },
        });
        return batch.call;
      });
    } catch (err) {
      if (!(err instanceof BreakerOpen)) throw err;
      const outcome = breakerOpenOutcome(breakers, err);
      await settler.settleBatch(
        w,
        b,
        b.items.map(() => outcome),
        { putBack: true },
      );
      return;
    }
    const result = batch as BatchOutcome | null;
    if (!result) throw new Error('batch call returned nothing');
    const call = result.call;
    if (call.httpStatus !== null) {
      this.latency.get(w.name)!.record(call.latencyMs);
      this.options.onAnswer?.(w, call);
    }
    const outcomes: CallOutcome[] = b.items.map((it, i) => {
      const item = result.items[i];
      // Refused as a whole (or no usable answer): every item shares the call's outcome; a worst-case bill is per item.
      if (!item) return { ...call, creditsBilled: call.creditsBilled > 0 ? it.attempts[0]!.credits : 0 };
      const { id: _id, ...rest } = item;
      return { ...rest, status: call.status, latencyMs: call.latencyMs };
    });
    await settler.settleBatch(w, b, outcomes);
    if (call.httpStatus !== null) this.held.get(w.name)!.record(performance.now() - all[0]!.leasedAt);
  }
}
