/**
 * The learned pace's pure rules (scheduler/learned-pace.ts): examples, then fast-check properties
 * with a fixed seed (a failure prints the seed, the path and the shrunk counterexample), including
 * a replay of many samples against a provider whose window changes: the rate stays within
 * [floor, configured], settles at the stated window × fraction, and climbs back by whole steps.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BUCKET_HALF_LIFE_MS, DRAIN_NOISE, DRAIN_SPAN_MS, bucketLow, burstFor, decayedBucketSize, otherTraffic, paceCeiling, planPace, rateAfterRateLimit, slowStartRate, type PaceDecision, type PaceRules } from '../src/scheduler/learned-pace.ts';

const RULES: PaceRules = { fraction: 0.9, step: 0.05, stepMs: 2000, decrease: 0.5, min: 0.05, start: 0.1, startStepMs: 1000 };
const SEED = 20261204;
const run = (numRuns: number) => ({ seed: SEED, numRuns });
const none = { limit: null, otherPerMinute: null, low: false, confirmed: true };

describe('learned pace: examples', () => {
  test('a stated window below the configured rate lowers the pace to it × fraction at once', () => {
    assert.deepEqual(planPace({ configured: 1080, current: 1080, sinceChangeMs: null, starting: false }, { ...none, limit: 600 }, RULES), { kind: 'lower', rate: 540, reason: 'LIMIT' });
  });

  test('a stated window above the configured rate changes nothing at the configured rate', () => {
    assert.deepEqual(planPace({ configured: 1080, current: 1080, sinceChangeMs: 10_000, starting: false }, { ...none, limit: 6000 }, RULES), { kind: 'hold' });
  });

  test('below what the answers allow, the pace climbs one step once the last change is PACE_STEP_MS old', () => {
    assert.deepEqual(planPace({ configured: 1080, current: 540, sinceChangeMs: 2000, starting: false }, { ...none, limit: 1200 }, RULES), { kind: 'raise', rate: 594, reason: 'CLIMB' });
    assert.deepEqual(planPace({ configured: 1080, current: 540, sinceChangeMs: 1999, starting: false }, { ...none, limit: 1200 }, RULES), { kind: 'hold' });
    // The last step stops at the ceiling: the stated window × fraction, or the configuration.
    assert.deepEqual(planPace({ configured: 1080, current: 1050, sinceChangeMs: 5000, starting: false }, { ...none, limit: 1200 }, RULES), { kind: 'raise', rate: 1080, reason: 'CLIMB' });
    assert.deepEqual(planPace({ configured: 1080, current: 500, sinceChangeMs: 5000, starting: false }, { ...none, limit: 600 }, RULES), { kind: 'raise', rate: 540, reason: 'CLIMB' });
  });

  test('a low provider bucket holds the climb', () => {
    assert.deepEqual(planPace({ configured: 1080, current: 540, sinceChangeMs: 5000, starting: false }, { limit: 1200, otherPerMinute: null, low: true, confirmed: true }, RULES), { kind: 'hold' });
  });

  test('others draining the key lower the pace to what they leave × fraction; noise does not', () => {
    assert.deepEqual(planPace({ configured: 1080, current: 1080, sinceChangeMs: null, starting: false }, { limit: 1200, otherPerMinute: 400, low: true, confirmed: true }, RULES), { kind: 'lower', rate: 720, reason: 'DRAIN' });
    assert.deepEqual(planPace({ configured: 1080, current: 1080, sinceChangeMs: null, starting: false }, { limit: 1200, otherPerMinute: 1200 * DRAIN_NOISE, low: true, confirmed: true }, RULES), { kind: 'hold' });
    // The estimate alone, with the provider's bucket not low, is not enough (headers lag by the latency).
    assert.deepEqual(planPace({ configured: 1080, current: 1080, sinceChangeMs: null, starting: false }, { limit: 1200, otherPerMinute: 400, low: false, confirmed: true }, RULES), { kind: 'hold' });
    // Already below what others leave: no climb either while they drain.
    assert.deepEqual(planPace({ configured: 1080, current: 600, sinceChangeMs: 60_000, starting: false }, { limit: 1200, otherPerMinute: 400, low: true, confirmed: true }, RULES), { kind: 'hold' });
  });

  test('answers without rate-limit headers still confirm the room: the pace climbs back after a 429; no confirming answer, no climb', () => {
    assert.deepEqual(planPace({ configured: 1080, current: 540, sinceChangeMs: 2000, starting: false }, none, RULES), { kind: 'raise', rate: 594, reason: 'CLIMB' });
    assert.deepEqual(planPace({ configured: 1080, current: 540, sinceChangeMs: 2000, starting: false }, { ...none, confirmed: false }, RULES), { kind: 'hold' });
  });

  test('a slow start begins at PACE_START and doubles once per sample until the ceiling, which ends it', () => {
    assert.equal(slowStartRate(1080, RULES), 108);
    assert.equal(slowStartRate(1080, { ...RULES, start: 0.01 }), 54, 'never below the floor');
    const starting = { configured: 1080, sinceChangeMs: 1000, starting: true };
    assert.deepEqual(planPace({ ...starting, current: 108 }, none, RULES), { kind: 'raise', rate: 216, reason: 'START' });
    assert.deepEqual(planPace({ ...starting, current: 108, sinceChangeMs: 999 }, none, RULES), { kind: 'hold' }, 'one doubling per sample, however many nodes sample');
    assert.deepEqual(planPace({ ...starting, current: 864 }, none, RULES), { kind: 'raise', rate: 1080, reason: 'CLIMB' });
    // A stated window caps the start where it is learned: no burst past it.
    assert.deepEqual(planPace({ ...starting, current: 432 }, { ...none, limit: 600 }, RULES), { kind: 'raise', rate: 540, reason: 'CLIMB' });
    assert.deepEqual(planPace({ ...starting, current: 540 }, { ...none, limit: 600 }, RULES), { kind: 'raise', rate: 540, reason: 'CLIMB' }, 'at the ceiling: the start ends without a change of rate');
    assert.deepEqual(planPace({ ...starting, current: 108 }, { ...none, low: true }, RULES), { kind: 'hold' }, 'a low provider bucket holds the start');
    assert.deepEqual(planPace({ ...starting, current: 108 }, { ...none, confirmed: false }, RULES), { kind: 'hold' }, 'nothing confirmed, no doubling');
    // A probe (the floor after a capped pause) doubles the same way once a call comes back.
    assert.deepEqual(planPace({ ...starting, current: 54 }, none, RULES), { kind: 'raise', rate: 108, reason: 'START' });
  });

  test("the provider's bucket estimate decays: one inflated remaining is forgotten within minutes", () => {
    assert.equal(decayedBucketSize(null, 30, 0), 30);
    assert.equal(decayedBucketSize(300, null, BUCKET_HALF_LIFE_MS), 150);
    assert.equal(decayedBucketSize(300, 30, 4 * BUCKET_HALF_LIFE_MS), 30, 'never below what this sample saw');
    assert.equal(decayedBucketSize(30, 40, 1000), 40, 'a higher remaining raises it at once');
    let estimate: number | null = 600; // one answer said 600 where the bucket holds 30
    for (let s = 0; s < 180; s++) estimate = decayedBucketSize(estimate, 20, 1000);
    assert.ok(estimate! < 30 && bucketLow(4, estimate), `after 3 minutes a remaining of 4 (of 20) reads as low again (estimate ${estimate})`);
  });

  test('a rate-limit 429 halves the pace, never below PACE_MIN of the configuration', () => {
    assert.equal(rateAfterRateLimit(1080, 1080, RULES), 540);
    assert.equal(rateAfterRateLimit(60, 1080, RULES), 54);
    assert.equal(rateAfterRateLimit(54, 1080, RULES), 54);
  });

  test('the burst keeps its seconds: scaled with the rate, at least 1, never above the configured burst', () => {
    assert.equal(burstFor(54, 1080, 540), 27);
    assert.equal(burstFor(54, 1080, 10), 1);
    assert.equal(burstFor(54, 1080, 2000), 54);
  });

  test("others' traffic: the provider's drop beyond Sluice's calls and the refill", () => {
    // 600/min refills 50 in 5 s; Sluice took 45; the bucket fell from 20 to 5: others took 20 → 240/min.
    assert.equal(otherTraffic({ from: 20, to: 5, spanMs: 5000, limit: 600, ownCalls: 45, bucketSize: 30 }), 240);
    // Sluice alone: the drop is its own calls less the refill.
    assert.equal(otherTraffic({ from: 20, to: 25, spanMs: 5000, limit: 600, ownCalls: 45, bucketSize: 30 }), 0);
    assert.equal(otherTraffic({ from: 29, to: 5, spanMs: 5000, limit: 600, ownCalls: 45, bucketSize: 30 }), null, 'a full bucket at the start drops its refill');
    assert.equal(otherTraffic({ from: 20, to: 29, spanMs: 5000, limit: 600, ownCalls: 20, bucketSize: 30 }), null, 'so may one that is full at the end');
    assert.equal(otherTraffic({ from: 20, to: 5, spanMs: DRAIN_SPAN_MS - 1, limit: 600, ownCalls: 45, bucketSize: 30 }), null, 'too short a span');
    assert.equal(bucketLow(5, 30), true);
    assert.equal(bucketLow(10, 30), false);
    assert.equal(bucketLow(null, 30), false);
  });
});

const rulesArb = fc.record({
  fraction: fc.double({ min: 0.5, max: 1, noNaN: true }),
  step: fc.double({ min: 0.01, max: 0.5, noNaN: true }),
  stepMs: fc.integer({ min: 0, max: 10_000 }),
  decrease: fc.double({ min: 0.1, max: 0.9, noNaN: true }),
  min: fc.double({ min: 0.01, max: 0.5, noNaN: true }),
  start: fc.double({ min: 0.01, max: 1, noNaN: true }),
  startStepMs: fc.integer({ min: 0, max: 5_000 }),
});

describe('learned pace: properties', () => {
  test('a decision never leaves [floor, configured], never raises past the stated window × fraction, and a lowering lowers', () => {
    fc.assert(
      fc.property(
        rulesArb,
        fc.double({ min: 1, max: 100_000, noNaN: true }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        fc.option(fc.double({ min: 1, max: 200_000, noNaN: true })),
        fc.option(fc.double({ min: 0, max: 200_000, noNaN: true })),
        fc.boolean(),
        fc.option(fc.integer({ min: 0, max: 60_000 })),
        (r, configured, share, limit, other, low, since) => {
          const floor = configured * r.min;
          const current = floor + (configured - floor) * share;
          const d: PaceDecision = planPace({ configured, current, sinceChangeMs: since, starting: false }, { limit, otherPerMinute: other, low, confirmed: true }, r);
          if (d.kind === 'hold') return;
          assert.ok(d.rate >= floor - 1e-9 && d.rate <= configured + 1e-9, `rate ${d.rate} within [${floor}, ${configured}]`);
          if (d.kind === 'lower') assert.ok(d.rate < current, 'a lowering lowers');
          else {
            assert.ok(d.rate > current, 'a raise raises');
            assert.ok(d.rate <= paceCeiling(configured, limit, r) + 1e-9, 'never past what the answers allow');
            assert.ok(d.rate - current <= configured * r.step + 1e-9, 'by one step at most');
            assert.ok(!low, 'never while the provider bucket is low');
          }
        },
      ),
      run(2000),
    );
  });

  test('a 429 never raises the pace and never goes below the floor', () => {
    fc.assert(
      fc.property(rulesArb, fc.double({ min: 1, max: 100_000, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true }), (r, configured, share) => {
        const current = configured * r.min + configured * (1 - r.min) * share;
        const next = rateAfterRateLimit(current, configured, r);
        assert.ok(next <= current + 1e-9 && next >= configured * r.min - 1e-9);
      }),
      run(1000),
    );
  });

  test("replayed against a provider whose window changes, the pace settles at min(window × fraction, configured) by whole steps", () => {
    fc.assert(
      fc.property(rulesArb, fc.double({ min: 10, max: 10_000, noNaN: true }), fc.array(fc.double({ min: 1, max: 20_000, noNaN: true }), { minLength: 1, maxLength: 6 }), (r, configured, limits) => {
        let current = configured;
        let sinceChange: number | null = null;
        for (const limit of limits) {
          const target = paceCeiling(configured, limit, r);
          // Samples a second apart until nothing changes (bounded: each step is at least one PACE_STEP).
          for (let i = 0; i < Math.ceil(1 / r.step) + 2 + Math.ceil(r.stepMs / 1000) * (Math.ceil(1 / r.step) + 2); i++) {
            const d = planPace({ configured, current, sinceChangeMs: sinceChange, starting: false }, { limit, otherPerMinute: null, low: false, confirmed: true }, r);
            if (d.kind === 'hold') {
              sinceChange = sinceChange === null ? null : sinceChange + 1000;
              continue;
            }
            if (d.kind === 'raise') assert.ok(d.rate === target || Math.abs(d.rate - current - configured * r.step) < 1e-6, 'a whole step, or the last one to the ceiling');
            current = d.rate;
            sinceChange = 0;
          }
          assert.ok(Math.abs(current - target) < 1e-6, `settles at ${target} (got ${current})`);
        }
      }),
      run(300),
    );
  });
});
