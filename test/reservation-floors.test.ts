/**
 * Reserved shares are floors, whatever the weights: the pure model of the lease (scheduler/lease.ts
 * planPicks, which test/lease-differential.test.ts holds sluice_lease to) driven lease after lease
 * with every tenant backlogged on one paced window, against the ideal allocation: each reserved
 * tenant its reservation first, the rest by weight among all (reservedShares), and a capped
 * tenant's unused share going to the others in proportion to theirs. No database.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { planPicks, reservedWeight, RESERVED_MAX, type LeaseInput, type LeaseJob } from '../src/scheduler/lease.ts';

const SEED = 20_261_205;
const CLS = 'STANDARD' as const;

interface Tenant {
  weight: number;
  reservedShare: number;
  /** Calls in flight at most; every call answers within a step, so it bounds each step's take. */
  cap: number;
}

/** Fractions of the dispatches per tenant over `steps` steps of the pace (`tokens` each), every tenant backlogged throughout. */
function simulate(ts: readonly Tenant[], steps: number, tokens: number): number[] {
  const ids = ts.map((_, i) => `t${i}`);
  const vtime = ts.map(() => 0);
  const marked = ts.map(() => true);
  const served = ts.map(() => 0);
  let next = 0;
  let clock = 0;
  const jobs = (i: number): LeaseJob[] => Array.from({ length: 64 }, () => ({ id: `${ids[i]}-${next++}`, api: 'single', params: {} }));
  for (let step = 0; step < steps; step++) {
    // The pace adds `tokens` a step; the calls of the last step have answered. Leases follow each
    // other at once while they take something (a paced call ends its round; the next shares what is left).
    let bucket = tokens;
    const inFlight = ts.map(() => 0);
    for (let call = 0; call < 64 && bucket > 0; call++) {
      const input: LeaseInput = {
        classes: [CLS],
        queues: ts.map((_, i) => ({ tenantId: ids[i]!, jobClass: CLS, vtime: vtime[i]!, ready: marked[i]! })),
        tenants: ts.map((t, i) => ({
          tenantId: ids[i]!, weight: t.weight, cap: t.cap, inFlight: inFlight[i]!, quota: 1e12, used: 0,
          quotaPolicy: 'WAIT', quotaBlocked: false, suspended: false, reservedShare: t.reservedShare,
        })),
        jobs: Object.fromEntries(ts.map((_, i) => [`${ids[i]}/${CLS}`, jobs(i)])),
        tokens: bucket, room: 1_000_000, max: 256, leaseMax: 16, costs: {}, hold: [], batch: {}, batchMax: 1, batchQuantum: 1,
        clocks: { [CLS]: clock },
      };
      const picks = planPicks(input);
      bucket -= picks.tokens;
      for (const turn of picks.turns) {
        const i = ids.indexOf(turn.tenantId);
        served[i]! += turn.jobIds.length;
        inFlight[i]! += turn.jobIds.length;
      }
      ts.forEach((_, i) => {
        vtime[i] = picks.vtimes[`${ids[i]}/${CLS}`]!;
        marked[i] = picks.marked[`${ids[i]}/${CLS}`] ?? true;
      });
      clock = picks.clocks[CLS]!;
      if (picks.turns.length === 0) break;
    }
  }
  const total = served.reduce((a, b) => a + b, 0);
  return served.map((n) => n / total);
}

/**
 * The ideal allocation, written from the promise and not from the lease's weights: each reserved
 * tenant its reservation r, then the rest (1 - R) by weight among all, reserved ones included.
 */
function reservedShares(ts: ReadonlyArray<{ weight: number; reservedShare?: number }>): number[] {
  const R = Math.min(RESERVED_MAX, ts.reduce((a, t) => a + (t.reservedShare ?? 0), 0));
  const scale = R > 0 ? R / ts.reduce((a, t) => a + (t.reservedShare ?? 0), 0) : 1;
  const W = ts.reduce((a, t) => a + t.weight, 0);
  return ts.map((t) => (t.reservedShare ?? 0) * scale + ((1 - R) * t.weight) / W);
}

/**
 * The ideal: reservedShares over the backlogged tenants, then water-filling for the caps (a
 * tenant whose share of `tokens` a lease is above its cap gets its cap; what it leaves goes to the
 * others in proportion to their shares).
 */
function ideal(ts: readonly Tenant[], tokens: number): number[] {
  const shares = reservedShares(ts);
  const fixed = new Map<number, number>();
  for (;;) {
    const free = ts.map((_, i) => i).filter((i) => !fixed.has(i));
    const left = tokens - [...fixed.values()].reduce((a, b) => a + b, 0);
    const sum = free.reduce((a, i) => a + shares[i]!, 0);
    const over = free.filter((i) => (left * shares[i]!) / sum > ts[i]!.cap);
    if (over.length === 0) {
      const alloc = ts.map((_, i) => fixed.get(i) ?? (left * shares[i]!) / sum);
      const total = alloc.reduce((a, b) => a + b, 0);
      return alloc.map((x) => x / total);
    }
    for (const i of over) fixed.set(i, ts[i]!.cap);
  }
}

describe('reservations are floors for any weights', () => {
  test('A (weight 1, reserved 0.7), B (weight 4, reserved 0.1), C (weight 1): within 5 % of r + (1 - R) × w / W', () => {
    const ts = [
      { weight: 1, reservedShare: 0.7, cap: 1000 },
      { weight: 4, reservedShare: 0.1, cap: 1000 },
      { weight: 1, reservedShare: 0, cap: 1000 },
    ];
    const want = ideal(ts, 8);
    assert.deepEqual(want.map((x) => Math.round(x * 1000) / 1000), [0.733, 0.233, 0.033]);
    const got = simulate(ts, 1500, 8);
    for (let i = 0; i < ts.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= 0.05 * want[i]! + 1e-9, `tenant ${i}: ${got[i]} against ${want[i]}`);
    assert.ok(got[0]! >= 0.7 && got[1]! >= 0.1, `each reservation is a floor (${got.join(', ')})`);
  });

  test("the weights go as the shares: r + (1 - R) x w / W each, summing to 1; an unreserved tenant's weight is its own", () => {
    assert.equal(reservedWeight(3, 0, 0.5, 10), 3);
    const s = reservedShares([{ weight: 2, reservedShare: 0.5 }, { weight: 2 }, { weight: 6, reservedShare: 0.2 }]);
    assert.deepEqual(s.map((x) => Math.round(x * 1e6) / 1e6), [0.56, 0.06, 0.38]);
    // Shares read beyond RESERVED_MAX count as it: the rest is always shared by weight, so an
    // unreserved tenant keeps a part however much is reserved.
    const over = reservedShares([{ weight: 1, reservedShare: 0.6 }, { weight: 1, reservedShare: 0.6 }, { weight: 1 }]);
    assert.ok(over[2]! > 0.01, `an unreserved tenant keeps a part (${over[2]})`);
  });

  test('over random weights, reservations and caps, every tenant is within 5 % of the ideal (absolute 0.01 for the smallest)', () => {
    const tenantArb = fc.record({
      weight: fc.constantFrom(1, 1, 2, 3, 4, 8),
      reservedShare: fc.constantFrom(0, 0, 0, 0.05, 0.1, 0.2, 0.3, 0.5),
      cap: fc.constantFrom(1000, 1000, 1000, 2, 3),
    });
    fc.assert(
      fc.property(fc.array(tenantArb, { minLength: 2, maxLength: 6 }), fc.constantFrom(4, 8, 12), (raw, tokens) => {
        // The admin API keeps a class's reservations at most RESERVED_MAX together.
        let sum = 0;
        const ts = raw.map((t) => {
          const r = sum + t.reservedShare <= RESERVED_MAX ? t.reservedShare : 0;
          sum += r;
          return { ...t, reservedShare: r };
        });
        const want = ideal(ts, tokens);
        const got = simulate(ts, 800, tokens);
        for (let i = 0; i < ts.length; i++) {
          assert.ok(Math.abs(got[i]! - want[i]!) <= Math.max(0.05 * want[i]!, 0.01), `tenant ${i} ${JSON.stringify(ts[i])}: ${got[i]} against ${want[i]} (${JSON.stringify(ts)}, ${tokens} tokens)`);
        }
      }),
      { seed: SEED, numRuns: 60 },
    );
  });
});
