/**
 * Property tests (fast-check) for the scheduler's pure decision logic: fair
 * order (fair.ts), the pacer's token bucket (pacer.ts), Little's-law pools
 * (pool.ts), the credit ledger rules (ledger.ts) and settlement (retry.ts).
 * No database: the dispatch loop that production runs against rows in
 * Postgres (store.ts) is modelled here in memory, built only from the
 * exported pure functions.
 *
 * Every fc.assert has a fixed seed, so a run is deterministic; a failure
 * prints the seed, the path and the shrunk counterexample.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { CLASSES, type JobClass } from '../src/config/classes.ts';
import { activationVtime, advance, classOrder, eligible, pickQueue, type Pick, type QueueCandidate } from '../src/scheduler/fair.ts';
import { msUntilTokens, takeable, tokensAt, type BucketState } from '../src/scheduler/pacer.ts';
import { planWindows } from '../src/scheduler/windows.ts';
import { LatencyTracker, poolSize } from '../src/scheduler/pool.ts';
import { billedCredits, fitCount } from '../src/scheduler/ledger.ts';
import { planSettlement, retryDelaySeconds } from '../src/dispatch/retry.ts';
import { reactionTo } from '../src/provider/classify.ts';
import type { CallOutcome, OutcomeKind } from '../src/provider/types.ts';

const SEED = 20_260_611;
const EPS = 1e-9;
const BIG = 1_000_000_000;
const run = (numRuns: number) => ({ seed: SEED, numRuns });

/* ------------------------------------------------------------------ */
/* The simulation harness: the dispatch loop of store.ts + dispatcher.ts */
/* ------------------------------------------------------------------ */

interface SimTenant {
  id: string;
  weight: number;
  cap: number;
  /** Ticks a call takes: an item dispatched at tick t frees its slot at t + latency. */
  latency: number;
  inFlight: number;
  quotaBlocked: boolean;
  due: number[];
}

interface SimQueue {
  tenant: SimTenant;
  jobClass: JobClass;
  vtime: number;
  /** Arrival ticks of the queued jobs, FIFO from `head`. */
  jobs: number[];
  head: number;
  /** sched_queues.ready_at is set (and due): the queue is among the ready queues sluice_lease orders. */
  ready: boolean;
  served: number;
}

interface SimOptions {
  /** A per-class candidate LIMIT (the lease before sluice_lease read 32; sluice_lease reads on past ineligible queues). Default: every busy queue is a candidate. */
  perClass?: number;
  /** Activate a queue that becomes busy at the class clock (activationVtime); false = naive model. */
  activate?: boolean;
  /** A quota block clears the tenant's queues' ready_at, so unblocking activates them (production); false = the old behaviour. */
  clearReadyOnQuotaBlock?: boolean;
}

interface Step {
  pick: Pick | null;
  queue: SimQueue | null;
  items: number;
  /** Waits (ticks) of the jobs served in this step. */
  waits: number[];
}

const backlog = (q: SimQueue) => q.jobs.length - q.head;

class FairSim {
  now = 0;
  picks = 0;
  readonly clock: Record<JobClass, number> = { INTERACTIVE: 0, STANDARD: 0, BULK: 0 };
  readonly tenants: SimTenant[] = [];
  readonly queues: SimQueue[] = [];
  private readonly byKey = new Map<string, SimQueue>();
  private readonly o: Required<SimOptions>;

  constructor(options: SimOptions = {}) {
    this.o = { perClass: Number.POSITIVE_INFINITY, activate: true, clearReadyOnQuotaBlock: true, ...options };
  }

  tenant(id: string, weight: number, cap = BIG, latency = 1): SimTenant {
    const t: SimTenant = { id, weight, cap, latency, inFlight: 0, quotaBlocked: false, due: [] };
    this.tenants.push(t);
    return t;
  }

  queue(tenant: SimTenant, jobClass: JobClass = 'STANDARD', vtime = 0): SimQueue {
    const q: SimQueue = { tenant, jobClass, vtime, jobs: [], head: 0, ready: false, served: 0 };
    this.queues.push(q);
    this.byKey.set(`${tenant.id}/${jobClass}`, q);
    return q;
  }

  /** submitJobs → markQueuesReady: a queue that was not ready joins at the class clock. */
  submit(q: SimQueue, n: number): void {
    for (let i = 0; i < n; i++) q.jobs.push(this.now);
    if (n > 0) this.markReady(q);
  }

  private markReady(q: SimQueue): void {
    if (q.ready || backlog(q) === 0) return;
    if (this.o.activate) q.vtime = activationVtime(q.vtime, this.clock[q.jobClass]);
    q.ready = true;
  }

  /** Quota WAIT in sluice_lease: production clears the tenant's queues' ready_at. */
  blockQuota(t: SimTenant): void {
    t.quotaBlocked = true;
    if (this.o.clearReadyOnQuotaBlock) for (const q of this.queues) if (q.tenant === t) q.ready = false;
  }

  /** unblockQuota → markQueuesReady for the tenant's classes with work. */
  unblockQuota(t: SimTenant): void {
    t.quotaBlocked = false;
    for (const q of this.queues) if (q.tenant === t) this.markReady(q);
  }

  /** The lease's pick (sluice_lease): per class, the ready queues with the smallest virtual times. */
  candidates(): QueueCandidate[] {
    const out: QueueCandidate[] = [];
    for (const jobClass of CLASSES) {
      const rows = this.queues
        // Eligibility is filtered before the LIMIT, as in production.
        .filter((q) => q.jobClass === jobClass && q.ready && backlog(q) > 0 && !q.tenant.quotaBlocked && q.tenant.inFlight < q.tenant.cap)
        .sort((a, b) => a.vtime - b.vtime)
        .slice(0, this.o.perClass);
      for (const q of rows) {
        out.push({
          tenantId: q.tenant.id,
          jobClass,
          vtime: q.vtime,
          weight: q.tenant.weight,
          inFlight: q.tenant.inFlight,
          cap: q.tenant.cap,
          quotaBlocked: q.tenant.quotaBlocked,
        });
      }
    }
    return out;
  }

  /** When each class was last served (sched_classes.served_at). */
  readonly lastServed: Partial<Record<JobClass, number>> = {};

  /** oldestWaitByClass: the oldest ready job's age, but no more than the time since the class was last served. */
  oldestWaitMs(): Partial<Record<JobClass, number>> {
    const out: Partial<Record<JobClass, number>> = {};
    for (const q of this.queues) {
      if (!q.ready || backlog(q) === 0) continue;
      const age = this.now - Math.max(q.jobs[q.head]!, this.lastServed[q.jobClass] ?? Number.NEGATIVE_INFINITY);
      out[q.jobClass] = Math.max(out[q.jobClass] ?? 0, age);
    }
    return out;
  }

  /** One dispatch decision, then time moves on by one tick. Checks the cap invariants on every call. */
  step(order: readonly JobClass[], maxTake: number): Step {
    for (const t of this.tenants) {
      const still = t.due.filter((d) => d > this.now);
      t.inFlight -= t.due.length - still.length;
      t.due = still;
    }
    const candidates = this.candidates();
    const pick = pickQueue(candidates, order, maxTake);
    let result: Step = { pick, queue: null, items: 0, waits: [] };
    if (pick === null) {
      // Work-conserving: nothing is picked only when nothing in `order` may run.
      assert.ok(!candidates.some((c) => order.includes(c.jobClass) && eligible(c)), 'an eligible queue was passed over');
    } else {
      const q = this.byKey.get(`${pick.queue.tenantId}/${pick.queue.jobClass}`)!;
      const t = q.tenant;
      // I3 and the pick's contract.
      assert.ok(eligible(pick.queue), 'picked an ineligible queue');
      assert.ok(!t.quotaBlocked && t.inFlight < t.cap);
      assert.ok(Number.isInteger(pick.take) && pick.take >= 1 && pick.take <= maxTake, `take ${pick.take} of ${maxTake}`);
      assert.ok(t.inFlight + pick.take <= t.cap, `take ${pick.take} passes the cap ${t.cap} at ${t.inFlight} in flight`);
      const items = Math.min(pick.take, backlog(q));
      // sluice_lease: the class clock becomes the served-at virtual time.
      this.clock[q.jobClass] = Math.max(this.clock[q.jobClass], q.vtime);
      q.vtime = advance(q.vtime, items, t.weight);
      t.inFlight += items;
      for (let i = 0; i < items; i++) t.due.push(this.now + t.latency);
      const waits = q.jobs.slice(q.head, q.head + items).map((a) => this.now - a);
      q.head += items;
      q.served += items;
      this.lastServed[q.jobClass] = this.now;
      if (backlog(q) === 0) q.ready = false;
      assert.ok(t.inFlight <= t.cap, 'I3: in-flight passed the cap');
      result = { pick, queue: q, items, waits };
      this.picks++;
    }
    this.now++;
    return result;
  }
}

const cycle = <T>(xs: readonly T[], i: number): T => xs[i % xs.length]!;
const sum = (xs: readonly number[]) => xs.reduce((s, x) => s + x, 0);

/**
 * Runs 300 picks after queue `x` (re)joins a class of always-busy queues and
 * measures, over every prefix, how far x's items stray from its weighted share
 * w_x / W of all items. Bound: with all busy vtimes within D of each other
 * (D ≤ max(2, maxTake) / w_min: one item past the next queue, or a lone
 * queue's whole batch), x's items after joining at the class clock stay within
 * 2·w_x·D of its share.
 */
function windowAfterJoin(sim: FairSim, x: SimQueue, W: number, wMin: number, takes: readonly number[], from: number) {
  const wX = x.tenant.weight;
  const slack = (2 * wX * Math.max(2, ...takes)) / wMin;
  let total = 0;
  let fromX = 0;
  let worstExcess = Number.NEGATIVE_INFINITY;
  let worstDeficit = Number.NEGATIVE_INFINITY;
  for (let k = 0; k < 300; k++) {
    const s = sim.step(['STANDARD'], cycle(takes, from + k));
    total += s.items;
    if (s.queue === x) fromX += s.items;
    worstExcess = Math.max(worstExcess, fromX - (wX * total) / W);
    worstDeficit = Math.max(worstDeficit, (wX * total) / W - fromX);
  }
  return { worstExcess, worstDeficit, slack };
}

/* ------------------------------------------------------------------ */
/* Fair order: pickQueue, classOrder, advance, activationVtime         */
/* ------------------------------------------------------------------ */

const jobClassArb = fc.constantFrom<JobClass>(...CLASSES);

const candidatesArb = fc
  .uniqueArray(
    fc.record({
      tenant: fc.integer({ min: 0, max: 7 }),
      jobClass: jobClassArb,
      // Small integers make ties (broken by tenant id) common.
      vtime: fc.oneof(fc.integer({ min: 0, max: 3 }), fc.double({ min: 0, max: 20, noNaN: true, noDefaultInfinity: true })),
      weight: fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 1, max: 10 }) }, { weight: 1, arbitrary: fc.constantFrom(0, 0.5, 2.5) }),
      cap: fc.integer({ min: 0, max: 10 }),
      inFlight: fc.integer({ min: 0, max: 10 }),
      quotaBlocked: fc.oneof({ weight: 3, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    }),
    { selector: (r) => `${r.tenant}/${r.jobClass}`, maxLength: 12 },
  )
  .map((rows) =>
    rows.map(
      (r): QueueCandidate => ({
        tenantId: `t${r.tenant}`,
        jobClass: r.jobClass,
        vtime: r.vtime,
        weight: r.weight,
        cap: r.cap,
        inFlight: r.inFlight,
        quotaBlocked: r.quotaBlocked,
      }),
    ),
  );

const orderArb = fc.subarray([...CLASSES]).chain((cs) => fc.shuffledSubarray(cs, { minLength: cs.length, maxLength: cs.length }));

describe('fair order: pickQueue on arbitrary candidates', () => {
  test('picks the smallest virtual time of the first class with an eligible queue; take respects maxTake, the cap and the quantum', () => {
    fc.assert(
      fc.property(candidatesArb, orderArb, fc.integer({ min: -1, max: 10 }), (cands, order, maxTake) => {
        const pick = pickQueue(cands, order, maxTake);
        const firstClass = order.find((c) => cands.some((q) => q.jobClass === c && eligible(q)));
        if (maxTake < 1 || firstClass === undefined) {
          assert.equal(pick, null);
          return;
        }
        assert.ok(pick !== null);
        const q = pick.queue;
        assert.ok(cands.includes(q), 'the pick is one of the candidates');
        assert.equal(q.jobClass, firstClass);
        assert.ok(eligible(q) && !q.quotaBlocked && q.inFlight < q.cap && q.weight > 0);
        const rivals = cands.filter((c) => c.jobClass === firstClass && eligible(c) && c !== q);
        for (const r of rivals) assert.ok(q.vtime < r.vtime || (q.vtime === r.vtime && q.tenantId < r.tenantId), 'smallest vtime, ties by tenant id');
        assert.ok(Number.isInteger(pick.take) && pick.take >= 1 && pick.take <= maxTake);
        assert.ok(q.inFlight + pick.take <= q.cap, 'the cap is never exceeded');
        // The quantum: at most one item past the next queue's virtual time.
        const next = Math.min(...rivals.map((r) => r.vtime));
        if (rivals.length > 0) assert.ok(advance(q.vtime, pick.take, q.weight) <= next + 1 / q.weight + EPS);
        // ...and no smaller than needed to reach it (unless maxTake or the cap bind first).
        if (rivals.length > 0 && pick.take < Math.min(maxTake, q.cap - q.inFlight)) {
          assert.ok(advance(q.vtime, pick.take, q.weight) > next - EPS, 'the quantum lets the queue catch up with the next one');
        }
      }),
      run(3000),
    );
  });

  test('every node makes the same choice: the pick does not depend on the candidates’ order', () => {
    fc.assert(
      fc.property(
        candidatesArb.chain((c) => fc.tuple(fc.constant(c), fc.shuffledSubarray(c, { minLength: c.length, maxLength: c.length }))),
        orderArb,
        fc.integer({ min: 1, max: 10 }),
        ([a, b], order, maxTake) => {
          const pa = pickQueue(a, order, maxTake);
          const pb = pickQueue(b, order, maxTake);
          assert.deepEqual(pa && { id: pa.queue.tenantId, c: pa.queue.jobClass, take: pa.take }, pb && { id: pb.queue.tenantId, c: pb.queue.jobClass, take: pb.take });
        },
      ),
      run(1000),
    );
  });

  test('advance adds items/weight and composes; activationVtime is the later of the two and idempotent', () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0, max: 1e6, noNaN: true }),
        fc.integer({ min: 0, max: 100 }),
        fc.integer({ min: 0, max: 100 }),
        fc.integer({ min: 1, max: 10 }),
        fc.double({ min: 0, max: 1e6, noNaN: true }),
        (v, a, b, w, clock) => {
          const once = advance(v, a + b, w);
          const twice = advance(advance(v, a, w), b, w);
          assert.ok(Math.abs(once - twice) <= 1e-9 * Math.max(1, v));
          assert.ok(advance(v, a + 1, w) > advance(v, a, w), 'serving strictly advances the virtual time');
          const act = activationVtime(v, clock);
          assert.ok(act >= v && act >= clock && (act === v || act === clock));
          assert.equal(activationVtime(act, clock), act);
        },
      ),
      run(500),
    );
  });
});

describe('fair order: simulated dispatch loop', () => {
  const weightsArb = fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 2, maxLength: 6 });
  const takesArb = fc.array(fc.integer({ min: 1, max: 8 }), { minLength: 1, maxLength: 40 });

  test('shares converge to the weights (always backlogged, caps not binding)', () => {
    fc.assert(
      fc.property(weightsArb, takesArb, (weights, takes) => {
        const sim = new FairSim();
        const qs = weights.map((w, i) => sim.queue(sim.tenant(`t${i}`, w)));
        for (const q of qs) sim.submit(q, 2_100);
        const W = sum(weights);
        const wMin = Math.min(...weights);
        let total = 0;
        for (let i = 0; total < 2_000; i++) {
          total += sim.step(['STANDARD'], cycle(takes, i)).items;
          // Busy virtual times stay within one item of the lightest weight...
          const vs = qs.map((q) => q.vtime);
          assert.ok(Math.max(...vs) - Math.min(...vs) <= 1 / wMin + EPS, `virtual times spread ${Math.max(...vs) - Math.min(...vs)}`);
          // ...so at every moment each tenant is within w_i / w_min items of its exact share.
          qs.forEach((q, j) => {
            const exact = (weights[j]! * total) / W;
            assert.ok(Math.abs(q.served - exact) <= weights[j]! / wMin + 1e-6, `tenant ${j}: ${q.served} vs ${exact}`);
          });
        }
        qs.forEach((q, j) => assert.ok(Math.abs(q.served / total - weights[j]! / W) <= 0.01, `share ${q.served / total} vs ${weights[j]! / W}`));
      }),
      run(60),
    );
  });

  test('with binding caps: never over a cap, spare capacity goes to the others, who still share by weight', () => {
    let runs = 0;
    let bindingRuns = 0;
    fc.assert(
      fc.property(
        fc.array(
          fc.record({ weight: fc.integer({ min: 1, max: 5 }), capped: fc.boolean(), cap: fc.integer({ min: 1, max: 3 }), latency: fc.integer({ min: 2, max: 15 }) }),
          { minLength: 2, maxLength: 6 },
        ),
        takesArb,
        (specs, takes) => {
          fc.pre(specs.some((s) => s.capped) && specs.some((s) => !s.capped));
          const sim = new FairSim();
          const qs = specs.map((s, i) => sim.queue(sim.tenant(`t${i}`, s.weight, s.capped ? s.cap : BIG, s.latency)));
          for (const q of qs) sim.submit(q, 12_000);
          const capped = qs.filter((q) => q.tenant.cap < BIG);
          const free = qs.filter((q) => q.tenant.cap === BIG);
          const wMinFree = Math.min(...free.map((q) => q.tenant.weight));
          const norm = (q: SimQueue) => q.served / q.tenant.weight;
          let cappedBound = false;
          for (let i = 0; i < 1_500; i++) {
            const s = sim.step(['STANDARD'], cycle(takes, i));
            assert.ok(s.pick !== null, 'work-conserving: uncapped tenants can always be served');
            for (const a of free) for (const b of free) assert.ok(norm(a) - norm(b) <= 1 / wMinFree + EPS, 'uncapped tenants share by weight');
            for (const c of capped) {
              if (c.tenant.inFlight === c.tenant.cap) cappedBound = true;
              for (const u of free) assert.ok(norm(c) <= norm(u) + 1 / c.tenant.weight + EPS, 'a capped tenant never gets more than its weighted share');
            }
          }
          runs++;
          if (cappedBound) bindingRuns++;
        },
      ),
      run(40),
    );
    assert.ok(bindingRuns >= runs / 2, `the caps bound in only ${bindingRuns} of ${runs} runs`);
  });

  test('no tenant starves: a backlogged tenant waits at most sum over others of (floor(w_j / w_min) + 1) picks', () => {
    fc.assert(
      fc.property(weightsArb, takesArb, (weights, takes) => {
        const sim = new FairSim();
        const qs = weights.map((w, i) => sim.queue(sim.tenant(`t${i}`, w)));
        for (const q of qs) sim.submit(q, 20_000);
        const wMin = Math.min(...weights);
        const bound = weights.map((_, i) => sum(weights.map((w, j) => (j === i ? 0 : Math.floor(w / wMin) + 1))));
        const waiting = weights.map(() => 0);
        for (let i = 0; i < 1_500; i++) {
          const s = sim.step(['STANDARD'], cycle(takes, i));
          qs.forEach((q, j) => {
            waiting[j] = s.queue === q ? 0 : waiting[j]! + 1;
            assert.ok(waiting[j]! <= bound[j]!, `tenant ${j} (weight ${weights[j]}) waited ${waiting[j]} picks, bound ${bound[j]}`);
          });
        }
      }),
      run(60),
    );
  });

  test('a newly active tenant is not owed its idle time (and the naive model that keeps its old vtime is)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 1, maxLength: 5 }),
        fc.integer({ min: 1, max: 5 }),
        fc.integer({ min: 0, max: 30 }),
        takesArb,
        (others, wX, early, takes) => {
          const runModel = (activate: boolean) => {
            const sim = new FairSim({ activate });
            const qs = others.map((w, i) => sim.queue(sim.tenant(`o${i}`, w)));
            for (const q of qs) sim.submit(q, 20_000);
            const x = sim.queue(sim.tenant('x', wX));
            sim.submit(x, early);
            let i = 0;
            for (; i < 1_000; i++) sim.step(['STANDARD'], cycle(takes, i));
            assert.equal(backlog(x), 0, 'x went idle');
            sim.submit(x, 20_000);
            return windowAfterJoin(sim, x, sum(others) + wX, Math.min(wX, ...others), takes, i);
          };
          const fair = runModel(true);
          assert.ok(fair.worstExcess <= fair.slack + 1e-6, `x got ${fair.worstExcess} items over its share (slack ${fair.slack})`);
          assert.ok(fair.worstDeficit <= fair.slack + 1e-6, `x got ${fair.worstDeficit} items under its share (slack ${fair.slack})`);
          const naive = runModel(false);
          assert.ok(naive.worstExcess > naive.slack, `the naive model should over-serve x (excess ${naive.worstExcess})`);
        },
      ),
      run(40),
    );
  });
});

describe('classes: strict order with a starvation guard', () => {
  const waitsArb = fc.record({
    INTERACTIVE: fc.option(fc.integer({ min: 0, max: 100 }), { nil: undefined }),
    STANDARD: fc.option(fc.integer({ min: 0, max: 100 }), { nil: undefined }),
    BULK: fc.option(fc.integer({ min: 0, max: 100 }), { nil: undefined }),
  });

  test('classOrder: a permutation; starving classes (oldest wait > max wait) first, oldest first; then by rank', () => {
    fc.assert(
      fc.property(fc.subarray([...CLASSES]), waitsArb, waitsArb, (classes, oldest, maxWait) => {
        const clean = <T extends object>(o: T) => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<Record<JobClass, number>>;
        const ow = clean(oldest);
        const mw = clean(maxWait);
        const order = classOrder(classes, ow, mw);
        assert.deepEqual([...order].sort(), [...classes].sort());
        const starving = (c: JobClass) => ow[c] !== undefined && mw[c] !== undefined && ow[c] > mw[c];
        const rank = (c: JobClass) => CLASSES.indexOf(c);
        const k = order.filter(starving).length;
        assert.ok(order.slice(0, k).every(starving) && !order.slice(k).some(starving), 'starving classes come first');
        for (let i = 1; i < k; i++) assert.ok(ow[order[i - 1]!]! >= ow[order[i]!]!, 'oldest wait first');
        for (let i = k + 1; i < order.length; i++) assert.ok(rank(order[i - 1]!) < rank(order[i]!), 'the rest in rank order');
      }),
      run(2000),
    );
  });

  test('a lower class is served only when starving, and gets a turn at least every max wait + 1 ticks, under steady INTERACTIVE work', () => {
    fc.assert(
      fc.property(
        fc.constantFrom<JobClass>('STANDARD', 'BULK'),
        fc.integer({ min: 0, max: 30 }),
        fc.array(fc.boolean(), { minLength: 50, maxLength: 300 }),
        fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 1, maxLength: 10 }),
        (lower, maxWait, arrivals, takes) => {
          const sim = new FairSim();
          const hi = sim.queue(sim.tenant('i', 3), 'INTERACTIVE');
          sim.submit(hi, 5_000);
          const lo = sim.queue(sim.tenant('l', 1), lower);
          const classes: JobClass[] = ['INTERACTIVE', lower];
          let arrived = 0;
          // The lower class gets a turn at least once per max wait while it has ready work.
          let waitingSince: number | null = null;
          const horizon = arrivals.length + (maxWait + 2) * (arrivals.length + 1);
          for (let t = 0; t < horizon && (t < arrivals.length || lo.served < arrived); t++) {
            if (arrivals[t]) {
              sim.submit(lo, 1);
              arrived++;
            }
            if (waitingSince === null && lo.jobs.length > lo.head) waitingSince = sim.now;
            const oldest = sim.oldestWaitMs();
            const starving = (oldest[lower] ?? -1) > maxWait;
            const s = sim.step(classOrder(classes, oldest, { [lower]: maxWait }), cycle(takes, t));
            assert.equal(s.queue === lo, starving, starving ? 'a starving lower class is served first' : 'INTERACTIVE goes first');
            if (s.queue === lo) {
              assert.ok(sim.now - 1 - waitingSince! <= maxWait + 1, `${lower} waited ${sim.now - 1 - waitingSince!} ticks for a turn (max wait ${maxWait})`);
              waitingSince = lo.jobs.length > lo.head ? sim.now : null;
            }
          }
          assert.equal(lo.served, arrived, 'every lower-class job was served');
        },
      ),
      run(150),
    );
  });

  test(
    'a deep lower-class backlog does not hold a higher class back for longer than the lower class’s max wait',
    () => {
      fc.assert(
        fc.property(fc.integer({ min: 300, max: 600 }), fc.integer({ min: 5, max: 20 }), fc.array(fc.integer({ min: 2, max: 4 }), { minLength: 1, maxLength: 10 }), (depth, maxWait, takes) => {
          const sim = new FairSim();
          const hi = sim.queue(sim.tenant('i', 1), 'INTERACTIVE');
          const bulk = sim.queue(sim.tenant('b', 1), 'BULK');
          sim.submit(bulk, depth);
          for (let t = 0; t < 400; t++) {
            sim.submit(hi, 1); // a steady stream: one interactive job per tick
            const s = sim.step(classOrder(['INTERACTIVE', 'BULK'], sim.oldestWaitMs(), { BULK: maxWait }), cycle(takes, t));
            for (const w of s.waits) if (s.queue === hi) assert.ok(w <= maxWait + 1, `an INTERACTIVE job waited ${w} ticks behind BULK (BULK max wait ${maxWait})`);
          }
        }),
        run(50),
      );
    },
  );
});

/* ------------------------------------------------------------------ */
/* Production's candidate loading and quota blocks (store.ts)          */
/* ------------------------------------------------------------------ */

describe('fair order through store.ts’s candidate rows', () => {
  const blockedArb = fc.array(
    fc.record({ vtime: fc.integer({ min: 0, max: 9 }), quota: fc.boolean() }),
    { minLength: 32, maxLength: 40 },
  );

  test('pickQueue over all busy queues passes over ineligible ones, however many there are', () => {
    fc.assert(
      fc.property(blockedArb, fc.integer({ min: 1, max: 3 }), (blocked, nEligible) => {
        const sim = new FairSim();
        blocked.forEach((b, i) => {
          const t = sim.tenant(`b${String(i).padStart(2, '0')}`, 1, 2);
          sim.submit(sim.queue(t, 'STANDARD', b.vtime), 5);
          if (b.quota) t.quotaBlocked = true;
          else t.inFlight = t.cap;
        });
        for (let i = 0; i < nEligible; i++) sim.submit(sim.queue(sim.tenant(`e${i}`, 1, 2), 'STANDARD', 10 + i), 5);
        const s = sim.step(['STANDARD'], 4);
        assert.ok(s.queue !== null && s.queue.tenant.id === 'e0');
      }),
      run(50),
    );
  });

  test(
    'a candidate LIMIT of 32: an eligible tenant is still served when 32+ ineligible queues have smaller virtual times',
    () => {
      fc.assert(
        fc.property(blockedArb, fc.integer({ min: 1, max: 3 }), (blocked, nEligible) => {
          const sim = new FairSim({ perClass: 32 });
          blocked.forEach((b, i) => {
            const t = sim.tenant(`b${String(i).padStart(2, '0')}`, 1, 2);
            sim.submit(sim.queue(t, 'STANDARD', b.vtime), 5);
            if (b.quota) t.quotaBlocked = true;
            else t.inFlight = t.cap;
          });
          for (let i = 0; i < nEligible; i++) sim.submit(sim.queue(sim.tenant(`e${i}`, 1, 2), 'STANDARD', 10 + i), 5);
          const s = sim.step(['STANDARD'], 4);
          assert.ok(s.queue !== null, 'the class stalled although an eligible tenant has ready work');
        }),
        run(50),
      );
    },
  );

  /** x is busy, gets quota-blocked for a long stretch while the others are served, then unblocked. */
  const quotaScenario = (options: SimOptions, others: number[], wX: number, blockedPicks: number, takes: number[]) => {
    const sim = new FairSim(options);
    const qs = others.map((w, i) => sim.queue(sim.tenant(`o${i}`, w)));
    for (const q of qs) sim.submit(q, 20_000);
    const xt = sim.tenant('x', wX);
    const x = sim.queue(xt);
    sim.submit(x, 20_000);
    let i = 0;
    for (; i < 50; i++) sim.step(['STANDARD'], cycle(takes, i));
    sim.blockQuota(xt);
    for (; i < 50 + blockedPicks; i++) assert.notEqual(sim.step(['STANDARD'], cycle(takes, i)).queue, x, 'a quota-blocked tenant is never served');
    sim.unblockQuota(xt);
    return windowAfterJoin(sim, x, sum(others) + wX, Math.min(wX, ...others), takes, i);
  };
  const quotaArbs = [
    fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 1, maxLength: 5 }),
    fc.integer({ min: 1, max: 5 }),
    fc.integer({ min: 500, max: 1_000 }),
    fc.array(fc.integer({ min: 1, max: 8 }), { minLength: 1, maxLength: 20 }),
  ] as const;

  test('a tenant whose quota block lifts joins at the class clock when the block cleared its ready mark (proposed fix)', () => {
    fc.assert(
      fc.property(...quotaArbs, (others, wX, blockedPicks, takes) => {
        const r = quotaScenario({ clearReadyOnQuotaBlock: true }, others, wX, blockedPicks, takes);
        assert.ok(r.worstExcess <= r.slack + 1e-6, `x got ${r.worstExcess} items over its share after the block (slack ${r.slack})`);
      }),
      run(30),
    );
  });

  test(
    'a tenant whose quota block lifts is not owed the time it was blocked (production: markQueuesReady)',
    () => {
      fc.assert(
        fc.property(...quotaArbs, (others, wX, blockedPicks, takes) => {
          const r = quotaScenario({}, others, wX, blockedPicks, takes);
          assert.ok(r.worstExcess <= r.slack + 1e-6, `x got ${r.worstExcess} items over its share after the block (slack ${r.slack})`);
        }),
        run(30),
      );
    },
  );
});

/* ------------------------------------------------------------------ */
/* Quotas and the ledger                                               */
/* ------------------------------------------------------------------ */

const KINDS: readonly OutcomeKind[] = ['billed', 'rate_limited', 'credits_exhausted', 'bad_input', 'key_unusable', 'unknown_api', 'server_error', 'timeout', 'bad_response'];

describe('quotas and the credit ledger', () => {
  test('fitCount: the longest prefix that fits (billed + reserved + prefix ≤ quota), monotone in the quota', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 60 }),
        fc.integer({ min: 0, max: 60 }),
        fc.integer({ min: 0, max: 120 }),
        fc.array(fc.integer({ min: 0, max: 10 }), { maxLength: 12 }),
        (billed, reserved, quota, costs) => {
          const n = fitCount(billed, reserved, quota, costs);
          assert.ok(Number.isInteger(n) && n >= 0 && n <= costs.length);
          const used = billed + reserved + sum(costs.slice(0, n));
          if (n > 0) assert.ok(used <= quota, 'I4: the prefix fits the quota');
          if (n < costs.length) assert.ok(used + costs[n]! > quota, 'maximal: the next job would not fit');
          assert.ok(fitCount(billed, reserved, quota + 1, costs) >= n, 'more quota never fits fewer');
          assert.ok(fitCount(billed + 1, reserved, quota, costs) <= n, 'more usage never fits more');
        },
      ),
      run(2000),
    );
  });

  test("billedCredits: the classification's bill, within [0, reserved]", () => {
    fc.assert(
      fc.property(fc.integer({ min: -5, max: 50 }), fc.integer({ min: 0, max: 40 }), (creditsBilled, reserved) => {
        const b = billedCredits(creditsBilled, reserved);
        assert.ok(b >= 0 && b <= reserved);
        assert.equal(b, Math.min(reserved, Math.max(0, creditsBilled)));
      }),
      run(2000),
    );
  });

  test('I4/I5 over a run: billed + reserved never passes the quota; after settling everything nothing is outstanding', () => {
    const op = fc.oneof(
      fc.record({ op: fc.constant('dispatch' as const), costs: fc.array(fc.integer({ min: 1, max: 6 }), { minLength: 1, maxLength: 8 }) }),
      fc.record({ op: fc.constant('settle' as const), pick: fc.nat(), kind: fc.constantFrom(...KINDS), extra: fc.integer({ min: -2, max: 3 }) }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 80 }), fc.nat(80), fc.array(op, { maxLength: 60 }), (quota, billed0, ops) => {
        let billed = Math.min(billed0, quota);
        let reserved = 0;
        let refunded = 0;
        let reservedEver = 0;
        const open: number[] = [];
        const settle = (i: number, kind: OutcomeKind, extra: number) => {
          const credits = open.splice(i, 1)[0]!;
          const b = billedCredits(kind === 'billed' || kind === 'timeout' ? credits + extra : 0, credits);
          reserved -= credits;
          billed += b;
          refunded += credits - b;
        };
        const start = billed;
        for (const o of ops) {
          if (o.op === 'dispatch') {
            const n = fitCount(billed, reserved, quota, o.costs);
            for (const c of o.costs.slice(0, n)) {
              open.push(c);
              reserved += c;
              reservedEver += c;
            }
          } else if (open.length > 0) settle(o.pick % open.length, o.kind, o.extra);
          assert.ok(billed + reserved <= quota, `I4: billed ${billed} + reserved ${reserved} > quota ${quota}`);
        }
        while (open.length > 0) settle(0, 'billed', 0);
        assert.equal(reserved, 0, 'I5: nothing outstanding');
        assert.equal(billed - start + refunded, reservedEver, 'every reservation was billed or refunded, once');
      }),
      run(500),
    );
  });
});

/* ------------------------------------------------------------------ */
/* The pacer                                                           */
/* ------------------------------------------------------------------ */

type PacerEvent = { dt: number; kind: 'take'; n: number } | { dt: number; kind: 'pause'; seconds: number };

const pacerEventArb: fc.Arbitrary<PacerEvent> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ dt: fc.integer({ min: 0, max: 3_000 }), kind: fc.constant('take' as const), n: fc.integer({ min: 1, max: 6 }) }) },
  { weight: 1, arbitrary: fc.record({ dt: fc.integer({ min: 0, max: 3_000 }), kind: fc.constant('pause' as const), seconds: fc.integer({ min: 0, max: 5 }) }) },
);

const bucketArb = fc.record({
  ratePerMinute: fc.oneof(fc.integer({ min: 1, max: 6_000 }), fc.double({ min: 0.5, max: 6_000, noNaN: true })),
  burst: fc.integer({ min: 1, max: 20 }),
  fill: fc.double({ min: 0, max: 1, noNaN: true }),
});

/** Replays events against a bucket the way the SQL does (sluice_lease's window update, store.ts pauseWindow). */
function replayPacer(b0: { ratePerMinute: number; burst: number; fill: number }, events: readonly PacerEvent[], onState?: (b: BucketState, now: number) => void) {
  const b: BucketState = { ratePerMinute: b0.ratePerMinute, burst: b0.burst, tokens: b0.burst * b0.fill, refilledAt: 0, pausedUntil: null };
  const taken: Array<{ at: number; n: number }> = [];
  let now = 0;
  for (const e of events) {
    now += e.dt;
    onState?.({ ...b }, now);
    const paused = b.pausedUntil !== null && b.pausedUntil > now;
    if (e.kind === 'pause') {
      b.tokens = 0;
      b.refilledAt = Math.max(now, now + e.seconds * 1000);
      b.pausedUntil = Math.max(b.pausedUntil ?? now, now + e.seconds * 1000);
      continue;
    }
    // The dispatcher asks for what `takeable` says is there; the SQL re-checks with the same formula.
    const can = takeable(b, now);
    if (paused) assert.equal(can, 0, 'I2: nothing is takeable during a pause');
    const n = Math.min(e.n, can);
    const nowTokens = tokensAt(b, now);
    const sqlTakes = (k: number) => !paused && nowTokens >= k - 1e-9;
    assert.equal(sqlTakes(e.n), can >= e.n, 'takeable agrees with the SQL condition');
    if (n < 1) continue;
    assert.ok(sqlTakes(n), 'a take the dispatcher plans succeeds in SQL');
    b.tokens = nowTokens - n;
    b.refilledAt = now;
    taken.push({ at: now, n });
    assert.ok(b.tokens >= -1e-9 && b.tokens <= b.burst);
  }
  return { taken, b, now };
}

describe('the pacer (token bucket)', () => {
  test('the default burst is three seconds at the PACED rate, so it keeps the pace\'s headroom below the provider\'s bucket', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 100_000 }), fc.double({ min: 0.05, max: 1, noNaN: true }), (limit, pace) => {
        const [w] = planWindows({ plan: 'PRO', ratePerMinute: limit, paceFraction: pace, primaryKey: 'k', subKeys: [], classWindows: {} });
        assert.equal(w!.burst, Math.max(1, Math.floor((limit * pace) / 20)));
        // Never more than the provider's own three seconds at its limit (the simulator's bucket).
        assert.ok(w!.burst <= Math.max(1, Math.round(limit / 20)));
      }),
    );
    const [explicit] = planWindows({ plan: 'PRO', ratePerMinute: 6000, paceFraction: 0.9, burst: 7, primaryKey: 'k', subKeys: [], classWindows: {} });
    assert.equal(explicit!.burst, 7, 'PACER_BURST overrides the default');
  });
  test('I1: calls taken in any interval [t0, t1] ≤ burst + rate × (t1 − t0); I2: none during a pause', () => {
    fc.assert(
      fc.property(bucketArb, fc.array(pacerEventArb, { minLength: 1, maxLength: 80 }), (b0, events) => {
        const { taken } = replayPacer(b0, events);
        for (let i = 0; i < taken.length; i++) {
          let n = 0;
          for (let j = i; j < taken.length; j++) {
            n += taken[j]!.n;
            const allowed = b0.burst + (b0.ratePerMinute * (taken[j]!.at - taken[i]!.at)) / 60_000;
            assert.ok(n <= allowed + 1e-6, `I1: ${n} calls in [${taken[i]!.at}, ${taken[j]!.at}] ms, allowed ${allowed}`);
          }
        }
      }),
      run(400),
    );
  });

  test('msUntilTokens: after waiting that long the tokens are there (and not a millisecond earlier when not paused)', () => {
    fc.assert(
      fc.property(bucketArb, fc.array(pacerEventArb, { minLength: 1, maxLength: 30 }), fc.integer({ min: 1, max: 25 }), (b0, events, n) => {
        replayPacer(b0, events, (b, now) => {
          const wait = msUntilTokens(b, now, n);
          assert.ok(Number.isFinite(wait) && wait >= 0);
          const want = Math.min(n, b.burst);
          assert.ok(takeable(b, now + wait) >= want, `after ${wait} ms only ${takeable(b, now + wait)} of ${want} tokens`);
          const paused = b.pausedUntil !== null && b.pausedUntil > now;
          if (paused) assert.ok(now + wait >= b.pausedUntil!, 'no waking before the pause ends');
          if (!paused && wait > 0) assert.ok(tokensAt(b, now + wait - 1) < want + 1e-9, 'the wait is not longer than needed');
          if (!paused && wait === 0) assert.ok(takeable(b, now) >= want);
        });
      }),
      run(300),
    );
  });

  test('a paused bucket gives nothing; an unlimited one everything but still waits out its pause', () => {
    fc.assert(
      fc.property(
        fc.option(fc.integer({ min: 1, max: 6_000 }), { nil: null }),
        fc.integer({ min: 1, max: 20 }),
        fc.integer({ min: 0, max: 20 }),
        fc.integer({ min: 0, max: 100_000 }),
        fc.integer({ min: 1, max: 60_000 }),
        (rate, burst, tokens, now, pause) => {
          const b: BucketState = { ratePerMinute: rate, burst, tokens: Math.min(tokens, burst), refilledAt: 0, pausedUntil: now + pause };
          assert.equal(takeable(b, now), 0);
          assert.ok(msUntilTokens(b, now, 1) >= pause);
          if (rate === null) {
            assert.equal(msUntilTokens(b, now, 5), pause);
            assert.equal(takeable({ ...b, pausedUntil: null }, now), Number.MAX_SAFE_INTEGER);
            assert.equal(msUntilTokens({ ...b, pausedUntil: null }, now, 5), 0);
          } else {
            assert.ok(tokensAt(b, now + pause) <= burst, 'the refill is capped at the burst');
          }
        },
      ),
      run(500),
    );
  });
});

/* ------------------------------------------------------------------ */
/* Pools (Little's law) and the latency tracker                        */
/* ------------------------------------------------------------------ */

describe('worker pools', () => {
  const limitsArb = fc.record({ concurrentLimit: fc.integer({ min: 1, max: 100 }), max: fc.integer({ min: 1, max: 300 }) });
  const rateArb = fc.option(fc.integer({ min: 1, max: 20_000 }), { nil: null });
  const p95Arb = fc.integer({ min: 0, max: 60_000 });

  test('poolSize: ≥ 1, ≤ min(concurrentLimit, max), sustains the rate when it can, monotone in p95 and in the rate', () => {
    fc.assert(
      fc.property(rateArb, p95Arb, p95Arb, fc.integer({ min: 0, max: 5_000 }), limitsArb, (rate, p95a, p95b, dRate, limits) => {
        const ceiling = Math.min(limits.concurrentLimit, limits.max);
        const size = poolSize(rate, p95a, limits);
        assert.ok(Number.isInteger(size) && size >= 1 && size <= ceiling);
        const [lo, hi] = p95a <= p95b ? [p95a, p95b] : [p95b, p95a];
        assert.ok(poolSize(rate, lo, limits) <= poolSize(rate, hi, limits), 'monotone in p95');
        if (rate === null) {
          assert.equal(size, ceiling, 'unlimited: the limits');
          return;
        }
        assert.ok(poolSize(rate, p95a, limits) <= poolSize(rate + dRate, p95a, limits), 'monotone in the rate');
        assert.ok(poolSize(rate, p95a, limits) <= poolSize(null, p95a, limits), 'never above the unlimited size');
        const needed = (rate / 60_000) * p95a; // Little's law: L = λ × W
        if (size < ceiling) {
          assert.ok(size >= needed - 1e-9, 'the pool holds the rate at p95');
          assert.ok(size === 1 || size - 1 < needed + 1e-9, 'and is no bigger than it needs to be');
        }
      }),
      run(2000),
    );
  });

  test('LatencyTracker: nearest-rank percentiles of the last `capacity` samples, within their range, monotone in p', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 40 }),
        fc.integer({ min: 1, max: 5_000 }),
        fc.array(fc.integer({ min: 0, max: 10_000 }), { maxLength: 150 }),
        fc.array(fc.integer({ min: 0, max: 100 }), { minLength: 2, maxLength: 8 }),
        (capacity, initial, samples, ps) => {
          const tr = new LatencyTracker(capacity, initial);
          for (const s of samples) tr.record(s);
          const window = samples.slice(Math.max(0, samples.length - capacity));
          assert.equal(tr.count, window.length);
          if (window.length === 0) {
            for (const p of ps) assert.equal(tr.percentile(p), initial);
            return;
          }
          assert.equal(tr.percentile(0), Math.min(...window));
          assert.equal(tr.percentile(100), Math.max(...window));
          const sorted = [...ps].sort((a, b) => a - b);
          let prev = Number.NEGATIVE_INFINITY;
          for (const p of sorted) {
            const r = tr.percentile(p);
            assert.ok(window.includes(r), 'a recorded sample of the current window');
            assert.ok(r >= prev, 'monotone in p');
            prev = r;
            const rank = Math.max(1, Math.ceil((p / 100) * window.length));
            assert.ok(window.filter((x) => x <= r).length >= rank, `at least ${p}% of samples ≤ p${p}`);
            assert.ok(window.filter((x) => x < r).length < rank, `p${p} is the smallest such sample`);
          }
        },
      ),
      run(1000),
    );
  });
});

/* ------------------------------------------------------------------ */
/* Settlement                                                          */
/* ------------------------------------------------------------------ */

describe('settlement: retries and put-backs', () => {
  test('retries stop after retryLimit; put-backs never count as attempts; delays are non-negative', () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ kind: fc.constantFrom(...KINDS), retryAfter: fc.option(fc.double({ min: -5, max: 120, noNaN: true }), { nil: null }) }), { minLength: 1, maxLength: 40 }),
        fc.integer({ min: 0, max: 6 }),
        fc.integer({ min: 0, max: 30 }),
        (outcomes, retryLimit, base) => {
          // The job's `attempts` column: the lease's claim (sluice_lease) adds one, a put-back requeue gives it back.
          let attempts = 0;
          let retries = 0;
          let failedRetryable = 0;
          let final: 'succeed' | 'fail' | null = null;
          for (const o of outcomes) {
            attempts++;
            const outcome: CallOutcome = { kind: o.kind, httpStatus: null, creditsBilled: 0, data: null, message: null, status: null, retryAfterSeconds: o.retryAfter, latencyMs: 1 };
            const reaction = reactionTo(outcome);
            const plan = planSettlement(reaction, outcome, attempts, retryLimit, base);
            assert.ok(plan.delaySeconds >= 0 && Number.isFinite(plan.delaySeconds));
            assert.equal(plan.countsAsAttempt, reaction !== 'put_back', 'only a put-back gives its attempt back');
            if (reaction === 'put_back') {
              assert.equal(plan.action, 'requeue', 'a put-back never exhausts the job');
              assert.ok(plan.delaySeconds >= 1 && Number.isInteger(plan.delaySeconds));
              if (o.retryAfter !== null) assert.ok(plan.delaySeconds >= o.retryAfter, 'waits out retry-after');
              attempts--;
              continue;
            }
            if (reaction === 'retry') {
              failedRetryable++;
              if (plan.action === 'requeue') {
                retries++;
                assert.equal(plan.delaySeconds, retryDelaySeconds(attempts, base));
                assert.ok(plan.delaySeconds <= 300);
                continue;
              }
              assert.equal(plan.action, 'fail');
              assert.equal(failedRetryable, retryLimit + 1, 'fails exactly when the retries are used up');
            }
            final = plan.action === 'requeue' ? null : plan.action;
            assert.equal(final, reaction === 'complete' ? 'succeed' : 'fail');
            break;
          }
          assert.ok(retries <= retryLimit, `${retries} retries with a limit of ${retryLimit}`);
          assert.ok(attempts <= retryLimit + 1, 'at most retryLimit + 1 counted attempts');
          if (final === null) assert.ok(failedRetryable <= retryLimit, 'still queued only while retries remain');
        },
      ),
      run(2000),
    );
  });

  test('retry delays grow exponentially up to the cap', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 40 }), fc.integer({ min: 0, max: 60 }), fc.integer({ min: 1, max: 600 }), (attempt, base, max) => {
        const d = retryDelaySeconds(attempt, base, max);
        assert.ok(d >= 0 && d <= max);
        assert.ok(retryDelaySeconds(attempt + 1, base, max) >= d, 'non-decreasing');
        if (d < max) assert.equal(d, base * 2 ** (attempt - 1));
      }),
      run(1000),
    );
  });
});
