/**
 * The provider simulator: the pure limit arithmetic, then its behaviour over
 * real HTTP on 127.0.0.1 (continuous refill, cooldown, concurrency, renewal,
 * determinism, admin endpoints, stats) and its env configuration.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { DEFAULT_CATALOG } from '../src/config/apis.ts';
import { createProviderClient } from '../src/provider/client.ts';
import type { CallOutcome, ProviderClient } from '../src/provider/types.ts';
import { dnsLookup, emailValidator, exchangeRate } from '../src/simulator/data.ts';
import {
  addMonthUtc,
  checkCooldown,
  defaultBurst,
  newWindow,
  refill,
  renewIfDue,
  takeToken,
  takeTokens,
  type RateConfig,
} from '../src/simulator/limits.ts';
import {
  BAD_ANSWER_KINDS,
  createEngine,
  HTML_PAGE,
  INVALID_UTF8,
  sampleLatencies,
  simulatorOptionsFromEnv,
  startSimulator,
  type Simulator,
  type SimulatorOptions,
} from '../src/simulator/index.ts';

const FX = { currency1: 'USD', currency2: 'EUR' };

async function withSim(opts: SimulatorOptions, fn: (sim: Simulator, client: ProviderClient) => Promise<void>) {
  const sim = await startSimulator(opts);
  const client = createProviderClient({ baseUrl: sim.url, timeoutMs: 3000, catalog: sim.catalog });
  try {
    await fn(sim, client);
  } finally {
    await client.close();
    await sim.stop();
  }
}

const fx = (client: ProviderClient, apiKey: string) => client.call({ api: 'exchangerate', params: FX, apiKey });
const kinds = (outcomes: CallOutcome[]) => outcomes.map((o) => o.kind);
const count = (outcomes: CallOutcome[], kind: string) => outcomes.filter((o) => o.kind === kind).length;

// ------------------------------------------------------------------ pure arithmetic

describe('limits (pure)', () => {
  const cfg: RateConfig = { ratePerMinute: 600, burst: 3, cooldownMs: 1000 };

  test('the bucket refills continuously at rate/60000 per ms, capped at burst', () => {
    assert.equal(refill({ tokens: 0, atMs: 0 }, 100, cfg).tokens, 1);
    assert.equal(refill({ tokens: 0, atMs: 0 }, 250, cfg).tokens, 2.5);
    assert.equal(refill({ tokens: 0, atMs: 0 }, 10_000, cfg).tokens, 3);
    assert.equal(defaultBurst(600), 30);
    assert.equal(defaultBurst(180), 9);
    assert.equal(defaultBurst(5), 1);
  });

  test('an empty bucket trips the cooldown; calls during it restart it', () => {
    let w = newWindow(cfg, 0);
    for (let i = 0; i < 3; i++) {
      const t = takeToken(w, 0, cfg);
      assert.ok(t.ok);
      w = t.window;
    }
    const tripped = takeToken(w, 50, cfg);
    assert.equal(tripped.ok, false);
    if (tripped.ok) return;
    assert.equal(tripped.retryAfterSeconds, 1);
    assert.equal(tripped.window.cooldownUntilMs, 1050);
    const during = checkCooldown(tripped.window, 900, cfg);
    assert.ok(during.inCooldown);
    if (!during.inCooldown) return;
    assert.equal(during.window.cooldownUntilMs, 1900, 'extended to now + cooldown');
    assert.equal(checkCooldown(during.window, 1900, cfg).inCooldown, false);
    // By then the bucket has refilled.
    assert.ok(takeToken(during.window, 1900, cfg).ok);
  });

  test('a batch takes one token per item; refused items learn when their token comes', () => {
    const w = { bucket: { tokens: 2.5, atMs: 0 }, cooldownUntilMs: 0 };
    const slow: RateConfig = { ratePerMinute: 60, burst: 10, cooldownMs: 50_000 };
    const t = takeTokens(w, 5, 0, slow, false);
    assert.equal(t.granted, 2);
    assert.deepEqual(t.retryAfterSeconds, [1, 2, 3]); // 0.5 left: 0.5 s, 1.5 s, 2.5 s, rounded up
    assert.equal(t.window.cooldownUntilMs, 0);
    const tripping = takeTokens(w, 5, 0, slow, true);
    assert.deepEqual(tripping.retryAfterSeconds, [50, 50, 50]);
    assert.equal(tripping.window.cooldownUntilMs, 50_000);
  });

  test('renewal resets the balance on the anniversary and moves it a month on', () => {
    const jan31 = Date.parse('2025-01-31T10:00:00Z');
    assert.equal(new Date(addMonthUtc(jan31)).toISOString(), '2025-02-28T10:00:00.000Z');
    assert.equal(new Date(addMonthUtc(Date.parse('2025-03-15T00:00:00Z'))).toISOString(), '2025-04-15T00:00:00.000Z');
    const c = { balance: -4, used: 204, max: 200, renewalAtMs: 1000 };
    assert.equal(renewIfDue(c, 999), c);
    const r = renewIfDue(c, 1000);
    assert.deepEqual([r.balance, r.used], [200, 0]);
    assert.equal(r.renewalAtMs, addMonthUtc(1000));
  });

  test('latency: seeded log-normal with the asked median and p95', () => {
    const a = sampleLatencies(42, 20_000, 100, 400);
    assert.deepEqual(a.slice(0, 50), sampleLatencies(42, 50, 100, 400), 'same seed, same samples');
    assert.notDeepEqual(a.slice(0, 50), sampleLatencies(43, 50, 100, 400));
    const sorted = [...a].sort((x, y) => x - y);
    const median = sorted[Math.floor(sorted.length / 2)]!;
    const p95 = sorted[Math.floor(sorted.length * 0.95)]!;
    assert.ok(Math.abs(median - 100) < 6, `median ${median}`);
    assert.ok(Math.abs(p95 - 400) < 30, `p95 ${p95}`);
    assert.deepEqual(sampleLatencies(1, 3, 80, 80), [80, 80, 80], 'p95 <= median: constant');
  });
});

// ------------------------------------------------------------------ data

describe('deterministic data', () => {
  test('emailvalidator fields and flags', () => {
    const r = emailValidator({ email: 'jane@mailinator.com' });
    assert.ok(r.ok);
    if (!r.ok) return;
    assert.deepEqual(Object.keys(r.data as object).sort(), [
      'domain',
      'email',
      'hasTypo',
      'isCompanyEmail',
      'isDisposable',
      'isFreeEmail',
      'isMxValid',
      'isRegexValid',
      'isRoleAccount',
      'isValid',
      'riskLevel',
      'riskScore',
      'suggestedCorrection',
      'username',
    ]);
    assert.equal((r.data as { isDisposable: boolean }).isDisposable, true);
    const typo = emailValidator({ email: 'bob@gmial.com' });
    assert.ok(typo.ok && (typo.data as { hasTypo: boolean; suggestedCorrection: string }).suggestedCorrection === 'bob@gmail.com');
    const company = emailValidator({ email: 'info@acme-widgets.com' });
    assert.ok(company.ok);
    if (company.ok) {
      const d = company.data as { isCompanyEmail: boolean; isRoleAccount: boolean; isFreeEmail: boolean };
      assert.deepEqual([d.isCompanyEmail, d.isRoleAccount, d.isFreeEmail], [true, true, false]);
    }
    const junk = emailValidator({ email: 'not-an-email' });
    assert.ok(junk.ok && (junk.data as { isRegexValid: boolean; riskLevel: string }).riskLevel === 'high');
  });

  test('exchangerate is deterministic and consistent both ways; dnslookup has every record type', () => {
    const a = exchangeRate({ currency1: 'usd', currency2: 'EUR' });
    const b = exchangeRate({ currency1: 'EUR', currency2: 'USD' });
    assert.ok(a.ok && b.ok);
    if (!a.ok || !b.ok) return;
    const ra = (a.data as { exchangeRate: number }).exchangeRate;
    const rb = (b.data as { exchangeRate: number }).exchangeRate;
    assert.equal(ra, 0.92);
    assert.ok(Math.abs(ra * rb - 1) < 1e-5);
    assert.deepEqual(exchangeRate({ currency1: 'XAA', currency2: 'XBB' }), exchangeRate({ currency1: 'XAA', currency2: 'XBB' }));
    assert.equal(exchangeRate({ currency1: 'US', currency2: 'EUR' }).ok, false);
    const d = dnsLookup({ domain: 'www.acme.io' });
    assert.ok(d.ok);
    if (!d.ok) return;
    const data = d.data as { domain: string; records: Record<string, unknown[]> };
    assert.equal(data.domain, 'www.acme.io');
    assert.deepEqual(Object.keys(data.records), ['A', 'AAAA', 'MX', 'TXT', 'CNAME', 'NS']);
    assert.deepEqual(data.records.MX![0], { exchange: 'mx1.www.acme.io', priority: 10 });
    assert.deepEqual(dnsLookup({ domain: 'www.acme.io' }), d);
  });
});

// ------------------------------------------------------------------ windows over HTTP

describe('rate windows over HTTP', () => {
  test('a steady stream at 95% of the limit never trips; the same calls at once do; windows are per key', async () => {
    // 600/min = 10/s, default burst 30. 95 calls at 9.5/s take 10 s.
    await withSim({ ratePerMinute: 600, cooldownSeconds: 1, subKeys: ['apv_sbk_burst'] }, async (sim, client) => {
      const n = 95;
      const intervalMs = 1000 / 9.5;
      const start = performance.now();
      const steady: Promise<CallOutcome>[] = [];
      let burst: Promise<CallOutcome[]> | null = null;
      let burstStart = 0;
      let burstMs = 0;
      for (let i = 0; i < n; i++) {
        const wait = start + i * intervalMs - performance.now();
        if (wait > 0) await sleep(wait);
        steady.push(fx(client, sim.apiKey));
        // Halfway through, the same number of calls at once on another key.
        if (i === 47) {
          burstStart = performance.now();
          burst = Promise.all(Array.from({ length: n }, () => fx(client, 'apv_sbk_burst'))).then((out) => {
            burstMs = performance.now() - burstStart;
            return out;
          });
        }
      }
      const steadyOut = await Promise.all(steady);
      const burstOut = await burst!;
      // The bucket refills at 10/s while the burst arrives: on a loaded machine 95 "simultaneous"
      // calls can take a second or more to reach the server, so the refill during that time is
      // allowed for (30 burst + 10/s x the burst's duration, + 1 for a token refilled at the edge).
      const mayBill = 31 + Math.ceil((10 * burstMs) / 1000);
      assert.equal(count(steadyOut, 'rate_limited'), 0, `steady stream got 429s: ${kinds(steadyOut).join(',')}`);
      assert.equal(count(steadyOut, 'billed'), n);
      assert.ok(count(burstOut, 'rate_limited') >= n - mayBill, `burst refused ${count(burstOut, 'rate_limited')} (took ${burstMs.toFixed(0)} ms)`);
      assert.ok(count(burstOut, 'billed') <= mayBill && count(burstOut, 'billed') >= 30, `burst billed ${count(burstOut, 'billed')} (took ${burstMs.toFixed(0)} ms)`);
      assert.equal(count(burstOut, 'billed') + count(burstOut, 'rate_limited'), n, 'every burst call was billed or refused');
      const stats = sim.stats();
      assert.equal(stats.keys[sim.apiKey]!.rateLimited, 0);
      assert.equal(stats.keys[sim.apiKey]!.calls, n);
      const timeline = Object.values(stats.keys[sim.apiKey]!.timeline);
      assert.equal(timeline.reduce((a, b) => a + b, 0), n);
      assert.ok(Math.max(...timeline) <= 11, `steady per-second counts ${timeline}`);
      assert.equal(stats.keys.apv_sbk_burst!.rateLimited, count(burstOut, 'rate_limited'));
      assert.equal(Object.values(stats.keys.apv_sbk_burst!.timeline).reduce((a, b) => a + b, 0), n);
    });
  });

  test('a key in cooldown keeps refusing and each call extends the cooldown', async () => {
    await withSim({ ratePerMinute: 600, burst: 2, cooldownSeconds: 1 }, async (sim, client) => {
      assert.deepEqual(kinds([await fx(client, sim.apiKey), await fx(client, sim.apiKey)]), ['billed', 'billed']);
      const trip = await fx(client, sim.apiKey);
      assert.equal(trip.kind, 'rate_limited');
      assert.equal(trip.retryAfterSeconds, 1);
      // 5 calls 300 ms apart: 1.5 s in all, past the 1 s cooldown, yet every one is refused
      // because each restarts it (the bucket itself refilled long ago).
      const during: CallOutcome[] = [];
      for (let i = 0; i < 5; i++) {
        await sleep(300);
        during.push(await fx(client, sim.apiKey));
      }
      assert.deepEqual(kinds(during), Array(5).fill('rate_limited'));
      const s = sim.stats().keys[sim.apiKey]!;
      assert.equal(s.callsInCooldown, 5);
      assert.equal(s.rateLimited, 6);
      assert.ok(s.cooldownUntil !== null);
      await sleep(1100);
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');
      assert.equal(sim.stats().keys[sim.apiKey]!.cooldownUntil, null);
    });
  });

  test('the account-wide concurrency limit answers 429 retry-after 1 and counts max concurrency', async () => {
    // PRO: 20 concurrent calls; two keys share the account limit.
    await withSim({ ratePerMinute: 6000, latencyMs: 300, latencyP95Ms: 300, subKeys: ['apv_sbk_2'] }, async (sim, client) => {
      const calls = Array.from({ length: 25 }, (_, i) => fx(client, i % 2 ? 'apv_sbk_2' : sim.apiKey));
      const out = await Promise.all(calls);
      assert.equal(count(out, 'billed'), 20);
      const refused = out.filter((o) => o.kind === 'rate_limited');
      assert.equal(refused.length, 5);
      assert.ok(refused.every((o) => o.httpStatus === 429 && o.retryAfterSeconds === 1 && /concurrent/.test(o.message ?? '')));
      const s = sim.stats();
      assert.equal(s.account.maxConcurrency, 20);
      assert.equal(s.account.inFlight, 0);
      assert.equal(s.totals.concurrencyLimited, 5);
      assert.equal(s.totals.rateLimited, 0, 'concurrency refusals are counted apart from the window');
      assert.equal(s.keys[sim.apiKey]!.maxConcurrency + s.keys.apv_sbk_2!.maxConcurrency, 20);
    });
  });

  test('Mega (no per-minute ceiling) still has its concurrency limit; 503 response configurable', async () => {
    await withSim(
      { plan: 'MEGA', latencyMs: 200, latencyP95Ms: 200, concurrencyLimitResponse: { status: 503, retryAfterSeconds: 2 } },
      async (sim, client) => {
        const out = await Promise.all(Array.from({ length: 55 }, () => fx(client, sim.apiKey)));
        assert.equal(count(out, 'billed'), 50);
        const refused = out.filter((o) => o.kind !== 'billed');
        assert.ok(refused.every((o) => o.kind === 'server_error' && o.httpStatus === 503 && o.retryAfterSeconds === 2));
        assert.equal(out[0]!.status?.rateLimitLimit, null, 'x-rate-limit-limit: unlimited');
        sim.setConditions({ latencyMs: 0, latencyP95Ms: 0 });
        const seq: CallOutcome[] = [];
        for (let i = 0; i < 100; i++) seq.push(await fx(client, sim.apiKey));
        assert.equal(count(seq, 'billed'), 100, 'no window to trip');
      },
    );
  });

  test('rate and burst change at run time', async () => {
    await withSim({ ratePerMinute: 60, burst: 1, cooldownSeconds: 0.2 }, async (sim, client) => {
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');
      assert.equal((await fx(client, sim.apiKey)).kind, 'rate_limited');
      await sleep(250);
      sim.setConditions({ ratePerMinute: 6000, burst: 50 });
      await sleep(100); // refills 10 tokens at the new rate
      const out = await Promise.all(Array.from({ length: 10 }, () => fx(client, sim.apiKey)));
      assert.equal(count(out, 'billed'), 10);
      assert.equal(out.at(-1)!.status?.rateLimitLimit, 6000);
    });
  });
});

// ------------------------------------------------------------------ credits and renewal

describe('credits', () => {
  test('renewal resets the balance at the renewal time (driven by the now option)', async () => {
    let now = Date.parse('2025-03-10T12:00:00Z');
    const renewalAt = new Date(now + 1000);
    await withSim({ credits: 2, maxCredits: 100, renewalAt, now: () => now }, async (sim, client) => {
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');
      const out = await fx(client, sim.apiKey);
      assert.equal(out.kind, 'credits_exhausted');
      assert.equal(out.status?.remainingCredits, 0);
      assert.equal(out.retryAfterSeconds, 1, 'retry-after points at the renewal');
      now += 1000;
      const renewed = await fx(client, sim.apiKey);
      assert.equal(renewed.kind, 'billed');
      assert.equal(renewed.status?.remainingCredits, 99);
      assert.equal(renewed.status?.creditsUsed, 1);
      assert.deepEqual(renewed.status?.renewalAt, new Date('2025-04-10T12:00:01Z'));
      assert.equal(sim.stats().account.creditsRemaining, 99);
    });
  });

  test('only 200s are billed; the balance is shared by every key', async () => {
    await withSim({ credits: 100, subKeys: ['apv_sbk_a'], ratePerMinute: 60, burst: 1 }, async (sim, client) => {
      await fx(client, sim.apiKey); // 200: 1
      await fx(client, sim.apiKey); // 429
      await client.call({ api: 'exchangerate', params: {}, apiKey: 'apv_sbk_a' }); // 400 (takes the sub-key's token)
      await client.call({ api: 'nope', params: {}, apiKey: 'apv_sbk_a' }); // 404
      await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: 'apv_sbk_x' }); // 401
      const s = sim.stats();
      assert.equal(s.account.creditsRemaining, 99);
      assert.equal(s.totals.creditsBilled, 1);
      assert.equal(s.totals.billedCalls, 1);
      assert.equal(s.unknownKeyCalls, 1);
      assert.deepEqual(s.keys.apv_sbk_a!.responses, { '400': 1, '404': 1 });
    });
  });
});

// ------------------------------------------------------------------ determinism

describe('determinism', () => {
  test('same seed: same latencies and fault sequence; another seed differs', () => {
    const run = (seed: number) => {
      const engine = createEngine({ seed, latencyMs: 100, latencyP95Ms: 300, ratePerMinute: null, conditions: { errorRate: 0.5 } });
      return Array.from({ length: 40 }, () => {
        const r = engine.handleCall({ apiKey: 'apv_demo_primary', api: 'exchangerate', params: FX });
        if (r.slot) engine.release(r.slot);
        return `${r.status}@${r.delayMs?.toFixed(3)}`;
      });
    };
    assert.deepEqual(run(7), run(7));
    assert.notDeepEqual(run(7), run(8));
    const statuses = run(7).map((s) => s.split('@')[0]);
    assert.ok(statuses.includes('200') && statuses.includes('503'));
  });

  test('same seed over HTTP: the same sequence of outcomes', async () => {
    const seq = async (seed: number) => {
      const out: string[] = [];
      await withSim({ seed, ratePerMinute: null, conditions: { errorRate: 0.3 } }, async (sim, client) => {
        for (let i = 0; i < 30; i++) out.push((await fx(client, sim.apiKey)).kind);
      });
      return out;
    };
    const a = await seq(11);
    assert.deepEqual(await seq(11), a);
    assert.ok(a.includes('server_error') && a.includes('billed'));
  });
});

// ------------------------------------------------------------------ bad answers

describe('bad answers (HTTP 200, billed, unstorable or malformed)', () => {
  const DNS = { domain: 'example.com' };
  /** One raw call: status, content type and the body's bytes, as they came off the socket. */
  async function raw(sim: Simulator, api: string, params: Record<string, string>) {
    const res = await fetch(`${sim.url}/${api}?${new URLSearchParams(params)}`, { headers: { 'x-api-key': sim.apiKey } });
    return { status: res.status, type: res.headers.get('content-type') ?? '', bytes: Buffer.from(await res.arrayBuffer()) };
  }
  async function rawBatch(sim: Simulator, api: string, items: Record<string, string>[]) {
    const res = await fetch(`${sim.url}/${api}/batch`, {
      method: 'POST',
      headers: { 'x-api-key': sim.apiKey, 'content-type': 'application/json' },
      body: JSON.stringify({ requests: items.map((params, i) => ({ id: String(i), params })) }),
    });
    return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()) };
  }
  const strict = (b: Buffer) => new TextDecoder('utf-8', { fatal: true }).decode(b);

  test('each kind, set per API over POST /admin/conditions, answers 200 with its body and bills like a success', async () => {
    await withSim({ ratePerMinute: 6000 }, async (sim) => {
      const cost = sim.catalog.get('dnslookup')!.creditCost;
      for (const kind of BAD_ANSWER_KINDS) {
        const r = await fetch(`${sim.adminUrl}/conditions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ apis: { dnslookup: { badAnswer: { kind, hugeBytes: 300_000 } } } }),
        });
        assert.equal(r.status, 200, kind);
        const before = sim.stats().totals;
        const a = await raw(sim, 'dnslookup', DNS);
        const after = sim.stats().totals;
        assert.equal(a.status, 200, kind);
        assert.deepEqual([after.billedCalls - before.billedCalls, after.creditsBilled - before.creditsBilled, after.badAnswers - before.badAnswers], [1, cost, 1], kind);
        const text = a.bytes.toString('utf8');
        switch (kind) {
          case 'nul':
            assert.match(text, /\\u0000/);
            assert.equal((JSON.parse(text) as { status: string }).status, 'ok');
            assert.ok(JSON.stringify(JSON.parse(text)).includes('\\u0000'));
            break;
          case 'lone-surrogate':
            assert.match(text, /\\ud800/);
            assert.equal((JSON.parse(text) as { data: { domain: string } }).data.domain.includes('\ud800'), true);
            break;
          case 'html':
            assert.equal(text, HTML_PAGE);
            assert.match(a.type, /text\/html/);
            break;
          case 'truncated-json':
            assert.throws(() => JSON.parse(text));
            assert.ok(text.startsWith('{"status":"ok"'));
            break;
          case 'invalid-utf8':
            assert.ok(a.bytes.includes(INVALID_UTF8));
            assert.throws(() => strict(a.bytes));
            break;
          case 'huge':
            assert.equal(a.bytes.length, 300_000);
            assert.equal((JSON.parse(text) as { status: string }).status, 'ok');
            break;
        }
        // Another API is untouched by a per-API condition.
        const fxAnswer = await raw(sim, 'exchangerate', FX);
        assert.equal((JSON.parse(strict(fxAnswer.bytes)) as { status: string }).status, 'ok');
      }
      // Refusals stay refusals: a bad answer replaces only a 200 (a 400 is neither bad nor billed).
      const before = sim.stats().totals;
      assert.equal((await raw(sim, 'dnslookup', {})).status, 400);
      assert.equal(sim.stats().totals.billedCalls, before.billedCalls);
      assert.equal(sim.stats().totals.badAnswers, before.badAnswers);
      const bad = await fetch(`${sim.adminUrl}/conditions`, { method: 'POST', body: JSON.stringify({ badAnswer: { kind: 'gzip' } }) });
      assert.equal(bad.status, 400);
    });
  });

  test('account-wide through setConditions, with a probability that replays by seed; batch items and bodies', async () => {
    await withSim({ ratePerMinute: 60_000, burst: 1000 }, async (sim) => {
      sim.setConditions({ badAnswer: { probability: 0.5, kind: 'nul' } });
      let bad = 0;
      for (let i = 0; i < 40; i++) if ((await raw(sim, 'exchangerate', FX)).bytes.toString().includes('\\u0000')) bad++;
      assert.equal(bad, sim.stats().totals.badAnswers);
      assert.ok(bad > 5 && bad < 35, `about half bad, got ${bad}`);
      assert.equal(sim.stats().totals.billedCalls, 40);

      // Value kinds corrupt items one by one; every item is billed.
      sim.setConditions({ badAnswer: { probability: 1, kind: 'lone-surrogate' } });
      sim.resetStats();
      const b = await rawBatch(sim, 'exchangerate', [FX, FX, { currency1: 'USD' }]);
      const body = JSON.parse(b.bytes.toString('utf8')) as { status: string; results: { status: number; data?: unknown }[] };
      assert.deepEqual(body.results.map((r) => r.status), [200, 200, 400]);
      assert.ok(body.results.slice(0, 2).every((r) => JSON.stringify(r.data).includes('\\ud800')));
      assert.deepEqual([sim.stats().totals.billedCalls, sim.stats().totals.badAnswers], [2, 2]);

      // Body kinds spoil the batch as a whole, once; its items are billed as they would have been.
      sim.setConditions({ badAnswer: { probability: 1, kind: 'truncated-json' } });
      sim.resetStats();
      const t = await rawBatch(sim, 'exchangerate', [FX, FX]);
      assert.equal(t.status, 200);
      assert.throws(() => JSON.parse(t.bytes.toString('utf8')));
      assert.deepEqual([sim.stats().totals.billedCalls, sim.stats().totals.badAnswers], [2, 1]);

      sim.setConditions({ badAnswer: null });
      assert.equal((JSON.parse((await raw(sim, 'exchangerate', FX)).bytes.toString()) as { status: string }).status, 'ok');
    });
    // Same seed, same sequence of bad answers.
    const seq = (seed: number) => {
      const e = createEngine({ seed, ratePerMinute: null, conditions: { badAnswer: { probability: 0.5, kind: 'html' } } });
      return Array.from({ length: 20 }, () => String(e.handleCall({ apiKey: 'apv_demo_primary', api: 'exchangerate', params: FX }).body).startsWith('<'));
    };
    assert.deepEqual(seq(3), seq(3));
    assert.notDeepEqual(seq(3), seq(4));
  });
});

// ------------------------------------------------------------------ admin endpoints and stats

describe('admin endpoints', () => {
  const post = (sim: Simulator, path: string, body?: unknown) =>
    fetch(`${sim.adminUrl}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });

  test('change conditions, keys and credits mid-run over HTTP', async () => {
    await withSim({ subKeys: ['apv_sbk_a'], ratePerMinute: 6000 }, async (sim, client) => {
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');

      let r = await post(sim, '/conditions', { apis: { exchangerate: { outage: 503 } } });
      assert.equal(r.status, 200);
      assert.equal(((await r.json()) as { apis: Record<string, { outage: number }> }).apis.exchangerate!.outage, 503);
      assert.equal((await fx(client, sim.apiKey)).httpStatus, 503);
      await post(sim, '/conditions', { apis: { exchangerate: null } });
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');

      r = await post(sim, '/conditions', { errorRate: 2 });
      assert.equal(r.status, 400);
      assert.match(((await r.json()) as { error: string }).error, /errorRate/);
      assert.equal((await post(sim, '/conditions', { bogus: 1 })).status, 400);

      assert.equal((await post(sim, '/keys/apv_sbk_a/deactivate')).status, 200);
      assert.equal((await fx(client, 'apv_sbk_a')).kind, 'key_unusable');
      await post(sim, '/keys/apv_sbk_a/activate');
      assert.equal((await fx(client, 'apv_sbk_a')).kind, 'billed');
      assert.equal((await post(sim, '/keys/apv_sbk_zzz/deactivate')).status, 404);

      await post(sim, '/keys/apv_sbk_a/scope', { apis: ['dnslookup'] });
      assert.equal((await fx(client, 'apv_sbk_a')).httpStatus, 403);
      await post(sim, '/keys/apv_sbk_a/scope', { apis: null });

      assert.equal((await post(sim, '/keys', { key: 'apv_sbk_new' })).status, 200);
      assert.equal((await fx(client, 'apv_sbk_new')).kind, 'billed');
      assert.equal((await post(sim, '/keys', { key: 'apv_bad_sub' })).status, 400);

      await post(sim, '/credits', { credits: 0 });
      assert.equal((await fx(client, sim.apiKey)).kind, 'credits_exhausted');
      await post(sim, '/renew');
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');

      await post(sim, '/conditions', { hang: { afterMs: null } });
      const hung = await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey, timeoutMs: 100 });
      assert.equal(hung.kind, 'timeout');
      await post(sim, '/conditions', { hang: null });

      const stats = (await (await fetch(`${sim.adminUrl}/stats`)).json()) as { totals: { calls: number }; account: { creditsRemaining: number } };
      assert.equal(stats.totals.calls, 10);
      assert.equal(stats.account.creditsRemaining, sim.stats().account.creditsRemaining);
      const reset = (await (await post(sim, '/reset-stats')).json()) as { totals: { calls: number } };
      assert.equal(reset.totals.calls, 0);
      assert.equal((await fetch(`${sim.adminUrl}/nope`)).status, 404);
      const acct = (await (await fetch(`${sim.adminUrl}/account`)).json()) as { keys: { key: string }[] };
      assert.deepEqual(acct.keys.map((k) => k.key), [sim.apiKey, 'apv_sbk_a', 'apv_sbk_new']);
    });
  });

  test('stats: calls, timeline, 429 split, max concurrency, credits billed, calls in cooldown', async () => {
    await withSim({ ratePerMinute: 600, burst: 3, cooldownSeconds: 5, credits: 4 }, async (sim, client) => {
      // 3 tokens: 3 billed at 1 credit (balance 1); then the window trips, the next call is in cooldown.
      const out = [];
      for (let i = 0; i < 5; i++) out.push(await fx(client, sim.apiKey));
      assert.deepEqual(kinds(out), ['billed', 'billed', 'billed', 'rate_limited', 'rate_limited']);
      sim.setConditions({ cooldownSeconds: 0, ratePerMinute: 6000, burst: 10 });
      await sleep(50);
      out.push(await fx(client, sim.apiKey)); // billed, balance 0
      out.push(await fx(client, sim.apiKey)); // credits
      assert.deepEqual(kinds(out.slice(5)), ['billed', 'credits_exhausted']);
      const s = sim.stats().keys[sim.apiKey]!;
      assert.equal(s.calls, 7);
      assert.equal(s.rateLimited, 2);
      assert.equal(s.callsInCooldown, 1);
      assert.equal(s.creditsExhausted, 1);
      assert.equal(s.billedCalls, 4);
      assert.equal(s.creditsBilled, 4);
      assert.equal(s.maxConcurrency, 1);
      assert.deepEqual(s.responses, { '200': 4, '429': 3 });
      assert.equal(Object.values(s.timeline).reduce((a, b) => a + b, 0), 7);
      assert.equal(sim.stats().account.creditsRemaining, 0);
    });
  });

  test('call log: every call and batch item with its params, status and credits, paged over HTTP', async () => {
    await withSim({ ratePerMinute: 600, burst: 4, cooldownSeconds: 0, callLog: true }, async (sim, client) => {
      assert.equal((await fx(client, sim.apiKey)).kind, 'billed');
      await client.call({ api: 'dnslookup', params: {}, apiKey: sim.apiKey }); // 400: missing domain, not billed
      const batch = await client.callBatch({ api: 'dnslookup', apiKey: sim.apiKey, items: ['a', 'b', 'c'].map((d) => ({ id: d, params: { domain: `${d}.example.com` } })) });
      assert.equal(batch.call.kind, 'billed');
      // The bucket held 4: the batch's third item had no token (per-item 429, not billed).
      sim.setConditions({ hang: { probability: 1, afterMs: null } });
      await sleep(200); // a token for the next call (10 a second)
      assert.equal((await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey, timeoutMs: 100 })).kind, 'timeout');
      await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_unknown' }); // unknown key: not logged

      const all = sim.calls();
      assert.equal(all.enabled, true);
      const rows = all.calls.map((c) => [c.api, c.params.domain ?? c.params.currency1 ?? null, c.status, c.credits, c.batch]);
      assert.deepEqual(rows, [
        ['exchangerate', 'USD', 200, 1, false],
        ['dnslookup', null, 400, 0, false],
        ['dnslookup', 'a.example.com', 200, 1, true],
        ['dnslookup', 'b.example.com', 200, 1, true],
        ['dnslookup', 'c.example.com', 429, 0, true],
        ['exchangerate', 'USD', null, 0, false], // a hang that never answers: no status
      ]);
      // Billed credits in the log add up to the account's.
      assert.equal(all.calls.reduce((a, c) => a + c.credits, 0), sim.stats().totals.creditsBilled);
      assert.deepEqual(all.calls.map((c) => c.seq), [1, 2, 3, 4, 5, 6]);
      // Each answer is stamped as the server writes it, after its latency; a hang never is.
      assert.deepEqual(all.calls.map((c) => c.answeredAtMs !== null && c.answeredAtMs >= c.atMs), [true, true, true, true, true, false]);

      const page = (await (await fetch(`${sim.adminUrl}/calls?since=2&limit=2`)).json()) as { calls: { seq: number }[]; next: number };
      assert.deepEqual([page.calls.map((c) => c.seq), page.next], [[3, 4], 4]);
      const rest = (await (await fetch(`${sim.adminUrl}/calls?since=${page.next}`)).json()) as { calls: { seq: number }[]; next: number };
      assert.deepEqual([rest.calls.map((c) => c.seq), rest.next], [[5, 6], 6]);
      assert.equal((await fetch(`${sim.adminUrl}/calls?since=-1`)).status, 400);
      sim.resetStats();
      assert.deepEqual(sim.calls(), { enabled: true, calls: [], next: 0 });
    });
    await withSim({}, async (sim, client) => {
      await fx(client, sim.apiKey);
      assert.deepEqual(sim.calls(), { enabled: false, calls: [], next: 0 });
    });
  });

  test('routing: unknown path 404, GET on batch 405, POST single call with a JSON body', async () => {
    await withSim({}, async (sim) => {
      const h = { 'x-api-key': sim.apiKey };
      assert.equal((await fetch(`${sim.url.replace('/v1', '')}/v2/x`, { headers: h })).status, 404);
      assert.equal((await fetch(`${sim.url}/dnslookup/batch`, { headers: h })).status, 405);
      const r = await fetch(`${sim.url}/dnslookup`, { method: 'POST', headers: { ...h, 'content-type': 'application/json' }, body: '{"domain":"example.com"}' });
      assert.equal(r.status, 200);
      const body = (await r.json()) as { status: string; error: null; data: { domain: string } };
      assert.deepEqual([body.status, body.error, body.data.domain], ['ok', null, 'example.com']);
      const missing = await fetch(`${sim.url}/dnslookup`, { headers: {} });
      assert.equal(missing.status, 401);
      assert.deepEqual(await missing.json(), { status: 'error', error: 'API key is required. Send it in the x-api-key header.', data: null });
    });
  });
});

// ------------------------------------------------------------------ configuration

describe('configuration', () => {
  test('env parser: defaults, overrides, and a bad value names its variable', () => {
    const d = simulatorOptionsFromEnv({});
    assert.equal(d.port, 4100);
    assert.equal(d.plan, 'PRO');
    assert.equal(d.apiKey, 'apv_demo_primary');
    const o = simulatorOptionsFromEnv({
      SIMULATOR_PORT: '0',
      SIMULATOR_PLAN: 'mega',
      SIMULATOR_SUB_KEYS: 'apv_sbk_a, apv_sbk_b',
      SIMULATOR_RATE_PER_MINUTE: 'unlimited',
      SIMULATOR_BURST: '5',
      SIMULATOR_COOLDOWN_SECONDS: '1.5',
      SIMULATOR_CREDITS: '-4',
      SIMULATOR_LATENCY_MS: '0',
      SIMULATOR_SEED: '9',
      API_COSTS: 'emailvalidator=20',
    });
    assert.deepEqual(
      [o.port, o.plan, o.subKeys, o.ratePerMinute, o.burst, o.cooldownSeconds, o.credits, o.latencyMs, o.seed],
      [0, 'MEGA', ['apv_sbk_a', 'apv_sbk_b'], null, 5, 1.5, -4, 0, 9],
    );
    assert.equal(o.catalog?.get('emailvalidator')?.creditCost, 20);
    assert.throws(() => simulatorOptionsFromEnv({ SIMULATOR_PORT: 'abc' }), /SIMULATOR_PORT/);
    assert.throws(() => simulatorOptionsFromEnv({ SIMULATOR_PLAN: 'GOLD' }), /SIMULATOR_PLAN/);
    assert.throws(() => simulatorOptionsFromEnv({ SIMULATOR_API_KEY: 'key123' }), /SIMULATOR_API_KEY/);
    assert.throws(() => simulatorOptionsFromEnv({ SIMULATOR_SUB_KEYS: 'apv_x' }), /SIMULATOR_SUB_KEYS/);
    assert.throws(() => simulatorOptionsFromEnv({ SIMULATOR_PLAN: 'STARTER', SIMULATOR_SUB_KEYS: 'apv_sbk_a' }), /SIMULATOR_SUB_KEYS: plan STARTER allows 0/);
    assert.throws(() => simulatorOptionsFromEnv({ SIMULATOR_RATE_PER_MINUTE: '-1' }), /SIMULATOR_RATE_PER_MINUTE/);
    assert.throws(() => simulatorOptionsFromEnv({ API_COSTS: 'nope=3' }), /API_COSTS/);
  });

  test('start-up options are validated', async () => {
    await assert.rejects(startSimulator({ apiKey: 'apv_sbk_primary' }), /primary key/);
    await assert.rejects(startSimulator({ subKeys: ['apv_sbk_1', 'apv_sbk_2', 'apv_sbk_3', 'apv_sbk_4', 'apv_sbk_5', 'apv_sbk_6'] }), /allows 5 sub-keys/);
    await assert.rejects(startSimulator({ subKeys: [{ key: 'apv_sbk_1', apis: ['nope'] }] }), /unknown api/);
    assert.equal(DEFAULT_CATALOG.size, 3);
  });
});
