/**
 * The pacer against a provider that is stricter than Sluice was told: a
 * rate-limit 429 pauses the window for retry-after and empties its bucket
 * (I2), the jobs are put back without losing an attempt, and everything still
 * finishes. The admin `system` query shows the window.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { assertQuiescent } from './helpers/invariants.ts';

describe('a window that hits the provider limit', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    // Upstream allows 120/min with a burst of 2 and a 2 s cooldown; Sluice believes 6,000/min.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 120, burst: 2, cooldownSeconds: 2, latencyMs: 20, latencyP95Ms: 20, seed: 5 });
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '6000',
      LEASE_MAX: '1',
      INITIAL_LATENCY_MS: '20',
      // The pause itself, on the configured pace: the learned pace would lower the rate to the
      // stated window before the 429 this test waits for (test/learned-pace.test.ts).
      PACE_LEARN: 'false',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  test('a 429 pauses the window for retry-after on every node; the jobs come back and finish', async () => {
    const tenant = await t.createTenant('eager', 'PRO');
    const jobs = Array.from({ length: 12 }, (_, i) => ({ api: 'dnslookup', params: { domain: `p${i}.example` } }));
    await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`, { i: { jobs } }, tenant.apiKey);

    const paused = await eventually(async () => {
      const r = await t.gql(`{ system { windows { name ratePerMinute tokens pausedUntil pauseReason poolSize busy } } }`);
      const w = r.body.data.system.windows.find((x: any) => x.name === 'primary');
      return w.pausedUntil ? w : null;
    }, 20_000, 20);
    assert.equal(paused.pauseReason, 'RATE_LIMITED');
    assert.equal(paused.ratePerMinute, 5400, 'paced at 0.9 of the configured limit');
    assert.equal(paused.tokens, 0, 'a 429 empties the bucket');
    const until = Date.parse(paused.pausedUntil);
    assert.ok(until > Date.now(), 'the pause lies ahead');

    // While paused, no new call leaves: the provider sees only calls that were already in flight.
    const before = sim.stats().keys[sim.apiKey]!.calls;
    await new Promise((r) => setTimeout(r, Math.max(0, until - Date.now() - 200)));
    const during = sim.stats().keys[sim.apiKey]!.calls;
    assert.ok(during - before <= 1, `no call leaves during the pause (saw ${during - before})`);

    await eventually(async () => {
      const [row] = await sql`select count(*)::int as n from jobs where state <> 'SUCCEEDED'`;
      return row!.n === 0;
    }, 60_000, 200);
    const [attempts] = await sql`select max(attempts)::int as n from jobs`;
    assert.equal(attempts!.n, 1, 'a put-back does not use up an attempt');
    const stats = sim.stats().keys[sim.apiKey]!;
    assert.ok(stats.rateLimited >= 1, 'the provider did refuse');
    await eventually(async () => {
      const [row] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return row!.n === 0;
    });
    await assertQuiescent(sql);
    const [refunds] = await sql`select count(*)::int as n from reservations where outcome = 'rate_limited' and billed = 0`;
    assert.ok(refunds!.n >= 1, 'refused calls were refunded');
  });
});
