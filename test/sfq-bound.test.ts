/**
 * Start-time fair queueing's bound (I13), held by the lease's rules: the pure model of the lease
 * (scheduler/lease.ts planPicks, which test/lease-differential.test.ts checks against
 * sluice_lease) driven lease after lease over generated shapes (weights, staggered arrivals,
 * batching on, paced tokens with pauses and a full bucket after idle), and every pair of tenants
 * backlogged together measured with scheduler/sfq-lag.ts sfqLag: the lag over every interval
 * within 1/w_i + 1/w_j + P/W, whether the tenants' jobs batch or not (a batch turn is held to the
 * fair limit like any other; the next turns join its call). No database.
 *
 * A submission marks a queue ready at max(its virtual time, the class clock), as
 * scheduler/sql/queues.ts does; when `stale`, at the clock before the previous lease moved it (a
 * submission that read the clock while that lease ran, and committed after it: the lease then
 * starts the queue's turn at the clock, not behind it).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { planPicks, type LeaseInput, type LeaseJob } from '../src/scheduler/lease.ts';
import { activationVtime } from '../src/scheduler/fair.ts';
import { sfqLag, type BackloggedTenant, type ServedJobs } from '../src/scheduler/sfq-lag.ts';

const SEED = 20_261_204;

interface Shape {
  /** `stale`: its submission read the class clock before the previous lease moved it (the two ran together). */
  tenants: Array<{ weight: number; arriveAt: number; jobs: number; batching: boolean; stale?: boolean }>;
  /** Tokens the pacer adds before each lease (a pause: 0 for a while, then the bucket). */
  refill: number[];
  burst: number;
  leaseMax: number;
  batchQuantum: number;
}

interface Outcome {
  served: ServedJobs[];
  tenants: Array<BackloggedTenant & { batching: boolean }>;
}

/** Runs leases until every job is served or the refills end. Each lease is one instant. */
function simulate(s: Shape): Outcome {
  const cls = 'STANDARD' as const;
  const ids = s.tenants.map((_, i) => `t${String(i).padStart(2, '0')}`);
  const left = s.tenants.map((t, i) =>
    Array.from({ length: t.jobs }, (_, k): LeaseJob => ({ id: `${ids[i]}-${k}`, api: t.batching ? 'batchy' : 'single', params: { k } })),
  );
  const vtime = s.tenants.map(() => 0);
  const marked = s.tenants.map(() => false);
  let clock = 0;
  // The clock before the last lease moved it: what a submission running beside that lease read.
  let clockBefore = 0;
  let tokens = s.burst; // idle start: a full bucket
  const served: ServedJobs[] = [];
  const lastServed = s.tenants.map(() => -1);
  for (let step = 0; step < s.refill.length; step++) {
    // Submissions visible now: marked ready at max(own virtual time, the clock).
    s.tenants.forEach((t, i) => {
      if (t.arriveAt === step && left[i]!.length > 0) {
        vtime[i] = activationVtime(vtime[i]!, t.stale ? clockBefore : clock);
        marked[i] = true;
      }
    });
    tokens = Math.min(s.burst, tokens + s.refill[step]!);
    const input: LeaseInput = {
      classes: [cls],
      queues: s.tenants.map((_, i) => ({ tenantId: ids[i]!, jobClass: cls, vtime: vtime[i]!, ready: marked[i]! })),
      tenants: s.tenants.map((t, i) => ({
        tenantId: ids[i]!,
        weight: t.weight,
        cap: 1_000_000,
        inFlight: 0,
        quota: 1_000_000_000,
        used: 0,
        quotaPolicy: 'WAIT',
        quotaBlocked: false,
        suspended: false,
      })),
      jobs: Object.fromEntries(s.tenants.map((_, i) => [`${ids[i]}/${cls}`, left[i]!.slice(0, 256)])),
      tokens: Math.floor(tokens),
      room: 1_000_000,
      max: 256,
      leaseMax: s.leaseMax,
      costs: {},
      hold: [],
      batch: { batchy: [200, 2] },
      batchMax: 200,
      batchQuantum: s.batchQuantum,
      clocks: { [cls]: clock },
    };
    const picks = planPicks(input);
    tokens -= picks.tokens;
    for (const turn of picks.turns) {
      const i = ids.indexOf(turn.tenantId);
      const taken = new Set(turn.jobIds);
      left[i] = left[i]!.filter((j) => !taken.has(j.id));
      served.push({ at: step, tenantId: turn.tenantId, n: turn.jobIds.length });
      lastServed[i] = step;
    }
    s.tenants.forEach((_, i) => {
      vtime[i] = picks.vtimes[`${ids[i]}/${cls}`]!;
      marked[i] = picks.marked[`${ids[i]}/${cls}`]!;
    });
    clockBefore = clock;
    clock = picks.clocks[cls]!;
  }
  // Backlogged from the lease its jobs became visible at to the lease that served its last job
  // (or the end, with jobs left).
  const tenants = s.tenants.map((t, i) => ({
    tenantId: ids[i]!,
    weight: t.weight,
    unit: 1,
    batching: t.batching,
    backlogged: t.arriveAt < s.refill.length ? [[t.arriveAt, left[i]!.length > 0 ? s.refill.length - 1 : lastServed[i]!] as const] : [],
  }));
  return { served, tenants };
}

const shapeArb = fc
  .record({
    tenants: fc.array(
      fc.record({
        weight: fc.constantFrom(1, 1, 2, 2, 3, 4, 6, 8),
        arriveAt: fc.constantFrom(0, 0, 1, 2, 30, 60),
        jobs: fc.integer({ min: 20, max: 600 }),
        batching: fc.constantFrom(true, true, false),
        stale: fc.boolean(),
      }),
      { minLength: 2, maxLength: 8 },
    ),
    // Paced refills of 0-4 tokens a lease, with a pause (nothing, then the bucket refills).
    steady: fc.array(fc.integer({ min: 0, max: 4 }), { minLength: 150, maxLength: 150 }),
    pauseAt: fc.integer({ min: 20, max: 120 }),
    burst: fc.integer({ min: 20, max: 180 }),
    leaseMax: fc.integer({ min: 1, max: 8 }),
    batchQuantum: fc.integer({ min: 1, max: 20 }),
  })
  .map(({ steady, pauseAt, burst, ...rest }): Shape => ({
    ...rest,
    burst,
    refill: steady.map((n, k) => (k === pauseAt ? burst : n)),
  }));

test('the lease holds the SFQ bound for every pair and interval: batching on, idle start, staggered joiners, a pause (200 shapes)', () => {
  let pairs = 0;
  let batchingPairs = 0;
  fc.assert(
    fc.property(shapeArb, (shape) => {
      const out = simulate(shape);
      const r = sfqLag(out.tenants, out.served, { gridStep: 1, minShareSpan: Number.POSITIVE_INFINITY });
      for (const p of r.pairs) {
        assert.ok(p.lag <= p.bound + 1e-9, `${p.a}/${p.b} over [${p.from}, ${p.to}]: lag ${p.lag} > bound ${p.bound} (P ${p.leaseMost})`);
        pairs++;
        const [ta, tb] = [out.tenants.find((t) => t.tenantId === p.a)!, out.tenants.find((t) => t.tenantId === p.b)!];
        if (ta.batching && tb.batching) batchingPairs++;
      }
    }),
    { seed: SEED, numRuns: 200 },
  );
  assert.ok(pairs >= 200, `pairs measured: ${pairs}`);
  assert.ok(batchingPairs >= 50, `pairs of tenants whose jobs both batch: ${batchingPairs} of ${pairs}`);
});

test('after idle, a full bucket is shared by the tenants that are ready, not taken by the first ones visible', () => {
  // Three tenants whose jobs become visible one lease apart; a full bucket of 180 at the start.
  const shape: Shape = {
    tenants: [
      { weight: 1, arriveAt: 0, jobs: 300, batching: true },
      { weight: 8, arriveAt: 1, jobs: 300, batching: true },
      { weight: 2, arriveAt: 2, jobs: 300, batching: true },
    ],
    refill: Array.from({ length: 40 }, () => 1),
    burst: 180,
    leaseMax: 8,
    batchQuantum: 20,
  };
  const out = simulate(shape);
  // The first lease: one turn (the tenant is alone in its class), not the bucket.
  const first = out.served.filter((e) => e.at === 0);
  assert.deepEqual(first, [{ at: 0, tenantId: 't00', n: 20 }]);
  // Every lease is one round at most: no tenant has two turns in one paced call (the bucket is
  // not spent by the tenants visible when a call starts).
  const turns = new Map<string, number>();
  for (const e of out.served) turns.set(`${e.at}/${e.tenantId}`, (turns.get(`${e.at}/${e.tenantId}`) ?? 0) + 1);
  for (const [k, n] of turns) assert.equal(n, 1, `turns of ${k}`);
  const r = sfqLag(out.tenants, out.served, { gridStep: 1, minShareSpan: 10 });
  assert.ok(r.withinBound, JSON.stringify(r.worst));
  // The weight-2 tenant, ready two leases after idle, gets its share of the saved-up tokens: of
  // what leases 2-21 handed out (all three ready, the bucket not yet spent), 2/11 within 3 points.
  const window = out.served.filter((e) => e.at >= 2 && e.at < 22);
  const total = window.reduce((n, e) => n + e.n, 0);
  assert.ok(total > 20 * 1, `the bucket, not the refill, is being spent: ${total} jobs in 20 leases`);
  for (const [id, w] of [['t00', 1], ['t01', 8], ['t02', 2]] as const) {
    const got = window.filter((e) => e.tenantId === id).reduce((n, e) => n + e.n, 0) / total;
    assert.ok(Math.abs(got - w / 11) <= 0.03, `${id}'s share of leases 2-21: ${got.toFixed(3)}, weight ${w}/11`);
  }
});
