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
import { createTestDatabase } from './helpers/db.ts';

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

describe('a paced window with no token to give', () => {
  test('submissions do not wake its leases: lease calls follow the tokens and the idle poll, not the submissions', async () => {
    // Every submission's commit notifies the workers (one NOTIFY per group). While the bucket is
    // empty such a wake-up could only lease nothing and read the window, once per submission on
    // every node: the loops wait for the tokens instead. Counted by Postgres (track_functions, this
    // database only; a backend's counts are flushed at the latest when it exits, at the app's stop).
    const db = await createTestDatabase();
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    await admin.unsafe(`alter database "${new URL(db.url).pathname.slice(1)}" set track_functions = 'pl'`);
    const sim = await startSimulator({ plan: 'PRO', latencyMs: 5, latencyP95Ms: 5, seed: 7 });
    // 6 a minute paced at 0.9: a bucket of one token, the next ~11 s after it is spent.
    const t = await startTestApp({ DATABASE_URL: db.url, APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_RATE_PER_MINUTE: '6', PACE_LEARN: 'false', DISPATCH_IDLE_POLL_MS: '1000' });
    let running = true;
    try {
      const tenant = await t.createTenant('patient', 'PRO');
      const SUBMIT_ONE = `mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }`;
      const submitOne = async (i: number) => {
        const r = await t.gql(SUBMIT_ONE, { i: { api: 'dnslookup', params: { domain: `w${i}.example` } } }, tenant.apiKey);
        assert.ok(r.body.data, JSON.stringify(r.body.errors));
      };
      await submitOne(0);
      await eventually(async () => {
        const [r] = await admin`select count(*)::int as n from jobs where state = 'SUCCEEDED'`;
        return r!.n === 1;
      }, 20_000, 50);
      const submissions = 60;
      for (let i = 1; i <= submissions; i++) {
        await submitOne(i);
        await new Promise((r) => setTimeout(r, 50));
      }
      await t.stop();
      running = false;
      const [calls] = await admin`select count(*) filter (where state <> 'QUEUED')::int as sent from jobs`;
      const leases = await eventually(async () => {
        const [f] = await admin`select coalesce(sum(calls), 0)::int as n from pg_stat_user_functions where funcname = 'sluice_lease'`;
        return f!.n > 0 ? f!.n : null;
      }, 10_000, 100);
      console.log(JSON.stringify({ leaseCallsWithoutTokens: leases, submissions, calls: calls!.sent }));
      // What the run needed: a few leases around the one call and the start, and one per idle poll (1 s).
      assert.ok(leases < 25, `${leases} lease calls for ${submissions} submissions and ${calls!.sent} call(s)`);
    } finally {
      if (running) await t.stop();
      await sim.stop();
      await admin.end();
      await db.drop();
    }
  });
});
