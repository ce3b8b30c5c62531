/**
 * Batching inside the worker (issue #6): the pure decisions, then against the
 * simulator over real HTTP: duplicates, a batch cut by the window, a batch cut
 * by credits, fair share with one tenant batching, and a SIGKILL mid-batch.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { batchTake, dedupKey, stableStringify } from '../src/dispatch/batching.ts';
import { WORK_CHANNEL } from '../src/jobs/service.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { createTestDatabase } from './helpers/db.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';
import { crashTestEnv, gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;
const CURRENCIES = ['EUR', 'GBP', 'JPY', 'CHF', 'CAD', 'AUD', 'SEK', 'NOK', 'DKK', 'PLN', 'CZK', 'HUF', 'NZD', 'SGD', 'HKD', 'MXN', 'BRL', 'ZAR', 'INR', 'CNY', 'KRW', 'TRY', 'ILS', 'THB', 'MYR'];

async function states(sql: postgres.Sql, tenantId: string): Promise<Record<string, number>> {
  const rows = await sql`select state, count(*)::int as n from jobs where tenant_id = ${tenantId} group by state`;
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

async function openReservations(sql: postgres.Sql): Promise<number> {
  const [r] = await sql`select count(*)::int as n from reservations where settled_at is null`;
  return r!.n;
}

async function bigTenant(t: TestApp, name: string, tier: 'PRO' | 'ENTERPRISE' = 'ENTERPRISE') {
  const tenant = await t.createTenant(name, tier);
  const r = await t.gql(UPDATE, { i: { id: tenant.id, concurrencyCap: 500 } });
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return tenant;
}

describe('batching decisions (pure)', () => {
  test('dedup key: same API and params in any key order are one input', () => {
    assert.equal(stableStringify({ b: 1, a: { d: [1, { y: 2, x: 1 }], c: null } }), '{"a":{"c":null,"d":[1,{"x":1,"y":2}]},"b":1}');
    assert.equal(dedupKey('exchangerate', { currency1: 'USD', currency2: 'EUR' }), dedupKey('exchangerate', { currency2: 'EUR', currency1: 'USD' }));
    assert.notEqual(dedupKey('exchangerate', { currency1: 'USD', currency2: 'EUR' }), dedupKey('exchangerate', { currency1: 'USD', currency2: 'GBP' }));
    assert.notEqual(dedupKey('a', { x: 1 }), dedupKey('b', { x: 1 }));
  });
  test('batchTake: bounded by tokens, BATCH_MAX, the API maxSize and the free cap; never below the single take', () => {
    assert.equal(batchTake({ tokens: 500, batchMax: 200, apiMaxSize: 200, capFree: 1000, singleTake: 8 }), 200);
    assert.equal(batchTake({ tokens: 37.9, batchMax: 200, apiMaxSize: 200, capFree: 1000, singleTake: 8 }), 37);
    assert.equal(batchTake({ tokens: 500, batchMax: 200, apiMaxSize: 50, capFree: 1000, singleTake: 8 }), 50);
    assert.equal(batchTake({ tokens: 500, batchMax: 200, apiMaxSize: 200, capFree: 12, singleTake: 8 }), 12);
    assert.equal(batchTake({ tokens: 1, batchMax: 200, apiMaxSize: 200, capFree: 12, singleTake: 1 }), 1);
    assert.equal(batchTake({ tokens: Number.POSITIVE_INFINITY, batchMax: 30, apiMaxSize: 200, capFree: 1000, singleTake: 8 }), 30);
  });
});

describe('batches against the simulator', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 60_000, burst: 1000, latencyMs: 30, latencyP95Ms: 30, seed: 21 });
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '6000',
      PACER_BURST: '100',
      SWEEP_INTERVAL_MS: '200',
      INITIAL_LATENCY_MS: '30',
      // Batches against an exact window on the configured pace: the window narrowed mid-file would
      // otherwise leave a learned rate (and its smaller bucket) behind for the tests after it.
      PACE_LEARN: 'false',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  test('duplicates: one upstream item per distinct input, a result for every job, billed once', async () => {
    const tenant = await bigTenant(t, 'dupes');
    // 10 distinct emails, each submitted 3 times (params in different key orders).
    const jobs = Array.from({ length: 30 }, (_, i) => {
      const email = `u${i % 10}@example.com`;
      return { api: 'emailvalidator', params: i % 2 ? { email, tag: 't' } : { tag: 't', email } };
    });
    await t.gql(SUBMIT_MANY, { i: { jobs } }, tenant.apiKey);
    await eventually(async () => (await states(sql, tenant.id)).SUCCEEDED === 30, 15_000, 50);
    await eventually(async () => (await openReservations(sql)) === 0, 5_000);
    const key = sim.stats().keys[sim.apiKey]!;
    assert.equal(key.httpRequests, 1, 'one HTTP call');
    assert.equal(key.calls, 10, 'one upstream item per distinct input');
    assert.equal(key.creditsBilled, 50, 'billed once per distinct input (10 × 5)');
    const [ledger] = await sql`select billed, refunded from tenant_ledger where tenant_id = ${tenant.id}`;
    assert.equal(Number(ledger!.billed), 50);
    assert.equal(Number(ledger!.refunded), 100, "the duplicates' reservations were refunded");
    const results = await sql`select j.params->>'email' as email, j.result as data, j.credits_billed from jobs j where j.tenant_id = ${tenant.id}`;
    assert.equal(results.length, 30, 'a result for every job');
    const byEmail = new Map<string, unknown>();
    for (const r of results) {
      assert.ok(r.data, 'every duplicate has the data');
      const seen = byEmail.get(r.email as string);
      if (seen) assert.deepEqual(r.data, seen, 'duplicates share the result');
      else byEmail.set(r.email as string, r.data);
    }
    const [billedRows] = await sql`select count(*)::int as n from jobs j where j.tenant_id = ${tenant.id} and j.credits_billed > 0`;
    assert.equal(billedRows!.n, 10);
    await assertJobsAccountedFor(sql);
    await assertLedgerBalances(sql);
    await assertQuiescent(sql);
  });

  test("several tenants' batch turns go out as one call per round; an input two tenants share is sent and billed once for each", async () => {
    // Held until all three have submitted, so each lease sees them together. The window is paced:
    // a call is one round (each tenant's turn once), and the three turns of a round share its call.
    await sql`update windows set paused_until = now() + interval '1 hour' where name = 'primary'`;
    const tenants = [];
    for (const name of ['shared-a', 'shared-b', 'shared-c']) tenants.push(await bigTenant(t, name));
    const jobs = ['a', 'b', 'c', 'd'].map((d) => ({ api: 'dnslookup', params: { domain: `${d}.example.com` } }));
    for (const tenant of tenants) await t.gql(SUBMIT_MANY, { i: { jobs } }, tenant.apiKey);
    sim.resetStats();
    await sql`update windows set paused_until = null where name = 'primary'`;
    await sql`select pg_notify(${WORK_CHANNEL}, '')`;
    for (const tenant of tenants) await eventually(async () => (await states(sql, tenant.id)).SUCCEEDED === 4, 15_000, 50);
    await eventually(async () => (await openReservations(sql)) === 0, 5_000);
    const key = sim.stats().keys[sim.apiKey]!;
    // A paced call is one round: the three tied tenants' 1-job turns share its batch call, 4 calls
    // in all; one more or two when the running-count fold held a queue's row as a call ran (that
    // queue sits out the call). Never one call per job.
    assert.ok(key.httpRequests <= 6, `${key.httpRequests} HTTP calls for the three tenants' 12 jobs`);
    assert.equal(key.calls, 12, "each tenant's 4 inputs sent: inputs never fold across tenants");
    assert.equal(key.creditsBilled, 12);
    const ids = tenants.map((x) => x.id);
    const ledgers = await sql`select tenant_id, billed, refunded from tenant_ledger where tenant_id = any(${ids}::uuid[])`;
    assert.equal(ledgers.length, 3);
    for (const l of ledgers) assert.deepEqual([Number(l.billed), Number(l.refunded)], [4, 0], 'each tenant billed for its own items');
    const [slots] = await sql`select count(*) filter (where window_slot)::int as slots, count(*)::int as n from reservations where tenant_id = any(${ids}::uuid[])`;
    assert.deepEqual([slots!.slots, slots!.n], [key.httpRequests, 12], 'one pool slot per call, one reservation per job');
    await assertJobsAccountedFor(sql);
    await assertLedgerBalances(sql);
    await assertQuiescent(sql);
  });

  test('a batch that hits the window part-way: exactly the items beyond it come back and run later', async () => {
    sim.setConditions({ ratePerMinute: 600, burst: 5, cooldownSeconds: 1 });
    sim.resetStats();
    const tenant = await bigTenant(t, 'window');
    const jobs = CURRENCIES.slice(0, 20).map((c) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: c } }));
    await t.gql(SUBMIT_MANY, { i: { jobs } }, tenant.apiKey);
    // The first batch: 5 items within the window, 15 refused per item inside the 200.
    const first = await eventually(async () => {
      const k = sim.stats().keys[sim.apiKey]!;
      return k.httpRequests >= 1 ? k : null;
    }, 10_000, 10);
    assert.equal(first.httpRequests, 1);
    assert.equal(first.calls, 20, 'all 20 in one batch');
    assert.deepEqual(first.batchItems, { '200': 5, '429': 15 });
    // The 15 are back in the queue, the 5 done, and the window paused for the retry-after.
    await eventually(async () => {
      const s = await states(sql, tenant.id);
      return s.SUCCEEDED === 5 && s.QUEUED === 15 ? s : null;
    }, 5_000, 20);
    const [w] = await sql`select paused_until, pause_reason from windows where name = 'primary'`;
    assert.equal(w!.pause_reason, 'RATE_LIMITED');
    const firstTries = await sql`
      select distinct on (job_id) job_id, outcome, billed from reservations where tenant_id = ${tenant.id} order by job_id, created_at`;
    assert.equal(firstTries.filter((r) => r.outcome === 'billed').length, 5);
    assert.equal(firstTries.filter((r) => r.outcome === 'rate_limited').length, 15);
    assert.equal(firstTries.filter((r) => r.outcome === 'rate_limited' && Number(r.billed) > 0).length, 0, 'refused items are refunded');

    await eventually(async () => (await states(sql, tenant.id)).SUCCEEDED === 20, 30_000, 100);
    await eventually(async () => (await openReservations(sql)) === 0, 5_000);
    const k = sim.stats().keys[sim.apiKey]!;
    // (The last stragglers may go alone: one distinct item is below minSize.)
    assert.equal(k.billedCalls, 20, 'each job called successfully once');
    assert.equal(k.creditsBilled, 20);
    const [billed] = await sql`select sum(billed)::int as n, count(*) filter (where outcome = 'billed')::int as ok from reservations where tenant_id = ${tenant.id}`;
    assert.equal(billed!.n, 20, 'billed once per job');
    assert.equal(billed!.ok, 20);
    const [attempts] = await sql`select max(attempts)::int as n from jobs where tenant_id = ${tenant.id}`;
    assert.equal(attempts!.n, 1, 'a put-back does not spend an attempt');
    await assertJobsAccountedFor(sql);
    await assertLedgerBalances(sql);
    await assertQuiescent(sql);
    sim.setConditions({ ratePerMinute: 60_000, burst: 1000 });
  });

  test('a batch that runs out of credits part-way: the rest get 402, the account stops, nothing is lost', async () => {
    // The previous test paused the window: let it refill so the 25 jobs go out as one batch.
    await eventually(async () => {
      const r = await t.gql(`{ system { windows { name tokens pausedUntil } } }`);
      const w = r.body.data.system.windows.find((x: any) => x.name === 'primary');
      return w.pausedUntil === null && (w.tokens === null || w.tokens >= 25);
    }, 30_000, 100);
    sim.resetStats();
    sim.setCredits(10);
    const tenant = await bigTenant(t, 'credits');
    const jobs = CURRENCIES.map((c) => ({ api: 'exchangerate', params: { currency1: 'GBP', currency2: c } }));
    await t.gql(SUBMIT_MANY, { i: { jobs } }, tenant.apiKey);
    const stopped = await eventually(async () => {
      const r = await t.gql(`{ system { account { dispatchStoppedUntil stopReason } } }`);
      return r.body.data.system.account.dispatchStoppedUntil ? r.body.data.system.account : null;
    }, 10_000, 50);
    assert.equal(stopped.stopReason, 'CREDITS_EXHAUSTED');
    await eventually(async () => (await openReservations(sql)) === 0, 5_000);
    const k = sim.stats().keys[sim.apiKey]!;
    assert.equal(k.httpRequests, 1);
    assert.deepEqual(k.batchItems, { '200': 10, '402': 15 });
    const s = await states(sql, tenant.id);
    assert.equal(s.SUCCEEDED, 10, JSON.stringify(s));
    const [queued] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant.id} and state = 'QUEUED'`;
    assert.equal(queued!.n, 15, 'the refused items wait in the queue');
    await new Promise((r) => setTimeout(r, 800));
    assert.equal(sim.stats().keys[sim.apiKey]!.calls, 25, 'nothing leaves while the account is stopped');

    sim.setCredits(1000);
    await t.gql(`mutation { resumeDispatch { account { dispatchStoppedUntil } } }`);
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant.id} and state = 'SUCCEEDED'`;
      return r!.n === 25;
    }, 15_000, 100);
    await eventually(async () => (await openReservations(sql)) === 0, 5_000);
    const [ledger] = await sql`select billed from tenant_ledger where tenant_id = ${tenant.id}`;
    assert.equal(Number(ledger!.billed), 25, 'each job billed once; the 402s were refunded');
    assert.equal(sim.stats().keys[sim.apiKey]!.creditsBilled, 25);
    await assertJobsAccountedFor(sql);
    await assertLedgerBalances(sql);
    await assertQuiescent(sql);
  });
});

describe('fair share with one tenant batching', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 60_000, burst: 1000, latencyMs: 150, latencyP95Ms: 150, seed: 5 });
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '1200',
      PACER_BURST: '20',
      INITIAL_LATENCY_MS: '150',
      BATCH_DISABLED_APIS: 'dnslookup',
      SWEEP_INTERVAL_MS: '200',
      // The split is judged over the first seconds: the window opens at its configured rate.
      PACE_START: '1',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  test('equal weights: items dispatched over a window split ~50/50 though only one tenant batches', async () => {
    const a = await bigTenant(t, 'batcher', 'PRO');
    const b = await bigTenant(t, 'single', 'PRO');
    await Promise.all([
      t.gql(SUBMIT_MANY, { i: { jobs: Array.from({ length: 400 }, (_, i) => ({ api: 'exchangerate', params: { currency1: CURRENCIES[i % 25], currency2: CURRENCIES[(i * 7 + 3) % 25], n: i } })) } }, a.apiKey),
      t.gql(SUBMIT_MANY, { i: { jobs: Array.from({ length: 400 }, (_, i) => ({ api: 'dnslookup', params: { domain: `f${i}.example` } })) } }, b.apiKey),
    ]);
    const started = Date.now();
    await new Promise((r) => setTimeout(r, 6_000));
    // Cumulative service while both are backlogged: each tenant's items dispatched in the 5 s from
    // the first lease that served the second of them. Before that only one was visible, and it was
    // served alone, with no debt (start-time fair queueing: the other joins level with the clock).
    const rows = await sql`
      with s as (select max(f) as at from (select min(created_at) as f from reservations group by tenant_id) x)
      select tenant_id, count(*)::int as n from reservations, s
      where created_at >= s.at - interval '1 millisecond' and created_at < s.at + interval '5 seconds'
      group by tenant_id`;
    const timeline = await sql`
      select tenant_id = ${a.id} as batcher, floor(extract(epoch from created_at - (select min(created_at) from reservations)) * 2)::int as half, count(*)::int as n
      from reservations group by 1, 2 order by 2, 1`;
    const n = new Map(rows.map((r) => [r.tenant_id as string, r.n as number]));
    const na = n.get(a.id) ?? 0;
    const nb = n.get(b.id) ?? 0;
    const share = na / (na + nb);
    assert.ok(na + nb >= 40, `enough items dispatched to judge (${na + nb} in ${Date.now() - started} ms)`);
    assert.ok(share > 0.4 && share < 0.6, `batching tenant got ${(share * 100).toFixed(1)}% of the items (${na} vs ${nb}): ${JSON.stringify(timeline)}`);
    const key = sim.stats().keys[sim.apiKey]!;
    assert.ok(Object.keys(key.batchItems).length > 0, 'the batching tenant did send batches');
    const [dns] = await sql`select count(*)::int as n from reservations where tenant_id = ${b.id}`;
    assert.ok(dns!.n > 0);
  });
});

describe('a worker killed mid-batch', () => {
  test('after SIGKILL and a restart: every job SUCCEEDED, no open reservation, one result per job', async () => {
    const db = await createTestDatabase();
    const sql = postgres(db.url, { max: 2, onnotice: () => {} });
    const slow = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 1500, latencyP95Ms: 1500, concurrentCalls: 100, seed: 9 });
    const env = crashTestEnv(slow, db.url, 6000, { INITIAL_LATENCY_MS: '1500' });
    const local: NodeProcess[] = [];
    try {
      const api = await startNode('api', env);
      local.push(api);
      const { createTenant } = await gqlAt(api.url!, `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`, { i: { name: 'crashy', tier: 'PRO' } });
      await gqlAt(api.url!, UPDATE, { i: { id: createTenant.tenant.id, concurrencyCap: 200 } });
      const victim = await startNode('worker', env);
      local.push(victim);
      const jobs = Array.from({ length: 40 }, (_, i) => ({ api: 'dnslookup', params: { domain: `k${i % 30}.example` } }));
      await gqlAt(api.url!, SUBMIT_MANY, { i: { jobs } }, createTenant.apiKey);
      await eventually(async () => {
        const [row] = await sql`select count(*)::int as n from reservations r join nodes n on n.id = r.node_id where n.pid = ${victim.pid} and r.settled_at is null`;
        return row!.n >= 10;
      }, 20_000, 50);
      // The batch is in flight upstream (1.5 s latency): kill the worker without warning.
      await new Promise((r) => setTimeout(r, 300));
      assert.ok(slow.stats().keys[slow.apiKey]!.httpRequests >= 1, 'a batch call was sent');
      await victim.stop('SIGKILL');
      assert.ok((await openReservations(sql)) >= 10, 'the killed worker left reservations behind');
      // A batch item's duplicates ride on its first attempt: only that one is marked sent, so the
      // expiry bills one attempt per input of the lost call, as the provider billed, not each duplicate.
      const marks = await sql`
        select j.params->>'domain' as domain, count(*)::int as n, count((select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))))::int as sent from reservations r join jobs j on j.id = r.job_id
        join nodes n on n.id = r.node_id where n.pid = ${victim.pid} and r.settled_at is null group by 1`;
      // One batch call holds one pool slot: the lost attempts are one call, so each input went upstream once.
      const [calls] = await sql`select count(*) filter (where r.window_slot)::int as n from reservations r join nodes n on n.id = r.node_id where n.pid = ${victim.pid}`;
      assert.equal(calls!.n, 1, 'the 40 jobs went out as one batch call');
      assert.ok(marks.some((m) => m.n > 1), `the lost call carried duplicate inputs: ${JSON.stringify(marks)}`);
      assert.deepEqual(marks.filter((m) => m.sent > 1), [], 'no input marked sent twice');
      const [slot] = await sql`select (in_flight + coalesce((select sum(n) from window_slot_deltas where "window" = 'primary'), 0))::int as in_flight from windows where name = 'primary'`;
      assert.ok(slot!.in_flight >= 1 && slot!.in_flight < 10, `the batch held one pool slot, not one per item (${slot!.in_flight})`);
      local.push(await startNode('worker', env));

      await eventually(async () => {
        const [row] = await sql`select count(*)::int as n from jobs where state <> 'SUCCEEDED'`;
        return row!.n === 0;
      }, 60_000, 200);
      await eventually(async () => (await openReservations(sql)) === 0, 10_000);
      const s = await assertJobsAccountedFor(sql);
      assert.equal(s.SUCCEEDED, 40);
      await assertQuiescent(sql);
      await assertLedgerBalances(sql);
      // node_lost: sent; never_sent: leased but not yet marked sent when the worker died (refunded).
      const [swept] = await sql`select count(*)::int as n from reservations where outcome in ('node_lost', 'never_sent')`;
      assert.ok(swept!.n >= 10, 'the lost reservations were settled by the sweeper');
      const [results] = await sql`select count(*)::int as n from jobs where result is not null or error_code is not null`;
      assert.equal(results!.n, 40, 'one result per job');
      const [ledger] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
      assert.ok(ledger!.n >= slow.stats().totals.creditsBilled, 'the ledger covers every credit the provider billed');
    } finally {
      await Promise.all(local.map((n) => n.stop('SIGKILL')));
      await sql.end();
      await slow.stop();
      await db.drop();
    }
  });
});
