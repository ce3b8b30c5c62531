/**
 * The dispatch hot path's correctness under failure, against real Postgres and
 * the simulator over real HTTP: a settlement whose connection is killed, a
 * pg-boss redelivery of a live attempt, a sweeper slower than the node
 * timeout, cancels racing leases, and the depth counters under all of it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { createLogger } from '../src/log.ts';
import { startBoss } from '../src/queue/boss.ts';
import { Sweeper } from '../src/scheduler/sweeper.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;
const CANCEL = `mutation($id: ID!) { cancelJob(id: $id) { id state } }`;

function dns(n: number, tag: string) {
  return Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}${i}.example` } }));
}

async function submit(t: TestApp, apiKey: string, jobs: unknown[]): Promise<string[]> {
  const r = await t.gql(SUBMIT_MANY, { i: { jobs } }, apiKey);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id);
}

async function tenantWithCap(t: TestApp, name: string, cap: number) {
  const tenant = await t.createTenant(name, 'ENTERPRISE');
  const r = await t.gql(UPDATE, { i: { id: tenant.id, concurrencyCap: cap } });
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return tenant;
}

async function allFinal(sql: postgres.Sql): Promise<boolean> {
  const [r] = await sql`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
  return r!.n === 0;
}

/** Every queue's depth counter equals the waiting jobs it counts. */
async function assertDepthExact(sql: postgres.Sql): Promise<void> {
  const wrong = await sql`
    select q.tenant_id, q.class, q.depth, (select count(*)::int from jobs j where j.tenant_id = q.tenant_id and j.priority = q.class and j.state in ('QUEUED', 'WAITING_QUOTA')) as actual
    from sched_queues q`;
  for (const r of wrong) assert.equal(r.depth, r.actual, `depth of ${r.tenant_id}/${r.class}`);
}

/**
 * A Sluice (with a dispatcher) on a fresh database, against a simulator over real HTTP, for one
 * describe block: started before its tests, stopped after. Fields are set once `before` ran.
 */
function useApp(sim: Parameters<typeof startSimulator>[0], env: Record<string, string>) {
  const ctx = {} as { sim: Simulator; t: TestApp; sql: postgres.Sql };
  before(async () => {
    ctx.sim = await startSimulator(sim);
    ctx.t = await startTestApp({ APIVERVE_API_KEY: ctx.sim.apiKey, APIVERVE_BASE_URL: ctx.sim.url, BATCH_MAX: '1', SWEEP_INTERVAL_MS: '200', ...env });
    ctx.sql = postgres(ctx.t.databaseUrl, { max: 3, onnotice: () => {} });
  });
  after(async () => {
    await ctx.sql.end();
    await ctx.t.stop();
    await ctx.sim.stop();
  });
  return ctx;
}

describe('a settlement whose connection is killed mid-transaction', () => {
  const ctx = useApp({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 20, latencyP95Ms: 20, seed: 21 }, { APIVERVE_RATE_PER_MINUTE: '6000', INITIAL_LATENCY_MS: '20' });

  test('is retried until it lands: nothing leaks, no call is repeated, each job billed once', async () => {
    const { sim, t, sql } = ctx;
    // The settlement transaction stores the result: its first three tries kill their own connection
    // there, mid-transaction (a sequence is not rolled back, so the count survives the kills).
    await sql`create sequence test_settle_kills`;
    await sql.unsafe(`
      create function test_kill_settlement() returns trigger language plpgsql as $$
      begin
        if nextval('test_settle_kills') <= 3 then perform pg_terminate_backend(pg_backend_pid()); perform pg_sleep(5); end if;
        return new;
      end $$`);
    await sql.unsafe(`create trigger test_kill_settlement before update on jobs for each row when (new.state in ('SUCCEEDED', 'FAILED') and old.state = 'RUNNING') execute function test_kill_settlement()`);
    const tenant = await t.createTenant('killed-settle', 'PRO');
    const ids = await submit(t, tenant.apiKey, dns(5, 'k'));
    await eventually(() => allFinal(sql), 60_000, 100);

    const [kills] = await sql`select last_value::int as n from test_settle_kills`;
    assert.ok(kills!.n >= 4, `the settlement was killed three times and then landed (${kills!.n})`);
    const states = await assertJobsAccountedFor(sql);
    assert.equal(states.SUCCEEDED, ids.length);
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
    assert.equal(sim.stats().keys[sim.apiKey]!.calls, ids.length, 'one upstream call per job: none repeated');
    const [res] = await sql`select count(*)::int as n, count(distinct job_id)::int as jobs from reservations`;
    assert.equal(res!.n, ids.length, 'one reservation (attempt) per job');
    const [billed] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(billed!.n, sim.stats().totals.creditsBilled, 'billed once: the ledger equals the provider');
    await assertDepthExact(sql);
  });
});

describe('a lost pg-boss heartbeat while a call is in flight', () => {
  const ctx = useApp({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 3000, latencyP95Ms: 3000, seed: 22 }, { APIVERVE_RATE_PER_MINUTE: '6000', INITIAL_LATENCY_MS: '3000' });

  test('pg-boss handing the job out again makes no second call', async () => {
    const { sim, t, sql } = ctx;
    const tenant = await tenantWithCap(t, 'redelivered', 10);
    const [first] = await submit(t, tenant.apiKey, dns(1, 'first'));
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from reservations where job_id = ${first!} and settled_at is null`;
      return r!.n === 1;
    }, 20_000, 50);
    // What pg-boss's monitor does when an active job's heartbeat is lost: the job is up for fetching again.
    const moved = await sql`update pgboss.job set state = 'retry', start_after = now() where id = ${first!} and state = 'active' returning id`;
    assert.equal(moved.length, 1, 'the live attempt was active in pg-boss');
    // Work on the same queue, so the dispatcher fetches from it while the first call is in flight.
    const [second] = await submit(t, tenant.apiKey, dns(1, 'second'));
    await eventually(() => allFinal(sql), 60_000, 100);

    const [boss] = await sql`select state from pgboss.job where id = ${first!}`;
    assert.notEqual(boss!.state, 'retry', 'the dispatcher did fetch the redelivered job');
    assert.equal(sim.stats().keys[sim.apiKey]!.calls, 2, 'one call per job: the redelivery made no second call');
    const jobs = await sql`select id, state, attempts from jobs order by created_at`;
    assert.deepEqual(jobs.map((j) => [j.id, j.state, j.attempts]), [[first, 'SUCCEEDED', 1], [second, 'SUCCEEDED', 1]]);
    const [res] = await sql`select count(*)::int as n from reservations where job_id = ${first!}`;
    assert.equal(res!.n, 1, 'the first job had one attempt');
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
  });
});

describe('a sweeper slower than the node timeout', () => {
  const ctx = useApp(
    { plan: 'PRO', ratePerMinute: 6000, latencyMs: 4000, latencyP95Ms: 4000, seed: 23 },
    { APIVERVE_RATE_PER_MINUTE: '6000', INITIAL_LATENCY_MS: '4000', NODE_TIMEOUT_SECONDS: '1', ATTEMPT_LEASE_SECONDS: '4' },
  );

  test("never frees a live node's slots: its calls settle as billed, once", async () => {
    const { sim, t, sql } = ctx;
    // The node's own sweeper is slowed on purpose: its heartbeat takes 3 s, three node timeouts.
    await sql.unsafe(`
      create function test_slow_heartbeat() returns trigger language plpgsql as $$
      begin
        if current_setting('application_name') = 'sluice' then perform pg_sleep(3); end if;
        return new;
      end $$`);
    await sql.unsafe(`create trigger test_slow_heartbeat before update on nodes for each row execute function test_slow_heartbeat()`);
    // Another node's sweeper, at full speed, looks at the live node's attempts all along.
    const otherSql = postgres(t.databaseUrl, { max: 3, onnotice: () => {}, connection: { application_name: 'sluice-test' } });
    const otherBoss = await startBoss(t.databaseUrl, { supervise: false });
    const other = new Sweeper({ sql: otherSql, boss: otherBoss, nodeId: randomUUID(), role: 'worker', intervalMs: 200, nodeTimeoutSeconds: 1, timeoutBilling: 'billed', log: createLogger('silent') });
    try {
      const tenant = await tenantWithCap(t, 'slow-sweep', 10);
      const ids = await submit(t, tenant.apiKey, dns(3, 's'));
      let sawStaleNode = false;
      let rounds = 0;
      while (!(await allFinal(sql))) {
        const [stale] = await sql`select count(*)::int as n from nodes where heartbeat_at < now() - interval '1 second' and role <> 'worker'`;
        const [open] = await sql`select count(*)::int as n from reservations where settled_at is null`;
        if (stale!.n > 0 && open!.n > 0) sawStaleNode = true;
        const swept = await other.sweepOnce();
        assert.equal(swept.released, 0, "the other sweeper released a live node's attempt");
        rounds++;
        await new Promise((r) => setTimeout(r, 100));
        assert.ok(rounds < 600, 'the jobs finished');
      }
      assert.ok(sawStaleNode, 'the node looked dead (stale heartbeat) while its calls were in flight');
      const outcomes = await sql`select outcome, count(*)::int as n from reservations group by outcome`;
      assert.deepEqual(outcomes.map((r) => [r.outcome, r.n]), [['billed', ids.length]]);
      assert.equal(sim.stats().keys[sim.apiKey]!.calls, ids.length, 'one call per job');
      await assertQuiescent(sql);
      await assertLedgerBalances(sql);
    } finally {
      await otherBoss.stop({ graceful: false, close: true });
      await otherSql.end();
      await sql.unsafe('drop trigger test_slow_heartbeat on nodes');
    }
  });
});

describe('cancels, submissions, leases and settlements racing', () => {
  const ctx = useApp({ plan: 'PRO', ratePerMinute: 60_000, latencyMs: 15, latencyP95Ms: 30, seed: 24 }, { APIVERVE_RATE_PER_MINUTE: '60000', INITIAL_LATENCY_MS: '20', DISPATCH_IDLE_POLL_MS: '20' });

  test('cancel racing a lease: each job is cancelled without a call or runs once; no deadlock, no leak', async () => {
    const { sim, t, sql } = ctx;
    const tenant = await tenantWithCap(t, 'cancel-race', 20);
    const ids = await submit(t, tenant.apiKey, dns(150, 'c'));
    const errors = new Map<string, number>();
    let cancelled = 0;
    // Cancel every job, 10 at a time, while the dispatcher leases them.
    for (let i = 0; i < ids.length; i += 10) {
      await Promise.all(
        ids.slice(i, i + 10).map(async (id) => {
          const r = await t.gql(CANCEL, { id }, tenant.apiKey);
          if (r.body.data?.cancelJob) cancelled++;
          for (const e of r.body.errors ?? []) errors.set(e.extensions?.code, (errors.get(e.extensions?.code) ?? 0) + 1);
        }),
      );
    }
    assert.deepEqual([...errors.keys()].filter((c) => c !== 'NOT_CANCELLABLE'), [], `only NOT_CANCELLABLE refusals: ${JSON.stringify([...errors])}`);
    await eventually(() => allFinal(sql), 60_000, 100);
    const states = await assertJobsAccountedFor(sql);
    assert.equal(states.CANCELLED ?? 0, cancelled, 'every accepted cancel cancelled its job');
    assert.equal((states.CANCELLED ?? 0) + (states.SUCCEEDED ?? 0), ids.length);
    assert.equal(sim.stats().keys[sim.apiKey]!.calls, states.SUCCEEDED ?? 0, 'a call per job that ran, none for a cancelled one');
    const [ranCancelled] = await sql`select count(*)::int as n from jobs j where j.state = 'CANCELLED' and (exists (select 1 from reservations r where r.job_id = j.id) or j.result is not null or j.error_code is not null)`;
    assert.equal(ranCancelled!.n, 0, 'no cancelled job was leased');
    const [bossLive] = await sql`select count(*)::int as n from pgboss.job b join jobs j on j.id = b.id where j.state = 'CANCELLED' and b.state not in ('cancelled', 'completed')`;
    assert.equal(bossLive!.n, 0, "a cancelled job is not left for pg-boss to hand out");
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
    await assertDepthExact(sql);
  });

  test('depth counters never go negative (and end exact) under concurrent submit, cancel, lease and settle', async () => {
    const { sim, t, sql } = ctx;
    const tenants = await Promise.all([0, 1, 2].map((i) => tenantWithCap(t, `depth-${i}`, 8)));
    let minDepth = 0;
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const [r] = await sql`select coalesce(min(depth), 0)::int as n from sched_queues`;
        minDepth = Math.min(minDepth, r!.n);
        await new Promise((res) => setTimeout(res, 20));
      }
    })();
    const work = tenants.map(async (tenant, k) => {
      for (let round = 0; round < 6; round++) {
        const jobs = [...dns(10, `d${k}r${round}s`), ...dns(5, `d${k}r${round}b`).map((j) => ({ ...j, priority: 'BULK' }))];
        const ids = await submit(t, tenant.apiKey, jobs);
        await Promise.all(ids.filter((_, i) => i % 2 === 0).map((id) => t.gql(CANCEL, { id }, tenant.apiKey)));
      }
    });
    await Promise.all(work);
    await eventually(() => allFinal(sql), 60_000, 100);
    watching = false;
    await watcher;
    assert.equal(minDepth, 0, 'no depth counter went below zero');
    await assertDepthExact(sql);
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
  });
});
