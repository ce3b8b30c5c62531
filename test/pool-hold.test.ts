/**
 * A window's pool is sized by Little's law with W = how long a call holds its slot: from the
 * lease's return through the "sent" mark, the call and the settlement's commit. A slot is free
 * again only when the settlement commits, so a pool sized by the call's latency alone falls short
 * of the paced rate whenever commits are slow (a busy disk, a distant database). Here every commit
 * of the test database waits COMMIT_DELAY_MS (commit_delay with commit_siblings 0), so a call's
 * slot is held at least two commits longer than the call itself.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { poolSize } from '../src/scheduler/pool.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { adminUrl, createTestDatabase } from './helpers/db.ts';

/** Each commit's wait (commit_delay, µs / 1000). */
const COMMIT_DELAY_MS = 40;
/** The window's pool limits: APIVERVE_CONCURRENT_CALLS below, POOL_MAX's default. */
const LIMITS = { concurrentLimit: 50, max: 1_024 };

describe('a pool sized by the time a call holds its slot', () => {
  let sim: Simulator;
  let t: TestApp;
  let db: Awaited<ReturnType<typeof createTestDatabase>>;

  before(async () => {
    db = await createTestDatabase();
    const admin = postgres(adminUrl(), { max: 1, onnotice: () => {} });
    const name = new URL(db.url).pathname.slice(1);
    // Every session the app opens on its database starts with these (the fsync of each commit waits).
    await admin.unsafe(`alter database ${name} set commit_delay = ${COMMIT_DELAY_MS * 1000}`);
    await admin.unsafe(`alter database ${name} set commit_siblings = 0`);
    await admin.end();
    // The provider allows far more than Sluice is told: no 429 lowers the pace.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 60_000, latencyMs: 20, latencyP95Ms: 20, seed: 3, concurrentCalls: 50 });
    t = await startTestApp({
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '2400',
      APIVERVE_CONCURRENT_CALLS: '50',
      BATCH_MAX: '1',
      INITIAL_LATENCY_MS: '20',
      PACE_LEARN: 'false',
    });
  });
  after(async () => {
    await t.stop();
    await sim.stop();
    await db.drop();
  });

  test('with slow commits the pool covers the mark, the call and the settlement, not the call alone', async () => {
    const probe = postgres(db.url, { max: 1, onnotice: () => {} });
    const [setting] = await probe`select current_setting('commit_delay') as commit_delay`;
    await probe.end();
    assert.equal(setting?.commit_delay, String(COMMIT_DELAY_MS * 1000), "the app's sessions wait at each commit");

    const tenant = await t.createTenant('steady', 'ENTERPRISE');
    const jobs = Array.from({ length: 400 }, (_, k) => ({ api: 'dnslookup', params: { domain: `s${k}.example` } }));
    const r = await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`, { i: { jobs } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));

    // Once enough calls were measured, the sweeper's report of the window: pool and latency together.
    const w = await eventually(async () => {
      const s = sim.stats().keys[sim.apiKey]!;
      if (s.calls < 120) return null;
      const q = await t.gql(`{ system { windows { name ratePerMinute poolSize latencyP95Ms slotHoldP95Ms } } }`);
      const row = q.body.data.system.windows.find((x: any) => x.name === 'primary');
      return row.latencyP95Ms !== null ? row : null;
    }, 60_000, 200);
    assert.equal(w.ratePerMinute, 2160, 'paced at 0.9 of the configured rate');
    // Little's law as the dispatcher applies it (scheduler/pool.ts), within this window's limits.
    const pool = (waitMs: number) => poolSize(w.ratePerMinute, waitMs, LIMITS);
    const byCall = pool(w.latencyP95Ms);
    // The slot is held for the call plus two commits (the mark and the settlement), each at least COMMIT_DELAY_MS.
    const byHold = pool(w.latencyP95Ms + 2 * COMMIT_DELAY_MS);
    assert.ok(byHold > byCall, `the commits matter at this rate (${byCall} vs ${byHold})`);
    assert.ok(w.poolSize >= byHold, `pool ${w.poolSize}: at least ${byHold} (rate × (p95 ${w.latencyP95Ms} ms + two commits)), not ${byCall} (rate × the call alone)`);
    assert.ok(w.poolSize <= LIMITS.concurrentLimit, 'never above the concurrent-call limit');
    // What the pool was sized by is published beside it: the slot's hold time, two commits above the call.
    assert.ok(w.slotHoldP95Ms >= w.latencyP95Ms + 2 * COMMIT_DELAY_MS - 5, `slot held ${w.slotHoldP95Ms} ms at p95, calls ${w.latencyP95Ms} ms`);
    assert.equal(w.poolSize, pool(w.slotHoldP95Ms), 'poolSize = ceil(rate × slotHoldP95Ms)');
  });
});
