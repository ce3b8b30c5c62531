/**
 * Several real processes against one Postgres and one simulated upstream:
 * 1 API process and 3 worker processes run a mixed multi-tenant load; the
 * invariants are checked against the simulator's stats and Sluice's ledger.
 * Then a worker is killed with SIGKILL mid-run.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { createTestDatabase } from './helpers/db.ts';
import { eventually } from './helpers/app.ts';
import { crashTestEnv, gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertPaced, assertQuiescent, maxConcurrentByTenant } from './helpers/invariants.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;

async function tenant(url: string, name: string, limits: Record<string, unknown>): Promise<{ id: string; apiKey: string }> {
  const { createTenant } = await gqlAt(url, CREATE, { i: { name, tier: 'PRO' } });
  await gqlAt(url, UPDATE, { i: { id: createTenant.tenant.id, ...limits } });
  return { id: createTenant.tenant.id, apiKey: createTenant.apiKey };
}

function jobs(n: number, api: string, params: (i: number) => Record<string, unknown>) {
  return Array.from({ length: n }, (_, i) => ({ api, params: params(i) }));
}

describe('three workers and an API process on one database', () => {
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  let sim: Simulator;
  const nodes: NodeProcess[] = [];

  before(async () => {
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 2, onnotice: () => {} });
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 1200, cooldownSeconds: 1, latencyMs: 100, latencyP95Ms: 200, concurrentCalls: 50, seed: 7 });
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop('SIGKILL')));
    await sql.end();
    await sim.stop();
    await db.drop();
  });

  test('pace (I1), caps (I3), quotas (I4) and settlement (I5) hold across nodes', async () => {
    const env = {
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: '1200',
      APIVERVE_CONCURRENT_CALLS: '50',
      NODE_TIMEOUT_SECONDS: '3',
      SWEEP_INTERVAL_MS: '200',
      DISPATCH_IDLE_POLL_MS: '200',
    };
    const api = await startNode('api', env);
    nodes.push(api);
    // Tenants exist before the workers start, so every worker sees the same state from its first decision.
    const url = api.url!;
    const t1 = await tenant(url, 'capped-2', { concurrencyCap: 2 });
    const t2 = await tenant(url, 'capped-3', { concurrencyCap: 3 });
    const t3 = await tenant(url, 'quota-wait', { monthlyQuota: 30, quotaPolicy: 'WAIT' });
    const t4 = await tenant(url, 'quota-fail', { monthlyQuota: 10, quotaPolicy: 'FAIL' });
    for (let i = 0; i < 3; i++) nodes.push(await startNode('worker', env));

    await gqlAt(url, SUBMIT_MANY, { i: { jobs: jobs(60, 'exchangerate', (i) => ({ currency1: 'USD', currency2: ['EUR', 'GBP', 'JPY', 'CHF', 'CAD', 'AUD'][i % 6] })) } }, t1.apiKey);
    await gqlAt(url, SUBMIT_MANY, { i: { jobs: jobs(60, 'dnslookup', (i) => ({ domain: `d${i}.example` })) } }, t2.apiKey);
    await gqlAt(url, SUBMIT_MANY, { i: { jobs: jobs(10, 'emailvalidator', (i) => ({ email: `u${i}@example.com` })) } }, t3.apiKey);
    await gqlAt(url, SUBMIT_MANY, { i: { jobs: jobs(4, 'emailvalidator', (i) => ({ email: `f${i}@example.com` })) } }, t4.apiKey);

    // While it runs, the books must balance at every look (I4 in particular).
    await eventually(async () => {
      await assertLedgerBalances(sql);
      // (A quota-blocked tenant's jobs stay QUEUED and show WAITING_QUOTA.)
      const [row] = await sql`
        select count(*)::int as n from jobs j left join sched_tenants qt on qt.tenant_id = j.tenant_id
        where sluice_job_state(j.state, qt.quota_blocked) in ('QUEUED', 'RUNNING')`;
      return row!.n === 0;
    }, 60_000, 150);
    await eventually(async () => {
      const [row] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return row!.n === 0;
    }, 10_000);

    const states = await assertJobsAccountedFor(sql);
    assert.equal(states.SUCCEEDED, 60 + 60 + 6 + 2, `every job that fits its quota ran: ${JSON.stringify(states)}`);
    assert.equal(states.WAITING_QUOTA, 4, 'quota WAIT: the jobs beyond the quota wait, visibly');
    assert.equal(states.FAILED, 2, 'quota FAIL: the jobs beyond the quota fail');
    const [failed] = await sql`select count(*)::int as n from jobs j where j.tenant_id = ${t4.id} and j.error_code = 'QUOTA_EXCEEDED'`;
    assert.equal(failed!.n, 2);

    const concurrency = await maxConcurrentByTenant(sql);
    assert.ok(concurrency.get(t1.id)! <= 2, `I3: capped-2 held ${concurrency.get(t1.id)} at once`);
    assert.ok(concurrency.get(t2.id)! <= 3, `I3: capped-3 held ${concurrency.get(t2.id)} at once`);
    assert.ok(concurrency.get(t1.id)! >= 1 && concurrency.get(t2.id)! >= 1);

    await assertLedgerBalances(sql);
    await assertQuiescent(sql);
    const ledger = await sql`select tenant_id, billed from tenant_ledger`;
    const billed = new Map(ledger.map((r) => [r.tenant_id as string, Number(r.billed)]));
    assert.equal(billed.get(t3.id), 30, 'quota-wait spent exactly its quota');
    assert.equal(billed.get(t4.id), 10, 'quota-fail spent exactly its quota');

    const stats = sim.stats();
    const key = stats.keys[sim.apiKey]!;
    assert.equal(key.rateLimited, 0, 'no rate-limit 429 from the provider');
    assert.equal(key.calls, 128, 'one upstream call per job that ran');
    assert.equal(stats.totals.creditsBilled, [...billed.values()].reduce((a, b) => a + b, 0), "the provider's bill equals the ledger's");
    // Sluice paces to 0.9 × 1200/min = 18/s with a burst of 60.
    assertPaced(key.timeline, 60, 18);
  });

  test('a worker killed with SIGKILL mid-run: its reservations are released, its jobs run again, results are written once (I5, I6, I7)', async () => {
    const fresh = await createTestDatabase();
    const fsql = postgres(fresh.url, { max: 2, onnotice: () => {} });
    const slow = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 1500, latencyP95Ms: 1500, concurrentCalls: 100, seed: 3 });
    const env = crashTestEnv(slow, fresh.url, 6000, { INITIAL_LATENCY_MS: '1500' });
    const local: NodeProcess[] = [];
    try {
      const api = await startNode('api', env);
      local.push(api);
      const t = await tenant(api.url!, 'crashy', { concurrencyCap: 40 });
      const victim = await startNode('worker', env);
      local.push(victim);
      await gqlAt(api.url!, SUBMIT_MANY, { i: { jobs: jobs(40, 'dnslookup', (i) => ({ domain: `k${i}.example` })) } }, t.apiKey);
      // Wait until the victim holds calls in flight, then kill it without warning.
      await eventually(async () => {
        const [row] = await fsql`select count(*)::int as n from reservations r join nodes n on n.id = r.node_id where n.pid = ${victim.pid} and r.settled_at is null`;
        return row!.n >= 10;
      }, 20_000, 50);
      await victim.stop('SIGKILL');
      const [lost] = await fsql`select count(*)::int as n from reservations where settled_at is null`;
      assert.ok(lost!.n >= 10, 'the killed worker left reservations behind');
      local.push(await startNode('worker', env));

      await eventually(async () => {
        const [row] = await fsql`select count(*)::int as n from jobs where state <> 'SUCCEEDED'`;
        return row!.n === 0;
      }, 60_000, 200);
      await eventually(async () => {
        const [row] = await fsql`select count(*)::int as n from reservations where settled_at is null`;
        return row!.n === 0;
      }, 10_000);
      const states = await assertJobsAccountedFor(fsql);
      assert.equal(states.SUCCEEDED, 40, 'I7: every accepted job finished');
      await assertQuiescent(fsql);
      await assertLedgerBalances(fsql);
      // node_lost: sent, billed by the timeout rule; never_sent: leased but not yet marked sent when the worker died, refunded.
      const [swept] = await fsql`select count(*)::int as n from reservations where outcome in ('node_lost', 'never_sent')`;
      assert.ok(swept!.n >= 10, 'the lost reservations were settled by the sweeper');
      const [rerun] = await fsql`select count(*)::int as n from jobs where attempts >= 2`;
      assert.ok(rerun!.n >= 10, "the killed worker's jobs ran again");
      const [results] = await fsql`select count(*)::int as n from jobs where result is not null or error_code is not null`;
      assert.equal(results!.n, 40, 'I6: one result per job');
      // With TIMEOUT_BILLING=billed a lost call is charged: the ledger never counts less than the provider billed.
      const [ledger] = await fsql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
      assert.ok(ledger!.n >= slow.stats().totals.creditsBilled, 'the ledger covers every credit the provider billed');
    } finally {
      await Promise.all(local.map((n) => n.stop('SIGKILL')));
      await fsql.end();
      await slow.stop();
      await fresh.drop();
    }
  });
});
