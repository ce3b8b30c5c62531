/**
 * The lease's decisions, as a pure model: which jobs of which queues one
 * lease call takes, in which turns. Postgres makes these decisions for real
 * in ONE call (`sluice_lease` and its phases, drizzle/functions/sluice_lease*.sql); this model
 * states the same rules in TypeScript, in the same phases (planPicks), and
 * test/lease-differential.test.ts checks that the two pick the same jobs for
 * the same inputs.
 *
 * Not modelled (the model has no other transactions): the SQL never waits
 * for a queue's row, and a queue whose row another transaction holds (a
 * submission's depth trigger) sits out the call, as if skipped before its
 * first turn; and a queue that becomes ready while the call runs waits for
 * the next call, though it bounds the turn of a queue picked as alone in a
 * paced window, or picked before the call waited for its first tenant row
 * (the SQL reads the next queue's start tag again, ready by the clock).
 * test/lease-queue-locks.test.ts covers the first.
 *
 * One turn at a time, until the call's job budget, the window's room (pool
 * slots) or its tokens run out, or no queue is eligible:
 * - the queue: the first class in the given order (the dispatcher's class
 *   order: starving classes first) with an eligible ready queue, and in it the
 *   smallest virtual time, ties by tenant id (fair.ts pickQueue);
 * - the take: at most LEASE_MAX, the tenant's free cap, the window's room and
 *   tokens, and the quantum to the next queue (items before its virtual time
 *   passes the next queue's, at least one). When the queue's head job's API
 *   batches, a batch turn instead: up to a batch's worth of that API's jobs
 *   (batching.ts batchTake, at most BATCH_QUANTUM x weight and the quantum:
 *   the fair limit holds for batches too, except that a batch turn may take
 *   the API's minimum batch: the extra jobs do not move the clock), one token per
 *   distinct input (per tenant: inputs are never folded across tenants); with
 *   fewer distinct inputs than the API's minimum batch, and no room for them
 *   in the call's open batch of the API, they go as single calls. A batch turn joins the call's open batch of its API while its
 *   items fit (BATCH_MAX and the API's maxSize), so one batch call (one pool
 *   slot) carries many tenants' turns; otherwise it opens the API's next
 *   batch call (a slot);
 * - the quota: the prefix of the jobs whose credits fit on top of what the
 *   period has billed and the tenant has reserved; the first that does not
 *   fit blocks the tenant (policy WAIT) or fails (policy FAIL), and the queue
 *   is done for this call;
 * - a queue that had fewer ready jobs than its take (of any API) has nothing
 *   more for this call;
 * - a queue the call served already ends the call in a paced window (one
 *   round per call), and in any window when it is alone in its class (no next
 *   queue): the dispatcher leases again at once, and the queues that became
 *   ready meanwhile share the rest of the tokens (a burst after idle is not
 *   spent by the tenants visible when it started);
 * - fair share counts jobs: the queue's virtual time advances by the jobs it
 *   took / weight (start + n/w; a batch of 50 costs 50 items), and the class
 *   clock becomes the largest start tag served (the start of a turn's last
 *   job, vtime + (n-1)/w): a queue joining next starts level with it, as
 *   start-time fair queueing's system virtual time. A queue's first turn in a
 *   call starts at its virtual time or the class clock at the call's start,
 *   whichever is later (SFQ's start tag max(v, F)): a queue marked ready while
 *   a concurrent lease was moving the clock read the clock before the move,
 *   and would otherwise be served alone for the gap (seen after idle: a
 *   tenant joining 20 normalised jobs behind took 42 extra jobs in one lease);
 *   the next queue's virtual time counts as at least the clock too.
 *
 * - reserved shares are floors: a tenant with a reserved share r, backlogged,
 *   takes part in the virtual clock with its weight raised to reservedWeight
 *   (below): its share of the class's dispatches is r plus its part of the
 *   rest by weight; idle, it counts nowhere.
 *
 * And what the call leaves behind (the differential test compares it too):
 * the credits reserved and the cap slots taken per tenant; the jobs that show
 * WAITING_QUOTA (the unclaimed jobs of blocked tenants: the block sets the
 * tenant's flag, not its jobs); the ready marks (a queue with nothing pg-boss would hand out
 * keeps a mark only while jobs wait in it, and goes dormant: held by its head
 * job's API when that is held, else scheduled; a blocked tenant's queues keep
 * theirs and go dormant; a queue that claimed its last waiting job goes idle);
 * dormancy (out of the walk, the lift and the reserved totals; queues held
 * for an API the call does not hold wake at the clock); every queue's
 * virtual time after the call, including the lift: once the picks are made,
 * each served class's marked queues lagging its new clock by more than
 * LAG_SLACK are lifted to the clock.
 */
import type { ApiCatalog } from '../config/apis.ts';
import { batchSpec, batchTake, stableStringify } from '../dispatch/batching.ts';
import { fitCount } from './ledger.ts';
import type { JobClass } from '../config/classes.ts';

/** Credits per API for the lease (unknown APIs cost 1). */
export function leaseCosts(catalog: ApiCatalog): Record<string, number> {
  return Object.fromEntries([...catalog.values()].map((s) => [s.name, s.creditCost]));
}

/** The APIs that batch, as [maxSize, minSize] (batching.ts batchSpec). */
export function leaseBatchSpecs(catalog: ApiCatalog): Record<string, [number, number]> {
  const out: Record<string, [number, number]> = {};
  for (const name of catalog.keys()) {
    const spec = batchSpec(catalog, name);
    if (spec) out[name] = [spec.maxSize, spec.minSize];
  }
  return out;
}

export interface LeaseQueue {
  tenantId: string;
  jobClass: JobClass;
  vtime: number;
  /** Has work ready now (sched_queues.ready_at <= now). */
  ready: boolean;
  /** Marked at all (ready_at not null, maybe later than now); default: `ready`. The lift reads it. */
  marked?: boolean;
  /** Scheduled: every job waiting is due later (not due during the call). Dormant: out of the walk, the lift and R/W. */
  scheduled?: boolean;
  /** Held: every due job is for this API, held by an open breaker when a lease looked. Dormant until a call not holding it wakes it. */
  heldApi?: string | null;
}

export interface LeaseTenant {
  tenantId: string;
  weight: number;
  cap: number;
  inFlight: number;
  quota: number;
  /** Credits billed in the current period + reserved by the tenant's open calls. */
  used: number;
  quotaPolicy: 'WAIT' | 'FAIL';
  quotaBlocked: boolean;
  suspended: boolean;
  /** Reserved share, 0 to 1 of the window's dispatches (0 or absent: none). */
  reservedShare?: number;
}

export interface LeaseJob {
  id: string;
  api: string;
  params: Record<string, unknown>;
}

export interface LeaseInput {
  /** Classes in the order to serve them (fair.ts classOrder). */
  classes: readonly JobClass[];
  queues: readonly LeaseQueue[];
  tenants: readonly LeaseTenant[];
  /** Each queue's jobs pg-boss would hand out, in its order; key `${tenantId}/${class}`. */
  jobs: Readonly<Record<string, readonly LeaseJob[]>>;
  /** Whole tokens the window has now (Infinity: no pacer). */
  tokens: number;
  /** Pool slots free: the pool minus the window's in-flight calls. */
  room: number;
  /** Most jobs the call takes. */
  max: number;
  leaseMax: number;
  costs: Readonly<Record<string, number>>;
  /** APIs whose jobs are held (open breakers). */
  hold: readonly string[];
  /** APIs that batch: [maxSize, minSize]. */
  batch: Readonly<Record<string, readonly [number, number]>>;
  batchMax: number;
  batchQuantum: number;
  /** Each class's clock before the call (default 0). */
  clocks?: Partial<Record<JobClass, number>>;
}

export interface LeaseTurn {
  tenantId: string;
  jobClass: JobClass;
  jobIds: string[];
  /** Batched (true) or single calls. */
  batched: boolean;
  /** A batched turn's call: the number (1-based) of the turn that opened it; null for singles. */
  call: number | null;
}

export interface LeasePicks {
  turns: LeaseTurn[];
  /** Jobs failed with QUOTA_EXCEEDED (policy FAIL). */
  failed: string[];
  /** Tenants that now wait for quota (policy WAIT). */
  blocked: string[];
  /** Window pool slots and tokens the call takes. */
  slots: number;
  tokens: number;
  /** Credits the call reserved, per tenant served. */
  reserved: Record<string, number>;
  /** Every tenant's in-flight count after the call. */
  inFlight: Record<string, number>;
  /**
   * Jobs that show WAITING_QUOTA after the call: the unclaimed jobs of the blocked tenants (before
   * the call or by it). Derived, not written: they stay QUEUED, their tenant's flag makes them show
   * it (visibleJobState), so a block writes no job.
   */
  waitingQuota: string[];
  /** Every queue's virtual time after the call (`${tenantId}/${class}`), the lift included. */
  vtimes: Record<string, number>;
  /** Every queue's ready mark after the call (ready_at not null). */
  marked: Record<string, boolean>;
  /**
   * Every queue's dormancy after the call: out of the fair index (its tenant suspended or
   * quota-blocked, scheduled later, or held by a breaker).
   */
  dormant: Record<string, boolean>;
  /** Each class's clock after the call. */
  clocks: Partial<Record<JobClass, number>>;
}

/** The most every tenant's reserved shares may add up to (tenants/store.ts refuses more: the rest of the pace is always shared by weight); backlogged shares read beyond it count as this. */
export const RESERVED_MAX = 0.8;

/**
 * A reserved tenant's weight in the virtual clock while it is backlogged: w + r / (1 - R) x W, R
 * the backlogged reserved shares of its class (at most RESERVED_MAX), W the whole backlogged
 * weight there (reserved tenants' included); any other tenant keeps w. Shares go as the weights,
 * and the weights then sum to W / (1 - R), so each tenant gets r + (1 - R) x w / W of the class's
 * dispatches: its reservation first, the rest by weight, whatever the weights
 * (test/reservation-floors.test.ts holds the lease to that ideal).
 */
export function reservedWeight(weight: number, share: number, reservedSum: number, backloggedWeight: number): number {
  if (!(share > 0)) return weight;
  return weight + (share / (1 - Math.min(reservedSum, RESERVED_MAX))) * backloggedWeight;
}

/** A ready queue lagging its class clock by more than this is lifted to the clock after the call. */
export const LAG_SLACK = 8;

const INT_MAX = 2147483647;

/**
 * The picks of one lease call (pure; see the module comment). The same phases as the SQL, each a
 * named step: the budget (sluice_lease_budget) is the input's tokens and room; then pickQueue
 * (sluice_lease_pick), fetchTurn (sluice_lease_fetch), applyQuota (sluice_lease_quota), recordTurn
 * (the turn in sluice_lease), then commitPicks (sluice_lease_wake, sluice_lease_claim,
 * sluice_lease_commit). The locks (sluice_lease_lock) are not modelled: the
 * model has no other transactions.
 */
export function planPicks(input: LeaseInput): LeasePicks {
  const tenants = new Map(input.tenants.map((t) => [t.tenantId, { ...t }]));
  const queues = input.queues.map((q) => ({ ...q }));
  type Queue = (typeof queues)[number];
  type Tenant = LeaseTenant;
  const left = new Map(Object.entries(input.jobs).map(([k, v]) => [k, [...v]]));
  const out: LeasePicks = { turns: [], failed: [], blocked: [], slots: 0, tokens: 0, reserved: {}, inFlight: {}, waitingQuota: [], vtimes: {}, marked: {}, dormant: {}, clocks: {} };
  const keyOf = (q: { tenantId: string; jobClass: JobClass }) => `${q.tenantId}/${q.jobClass}`;
  // Ready marks, and each queue's waiting jobs as the database counts them during the call (the
  // picks are claimed after the last turn, so they still count until then).
  const marked = new Map(queues.map((q) => [keyOf(q), q.marked ?? q.ready]));
  const depth = new Map(queues.map((q) => [keyOf(q), (input.jobs[keyOf(q)] ?? []).length]));
  const claimed = new Map<string, number>();
  // Dormant work is out of the fair index: the walk, the lift and the reserved totals never see it.
  // A tenant's suspension or quota block is copied to its queues (tenantDormant); a queue with
  // nothing pg-boss would hand out goes scheduled (its jobs due later) or held (its due jobs for a
  // held API).
  const tenantDormant = new Map(queues.map((q) => [keyOf(q), (() => { const t = tenants.get(q.tenantId); return !!t && (t.suspended || t.quotaBlocked); })()]));
  const held = new Map(queues.map((q) => [keyOf(q), q.heldApi ?? null]));
  const scheduled = new Map(queues.map((q) => [keyOf(q), q.scheduled ?? false]));
  const dormant = (key: string) => tenantDormant.get(key)! || scheduled.get(key)! || held.get(key) !== null;
  const served = new Map<JobClass, number>();
  const paced = input.tokens !== Number.POSITIVE_INFINITY;
  const tok = paced ? Math.floor(input.tokens + 1e-9) : INT_MAX;
  const skip = new Set<string>();
  // The call's open batch per API: the call (its first turn's number) and its items so far.
  const open = new Map<string, { call: number; items: number }>();
  const callApi = new Map<number, string>();
  let taken = 0;
  // Reserved shares (sluice_lease_shares): each class's backlogged reserved sum and whole
  // backlogged weight, at the call's start (backlogged: in the fair index, the tenant not
  // suspended, quota-blocked or of weight 0; caps aside).
  const reservedSum = new Map<JobClass, number>();
  const backloggedWeight = new Map<JobClass, number>();
  const backlogged = (t: Tenant) => t.weight > 0 && !t.suspended && !t.quotaBlocked;
  for (const q of queues) {
    const t = tenants.get(q.tenantId);
    if (!t || !q.ready || dormant(keyOf(q)) || !backlogged(t)) continue;
    const r = t.reservedShare ?? 0;
    if (r > 0) reservedSum.set(q.jobClass, (reservedSum.get(q.jobClass) ?? 0) + r);
    backloggedWeight.set(q.jobClass, (backloggedWeight.get(q.jobClass) ?? 0) + t.weight);
  }
  // A tenant's eligibility (sluice_tenant_eligible) and a queue's (in the fair index, not skipped).
  const tenantEligible = (t: Tenant) => backlogged(t) && t.inFlight < t.cap;
  const eligible = (q: Queue) => {
    const t = tenants.get(q.tenantId);
    return !!t && q.ready && !dormant(keyOf(q)) && tenantEligible(t) && !skip.has(keyOf(q));
  };

  /** The front queue of the first class with an eligible one, and the queue after it. */
  const pickQueue = (): { q: Queue; next: Queue | undefined } | undefined => {
    for (const c of input.classes) {
      const inClass = queues.filter((x) => x.jobClass === c && eligible(x));
      inClass.sort((a, b) => a.vtime - b.vtime || (a.tenantId < b.tenantId ? -1 : a.tenantId > b.tenantId ? 1 : 0));
      if (inClass.length > 0) return { q: inClass[0]!, next: inClass[1] };
    }
    return undefined;
  };

  /**
   * The take and the turn's jobs; a queue with nothing to hand out goes dormant (null). `exhausted`:
   * fewer ready jobs than the take (of any API), nothing more for this call after this turn.
   */
  const fetchTurn = (key: string, t: Tenant, weight: number, quantum: number, hasNext: boolean) => {
    let take = Math.max(1, Math.min(input.leaseMax, input.max - taken, input.room - out.slots, tok - out.tokens, t.cap - t.inFlight, quantum));
    const ready = (left.get(key) ?? []).filter((j) => !input.hold.includes(j.api));
    let batched = false;
    let head: string | undefined;
    if (input.batchMax > 1) {
      head = ready[0]?.api;
      const spec = head === undefined ? undefined : input.batch[head];
      if (spec) {
        batched = true;
        const batchMost = batchTake({ tokens: tok - out.tokens, batchMax: input.batchMax, apiMaxSize: spec[0], capFree: t.cap - t.inFlight, singleTake: take });
        // Capped at the fair limit too (the quantum to the next queue), so a pause's accumulated
        // tokens are not one tenant's and no tenant runs ahead of its turn: the next tenants' turns
        // join the same batch call, so the cap costs no call. An unpaced window has no tokens to
        // share and leases as much as its pool has room for: there a batch turn may take the
        // API's minimum batch (tenants tied in virtual time take their 2 jobs in one turn, not
        // two, which halves the lease's statements per job); those extra jobs do not move the
        // class clock (recordTurn).
        const fairLimit = paced ? quantum : Math.max(quantum, spec[1]);
        take = Math.max(take, Math.min(batchMost, Math.floor(input.batchQuantum * weight), fairLimit), 1);
        take = Math.min(take, input.max - taken);
      }
    }
    let jobs = ready.filter((j) => !batched || j.api === head).slice(0, take);
    const exhausted = jobs.length < take && !batched;
    if (jobs.length === 0) {
      // Nothing to hand out: while jobs wait, dormant (held by the API of its head job when that
      // is held, else scheduled for when its earliest job is due), its mark kept; otherwise idle.
      const waiting = depth.get(key)! > 0;
      const headApi = left.get(key)?.[0]?.api;
      marked.set(key, waiting);
      held.set(key, waiting && headApi !== undefined && input.hold.includes(headApi) ? headApi : null);
      scheduled.set(key, waiting && held.get(key) === null);
      return null;
    }
    if (batched) {
      // Too few distinct inputs for a batch call of their own and no room in the call's open one:
      // single calls. But in a paced window, with another queue in the class whose turns could
      // join it, the turn opens the call even below the API's minimum batch (the fair limit keeps
      // turns small there; the next turns fill the call).
      const distinct = new Set(jobs.map((j) => stableStringify(j.params))).size;
      const b = open.get(head!);
      const fits = !!b && b.items + distinct <= Math.min(input.batchMax, input.batch[head!]![0]);
      if (distinct < input.batch[head!]![1] && !fits && (!paced || !hasNext)) batched = false;
    }
    if (!batched) jobs = jobs.slice(0, Math.min(input.room - out.slots, tok - out.tokens));
    return { jobs, batched, head, exhausted };
  };

  /** The prefix of the jobs whose credits fit; the first that does not blocks (WAIT) or fails (FAIL). */
  const applyQuota = (key: string, t: Tenant, jobs: LeaseJob[]) => {
    const costs = jobs.map((j) => input.costs[j.api] ?? 1);
    // t.used is billed + reserved: the quota's prefix rule (ledger.ts), as the SQL applies it.
    const fit = fitCount(t.used, 0, t.quota, costs);
    if (fit < jobs.length) {
      const over = jobs[fit]!;
      if (t.quotaPolicy === 'FAIL') {
        out.failed.push(over.id);
        left.set(key, left.get(key)!.filter((j) => j.id !== over.id));
        depth.set(key, depth.get(key)! - 1);
      } else {
        t.quotaBlocked = true;
        out.blocked.push(t.tenantId);
        // Its queues go dormant (marks kept): the renewal brings them back.
        for (const x of queues) if (x.tenantId === t.tenantId) tenantDormant.set(keyOf(x), true);
      }
      skip.add(key);
    }
    return { jobs: jobs.slice(0, fit), costs: costs.slice(0, fit) };
  };

  /** The turn: the pool, the picks, the class clock, the queue's virtual time, the tenant's counts. */
  const recordTurn = (q: Queue, t: Tenant, start: number, weight: number, quantum: number, jobs: LeaseJob[], costs: number[], batched: boolean, head: string | undefined) => {
    const key = keyOf(q);
    const ids = new Set(jobs.map((j) => j.id));
    left.set(key, left.get(key)!.filter((j) => !ids.has(j.id)));
    const turnNo = out.turns.length + 1;
    let call: number | null = null;
    if (batched) {
      // The call's open batch of this API takes the turn's items while they fit (one call, one
      // slot, any tenants); else the turn opens a batch call of its own (a slot).
      const items = new Set(jobs.map((j) => stableStringify(j.params))).size;
      const b = open.get(head!);
      if (b && b.items + items <= Math.min(input.batchMax, input.batch[head!]![0])) b.items += items;
      else {
        open.set(head!, { call: turnNo, items });
        callApi.set(turnNo, head!);
        out.slots += 1;
      }
      call = open.get(head!)!.call;
      out.tokens += items;
    } else {
      out.slots += jobs.length;
      out.tokens += jobs.length;
    }
    out.turns.push({ tenantId: t.tenantId, jobClass: q.jobClass, jobIds: jobs.map((j) => j.id), batched, call });
    // The clock is the start tag of the last job served in fair order (the turn's last, not its
    // first; a batch turn of an unpaced window may take more than its fair limit, and those jobs
    // are served ahead of their turn: they do not move the clock).
    const inOrder = Math.min(jobs.length, quantum);
    served.set(q.jobClass, Math.max(served.get(q.jobClass) ?? Number.NEGATIVE_INFINITY, start + (inOrder - 1) / weight));
    claimed.set(key, (claimed.get(key) ?? 0) + jobs.length);
    const cost = costs.reduce((a, b) => a + b, 0);
    out.reserved[t.tenantId] = (out.reserved[t.tenantId] ?? 0) + cost;
    q.vtime = start + jobs.length / weight;
    t.used += cost;
    t.inFlight += jobs.length;
    taken += jobs.length;
  };

  /** After the last turn: the lone batch calls, the claims, the due check, the clocks and the lift. */
  const commitPicks = () => {
    // A paced window's batch call that got one job only (a turn below the API's minimum that no
    // other turn joined) goes as a single call: the same slot and token, no batch for one item.
    if (paced) {
      const jobsOfCall = new Map<number, number>();
      for (const x of out.turns) if (x.call !== null) jobsOfCall.set(x.call, (jobsOfCall.get(x.call) ?? 0) + x.jobIds.length);
      for (const x of out.turns) {
        if (x.call !== null && jobsOfCall.get(x.call) === 1 && input.batch[callApi.get(x.call)!]![1] > 1) {
          x.batched = false;
          x.call = null;
        }
      }
    }
    // The claims: a queue that claimed its last waiting job goes idle.
    for (const [key, n] of claimed) {
      depth.set(key, depth.get(key)! - n);
      if (depth.get(key) === 0) marked.set(key, false);
    }
    // The due check: queues held for an API this call does not hold come back at the class clock
    // (the clock before the call: this call has not moved it yet). (A scheduled queue in the model
    // is never due during the call.)
    for (const q of queues) {
      const h = held.get(keyOf(q));
      if (h !== null && h !== undefined && !input.hold.includes(h)) {
        held.set(keyOf(q), null);
        q.vtime = Math.max(q.vtime, input.clocks?.[q.jobClass] ?? 0);
      }
    }
    for (const x of input.classes) {
      const before = input.clocks?.[x] ?? 0;
      out.clocks[x] = served.has(x) ? Math.max(before, served.get(x)!) : before;
    }
    // The lift: each served class's marked queues lagging its new clock by more than LAG_SLACK.
    for (const q of queues) {
      const clock = out.clocks[q.jobClass];
      const key = keyOf(q);
      if (served.has(q.jobClass) && clock !== undefined && marked.get(key) && !dormant(key) && q.vtime < clock - LAG_SLACK) q.vtime = clock;
      out.vtimes[key] = q.vtime;
      out.marked[key] = marked.get(key)!;
      out.dormant[key] = dormant(key);
    }
    for (const t of tenants.values()) out.inFlight[t.tenantId] = t.inFlight;
    // Blocked before the call or by it (t.quotaBlocked is set as the call blocks).
    const blocked = new Set([...tenants.values()].filter((t) => t.quotaBlocked).map((t) => t.tenantId));
    const claimedIds = new Set(out.turns.flatMap((x) => x.jobIds));
    for (const [key, jobs] of Object.entries(input.jobs)) {
      if (blocked.has(key.slice(0, key.indexOf('/')))) for (const j of jobs) if (!claimedIds.has(j.id) && !out.failed.includes(j.id)) out.waitingQuota.push(j.id);
    }
  };

  while (taken < input.max && out.slots < input.room && out.tokens < tok) {
    const pick = pickQueue();
    if (!pick) break;
    const { q, next } = pick;
    const t = tenants.get(q.tenantId)!;
    const key = keyOf(q);
    // Served already in this call: in a paced window the round is over, and alone in its class in
    // any window; the call ends, and the next call (at once) shares what is left of the tokens
    // with the queues that became ready meanwhile (the burst after idle).
    if ((!next || paced) && claimed.has(key)) break;
    // A queue's turn starts no earlier than the class clock at the call's start (SFQ's start tag
    // max(v, F)): one marked ready at a clock a concurrent lease was moving, or passed over in
    // earlier calls, gets no credit for the gap. A queue served in this call is past it already.
    const clock0 = input.clocks?.[q.jobClass] ?? 0;
    const start = claimed.has(key) ? q.vtime : Math.max(q.vtime, clock0);
    const weight = reservedWeight(t.weight, t.reservedShare ?? 0, reservedSum.get(q.jobClass) ?? 0, backloggedWeight.get(q.jobClass) ?? 0);
    const quantum = next ? Math.max(1, Math.floor((Math.max(next.vtime, clock0) - start) * weight) + 1) : INT_MAX;
    const fetched = fetchTurn(key, t, weight, quantum, next !== undefined);
    if (!fetched) {
      skip.add(key);
      continue;
    }
    const { jobs, costs } = applyQuota(key, t, fetched.jobs);
    if (jobs.length === 0) continue;
    recordTurn(q, t, start, weight, quantum, jobs, costs, fetched.batched, fetched.head);
    if (fetched.exhausted) skip.add(key);
  }
  commitPicks();
  return out;
}
