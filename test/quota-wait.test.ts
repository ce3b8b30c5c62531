/**
 * A quota wait is O(1) in the lease: the call that finds a tenant's next job past its quota (policy
 * WAIT) sets the tenant's flag and its queues' dormancy, and writes none of its jobs, whatever its
 * backlog (it used to rewrite every QUEUED job to WAITING_QUOTA with a NOTIFY each, holding the
 * window's lock). The jobs still show WAITING_QUOTA with their wait reason (derived from the flag
 * when read), filters by state agree with what the jobs show, a subscriber to one of them sees it
 * wait, and after the renewal they run.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import { inTransaction, queueName, startBoss } from '../src/queue/boss.ts';
import { leaseJobs } from '../src/scheduler/sql/reservations.ts';
import { markQueuesReady } from '../src/scheduler/sql/queues.ts';
import { unblockQuota } from '../src/scheduler/sql/tenants.ts';
import { oldestQueuedAgeByClass, oldestWaitByClass } from '../src/scheduler/sql/classes.ts';
import type { JobClass } from '../src/config/classes.ts';
import { eventFromPayload } from '../src/events/bus.ts';
import { JOB_STATES, visibleJobState } from '../src/jobs/store.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { watch } from './helpers/ws-watch.ts';

const WINDOW = 'quota-wait';
const BACKLOG = 20_000;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;

let t: TestApp;
let sql: postgres.Sql;
let boss: PgBoss;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 3, onnotice: () => {} });
  boss = await startBoss(t.databaseUrl, { max: 2, supervise: false });
  await sql`insert into windows (name, rate_per_minute, burst, tokens) values (${WINDOW}, null, 0, 0) on conflict do nothing`;
});

after(async () => {
  await boss?.stop({ graceful: false, close: true });
  await sql?.end();
  await t?.stop();
});

/** n QUEUED jobs of the tenant in bulk (jobs, pg-boss and the ready mark in one transaction). */
async function addJobs(tenantId: string, n: number, jobClass: JobClass = 'STANDARD'): Promise<string[]> {
  const jobs = Array.from({ length: n }, (_, i) => ({ id: randomUUID(), api: 'exchangerate', params: { x: i } }));
  await sql.begin(async (tx) => {
    await tx`
      insert into jobs (id, tenant_id, api, params, priority, state)
      select x.id, ${tenantId}, x.api, x.params, ${jobClass}, 'QUEUED'
      from jsonb_to_recordset(${tx.json(jobs as never)}::jsonb) as x(id uuid, api text, params jsonb)`;
    await boss.insert(queueName(tenantId, jobClass), jobs.map((j) => ({ id: j.id, data: { tenantId, api: j.api, params: j.params } })), { db: inTransaction(tx) });
    await markQueuesReady(tx, tenantId, [jobClass]);
  });
  return jobs.map((j) => j.id);
}

/** One lease call on its own connection, with the rows it updated in jobs (Postgres's counter). */
async function lease(): Promise<{ jobs: string[]; jobsUpdated: number }> {
  const conn = await sql.reserve();
  try {
    const updated = async () => {
      await conn`select pg_stat_force_next_flush()`;
      await conn`select pg_stat_clear_snapshot()`;
      const [r] = await conn`select n_tup_upd::int as n from pg_stat_user_tables where relname = 'jobs'`;
      return r!.n as number;
    };
    const before = await updated();
    const { rows } = await leaseJobs(conn as unknown as postgres.Sql, {
      window: WINDOW, nodeId: randomUUID(), pool: 50, max: 8, leaseMax: 8, classes: ['STANDARD'], leaseSeconds: 30,
      costs: { exchangerate: 1 }, hold: [], batch: {}, batchMax: 1, batchQuantum: 8,
    });
    return { jobs: rows.map((r) => r.jobId), jobsUpdated: (await updated()) - before };
  } finally {
    conn.release();
  }
}

test('a tenant with a large backlog runs out of quota: the lease writes none of its jobs, they show WAITING_QUOTA, and run after the renewal', async () => {
  const tenant = await t.createTenant('backlogged', 'ENTERPRISE');
  // 3 credits left: the lease claims 3 jobs and blocks the tenant on the 4th.
  const r = await t.gql(UPDATE, { i: { id: tenant.id, monthlyQuota: 3, quotaPolicy: 'WAIT' } });
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  const ids = await addJobs(tenant.id, BACKLOG);
  await sql`analyze jobs`;

  // Every event on the channel the lease sends (one per job, before).
  const events: Array<Record<string, unknown>> = [];
  const listener = await sql.listen('sluice_job_events', (p) => void events.push(JSON.parse(p) as Record<string, unknown>));
  const follow = ids[BACKLOG - 1]!;
  const sub = watch(t.url, tenant.apiKey, `subscription { jobUpdated(id: "${follow}") { id state } }`);
  try {
    await eventually(async () => sub.events.length > 0, 20_000, 20);

    const blocking = await lease();
    assert.equal(blocking.jobs.length, 3, 'the jobs the quota pays for are leased');
    const [st] = await sql`select quota_blocked from sched_tenants where tenant_id = ${tenant.id}`;
    assert.equal(st!.quota_blocked, true, 'the tenant waits for quota');
    // The 3 claims (QUEUED → RUNNING) and nothing for the backlog (it was 20,000 before).
    assert.ok(blocking.jobsUpdated <= 3, `rows of jobs updated by the blocking lease: ${blocking.jobsUpdated}`);
    await eventually(async () => events.some((e) => e.state === 'WAITING_QUOTA'), 10_000, 20);
    const waitEvents = events.filter((e) => e.state === 'WAITING_QUOTA');
    assert.deepEqual(waitEvents, [{ tenantId: tenant.id, state: 'WAITING_QUOTA', allWaiting: true }], 'one tenant-wide event, not one per job');

    // What clients see: the job waits for quota, with its reason and the renewal as its estimate.
    const JOB = `query($id: ID!) { job(id: $id) { state waitReason estimatedStartAt } me { usage { periodEnd } queues { priority waitReason } } }`;
    const seen = await t.gql(JOB, { id: follow }, tenant.apiKey);
    assert.equal(seen.body.data.me.queues.find((q: { priority: string }) => q.priority === 'STANDARD').waitReason, 'QUOTA');
    assert.equal(seen.body.data.job.state, 'WAITING_QUOTA');
    assert.equal(seen.body.data.job.waitReason, 'QUOTA');
    assert.equal(seen.body.data.job.estimatedStartAt, seen.body.data.me.usage.periodEnd);
    // Filters by state agree with what the jobs show.
    const COUNT = `query($s: JobState!) { jobs(filter: { state: $s }, first: 2) { totalCount edges { node { id state } } } }`;
    const waiting = await t.gql(COUNT, { s: 'WAITING_QUOTA' }, tenant.apiKey);
    assert.equal(waiting.body.data.jobs.totalCount, BACKLOG - 3);
    assert.deepEqual(waiting.body.data.jobs.edges.map((e: { node: { state: string } }) => e.node.state), ['WAITING_QUOTA', 'WAITING_QUOTA']);
    const queued = await t.gql(COUNT, { s: 'QUEUED' }, tenant.apiKey);
    assert.equal(queued.body.data.jobs.totalCount, 0, 'no job of a blocked tenant shows QUEUED');
    const running = await t.gql(COUNT, { s: 'RUNNING' }, tenant.apiKey);
    assert.equal(running.body.data.jobs.totalCount, 3);
    // A job submitted while blocked is stored QUEUED and answered WAITING_QUOTA, a replay too.
    const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
    const input = { api: 'exchangerate', params: { currency1: 'EUR', currency2: 'USD' }, idempotencyKey: 'while-blocked' };
    const submitted = await t.gql(SUBMIT, { i: input }, tenant.apiKey);
    assert.equal(submitted.body.data?.submitJob.job.state, 'WAITING_QUOTA', JSON.stringify(submitted.body.errors));
    const [stored] = await sql`select state from jobs where id = ${submitted.body.data.submitJob.job.id}`;
    assert.equal(stored!.state, 'QUEUED');
    assert.equal((await t.gql(SUBMIT, { i: input }, tenant.apiKey)).body.data.submitJob.job.state, 'WAITING_QUOTA');
    const CANCEL = `mutation { cancelJobs(filter: { state: WAITING_QUOTA, idempotencyKey: "while-blocked" }) { cancelled more } }`;
    const cancelled = await t.gql(CANCEL, {}, tenant.apiKey);
    assert.equal(cancelled.body.data?.cancelJobs.cancelled, 1, JSON.stringify(cancelled.body.errors));
    // A subscriber to one waiting job sees it wait.
    await eventually(async () => JSON.stringify(sub.events).includes('WAITING_QUOTA'), 10_000, 20);
    // The depth counts it as it did (a waiting job either way).
    const [q] = await sql`select depth from sched_queues where tenant_id = ${tenant.id} and class = 'STANDARD'`;
    assert.equal(q!.depth, BACKLOG - 3);

    // The renewal (here: a raised quota; the sweeper lifts the block the same way): the jobs show
    // QUEUED again and the next lease runs them.
    await t.gql(UPDATE, { i: { id: tenant.id, monthlyQuota: 1_000_000 } });
    const released = await sql.begin((tx) => unblockQuota(tx, tenant.id));
    assert.equal(released, BACKLOG - 3);
    assert.equal((await t.gql(JOB, { id: follow }, tenant.apiKey)).body.data.job.state, 'QUEUED');
    assert.equal((await t.gql(COUNT, { s: 'WAITING_QUOTA' }, tenant.apiKey)).body.data.jobs.totalCount, 0);
    const after = await lease();
    assert.equal(after.jobs.length, 8, 'the backlog runs again');
  } finally {
    await sub.client.dispose();
    await listener.unlisten();
  }
});

test('the state a job shows: the same mapping in SQL and TypeScript; the tenant-wide event parses', async () => {
  for (const state of JOB_STATES) {
    for (const blocked of [false, true, null]) {
      const [r] = await sql`select sluice_job_state(${state}, ${blocked}::boolean) as s`;
      assert.equal(r!.s, visibleJobState(state, blocked === true), `${state}, blocked ${blocked}`);
    }
  }
  assert.equal(visibleJobState('QUEUED', true), 'WAITING_QUOTA');
  assert.equal(visibleJobState('RUNNING', true), 'RUNNING');
  const tenantId = randomUUID();
  assert.deepEqual(eventFromPayload(JSON.stringify({ tenantId, state: 'WAITING_QUOTA', allWaiting: true })), { jobId: '', tenantId, state: 'WAITING_QUOTA', allWaiting: true });
  assert.equal(eventFromPayload(JSON.stringify({ tenantId, state: 'WAITING_QUOTA' })), null, 'no jobId and not tenant-wide: not an event');
});

test("a blocked tenant's jobs (stored QUEUED) do not age the class for the alerts and the starvation guard", async () => {
  const blocked = await t.createTenant('blocked-old', 'PRO');
  const other = await t.createTenant('servable', 'PRO');
  await addJobs(blocked.id, 5, 'INTERACTIVE');
  await sql`update jobs set created_at = now() - interval '1 hour' where tenant_id = ${blocked.id}`;
  await addJobs(other.id, 1, 'INTERACTIVE');
  await sql`update sched_tenants set quota_blocked = true where tenant_id = ${blocked.id}`;
  const age = (await oldestQueuedAgeByClass(sql)).INTERACTIVE!;
  assert.ok(age < 600, `the servable job's age, not the blocked tenant's hour: ${age}`);
  assert.ok((await oldestWaitByClass(sql)).INTERACTIVE! < 600_000);
  const plan = await sql.unsafe(`explain (analyze, format json) select extract(epoch from now() - coalesce(
      (select o.created_at from (select created_at, tenant_id from jobs where priority = 'INTERACTIVE' and state = 'QUEUED' order by created_at limit 1000) o
        where not exists (select 1 from sched_tenants t where t.tenant_id = o.tenant_id and t.quota_blocked) order by o.created_at limit 1), now()))`);
  // The probe walks the index lazily, past the blocked tenant's 5 jobs to the servable one: no sort of up to 1,000.
  assert.ok(!JSON.stringify(plan).includes('"Node Type":"Sort"'), 'no sort');
  assert.ok(JSON.stringify(plan).includes('"Index Name":"jobs_queued_age_idx","Relation Name":"jobs","Alias":"jobs","Startup Cost"'), 'the index in created_at order');
  await sql`update sched_tenants set quota_blocked = false where tenant_id = ${blocked.id}`;
  assert.ok((await oldestQueuedAgeByClass(sql)).INTERACTIVE! >= 3600, 'unblocked, its jobs count again');
});
