/**
 * The console's decisions that live on the server, as pure functions: the
 * health verdict, the share of the pace used, and the chart history's ring
 * buffer and downsampling.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { paceUsed, systemHealth } from '../src/visibility/health.ts';
import { downsample, Ring, type HistoryPoint } from '../src/visibility/history.ts';
import type { SystemStatus } from '../src/visibility/status.ts';

const NOW = Date.parse('2026-12-04T10:00:00Z');
function status(over: Partial<Pick<SystemStatus, 'account' | 'windows' | 'breakers' | 'alerts'>> = {}): Pick<SystemStatus, 'account' | 'windows' | 'breakers' | 'alerts'> {
  const window = (name: string) => ({
    name, ratePerMinute: 60, burst: 3, tokens: 3, refilledAt: NOW, pausedUntil: null, pauseReason: null, inFlight: 0, poolSize: 1,
    latencyP50Ms: null, latencyP95Ms: null, slotHoldP95Ms: null, dbNow: NOW, accountStoppedUntil: null, callsPerSecond: 0,
    configuredRatePerMinute: 60, configuredBurst: 3, observedLimitPerMinute: null, paceReason: null, pacedAt: null,
  });
  return {
    account: { dispatchStoppedUntil: null, stopReason: null, creditsRemaining: 100, maxCredits: 100, renewalAt: null, statusAt: null },
    windows: [window('primary'), window('sub1')],
    breakers: [],
    alerts: [],
    ...over,
  };
}

describe('health verdict', () => {
  test('HEALTHY when every window is open and nothing is raised', () => {
    const h = systemHealth(status());
    assert.equal(h.status, 'HEALTHY');
    assert.match(h.reasons[0]!, /2 windows open/);
  });
  test('DEGRADED names each paused window, open breaker and alert', () => {
    const s = status();
    s.windows[1] = { ...s.windows[1]!, pausedUntil: NOW + 30_000, pauseReason: 'RATE_LIMITED' };
    const h = systemHealth({ ...s, breakers: [{ api: 'dnslookup', state: 'OPEN', openedAt: new Date(NOW), retryAt: null }] as never, alerts: [{ key: 'AGE_PROMISE:BULK', severity: 'warning', message: 'BULK is late', raisedAt: new Date(NOW) }] as never });
    assert.equal(h.status, 'DEGRADED');
    assert.deepEqual(h.reasons, ['Window sub1 paused (RATE_LIMITED) until 2026-12-04T10:00:30Z', 'Breaker of dnslookup is OPEN', 'Alert AGE_PROMISE:BULK: BULK is late']);
  });
  test('a pause that has ended is not a reason', () => {
    const s = status();
    s.windows[0] = { ...s.windows[0]!, pausedUntil: NOW - 1, pauseReason: 'RATE_LIMITED' };
    assert.equal(systemHealth(s).status, 'HEALTHY');
  });
  test('STOPPED when the account is out of credits, or every window is paused; other reasons follow', () => {
    const out = systemHealth(status({ account: { dispatchStoppedUntil: new Date(NOW + 3_600_000), stopReason: 'credits exhausted', creditsRemaining: 0, maxCredits: 100, renewalAt: null, statusAt: null }, alerts: [{ key: 'CREDITS_EXHAUSTED', severity: 'page', message: 'out', raisedAt: new Date(NOW) }] as never }));
    assert.equal(out.status, 'STOPPED');
    assert.deepEqual(out.reasons, ['Dispatch stopped until 2026-12-04T11:00:00Z (credits exhausted)', 'Alert CREDITS_EXHAUSTED: out']);
    const s = status();
    s.windows = s.windows.map((w) => ({ ...w, pausedUntil: NOW + 1000, pauseReason: 'KEY_UNUSABLE' }));
    const all = systemHealth(s);
    assert.equal(all.status, 'STOPPED');
    assert.match(all.reasons[0]!, /Every window is paused/);
  });
});

describe('pace used', () => {
  test('calls per second over the paced rate per second; null when unlimited', () => {
    assert.equal(paceUsed({ ratePerMinute: 120, callsPerSecond: 1 }), 0.5);
    assert.equal(paceUsed({ ratePerMinute: 60, callsPerSecond: 0 }), 0);
    assert.equal(paceUsed({ ratePerMinute: null, callsPerSecond: 4 }), null);
  });
});

describe('chart history', () => {
  const point = (at: number, calls = 1, busy = 0): HistoryPoint => ({ at, callsPerSecond: calls, pacedPerSecond: 2, busy, poolSize: 4 });
  test('the ring keeps the newest points, oldest first, and answers a range', () => {
    const ring = new Ring(3);
    for (let i = 1; i <= 5; i++) ring.push(point(i * 1000));
    assert.deepEqual(ring.since(0).map((p) => p.at), [3000, 4000, 5000]);
    assert.deepEqual(ring.since(4000).map((p) => p.at), [4000, 5000]);
    assert.deepEqual(new Ring(2).since(0), []);
  });
  test('downsampling averages rates, keeps the busy peak, and leaves short series alone', () => {
    const points = [point(1, 1, 0), point(2, 3, 5), point(3, 2, 1), point(4, 4, 0)];
    assert.equal(downsample(points, 10).length, 4);
    const two = downsample(points, 2);
    assert.deepEqual(two.map((p) => [p.at, p.callsPerSecond, p.busy]), [[2, 2, 5], [4, 3, 1]]);
    assert.ok(downsample(Array.from({ length: 17_280 }, (_, i) => point(i)), 360).length <= 360);
  });
});

// The console's wording of the pace and the fairness lag lives in its browser module (plain JS,
// no types), loaded here by URL.
interface Wording {
  paceText(w: { paceUsed: number | null; ratePerMinute: number | null; callsPerSecond: number }): string;
  learnedText(w: { ratePerMinute: number | null; configuredRatePerMinute: number | null; observedLimitPerMinute: number | null; paceReason: string | null; pacedAt: string | null }): string | null;
  lagText(lag: number, bound: number): string;
}
const wording = (await import(new URL('../console/format.js', import.meta.url).href)) as Wording;

describe('console wording', () => {
  const w = { ratePerMinute: 54, configuredRatePerMinute: 162, observedLimitPerMinute: 60, paceReason: 'LIMIT', pacedAt: '2026-12-04T10:00:00Z' };
  test('pace used is against the learned rate; the configured rate and the reason show only when the learned one is lower', () => {
    assert.equal(wording.paceText({ paceUsed: 0.5, ratePerMinute: 54, callsPerSecond: 0.45 }), 'pace used 50% (0.5 of 0.9 calls/s)');
    assert.equal(wording.paceText({ paceUsed: null, ratePerMinute: null, callsPerSecond: 3 }), 'unlimited (3 calls/s)');
    assert.equal(wording.learnedText(w), 'learned 0.9 calls/s, below the configured 2.7 calls/s: the provider states a smaller window (stated 60/min), since 2026-12-04 10:00:00 UTC');
    assert.match(wording.learnedText({ ...w, paceReason: 'RATE_LIMITED', observedLimitPerMinute: null, pacedAt: null })!, /: the provider answered 429$/);
    assert.equal(wording.learnedText({ ...w, ratePerMinute: 162, paceReason: 'CLIMB' }), null, 'back at the configured rate');
    assert.equal(wording.learnedText({ ...w, ratePerMinute: null, configuredRatePerMinute: null }), null, 'unlimited');
  });
  test('the fairness lag against its bound, flagged past it', () => {
    assert.equal(wording.lagText(0.5, 1.25), 'lag 0.5 of bound 1.25 (40%)');
    assert.equal(wording.lagText(3, 2), 'lag 3 of bound 2 (150%, over the bound)');
  });
});
