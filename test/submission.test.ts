/**
 * The submission path under concurrency, against real processes and a real
 * Postgres: bounds that hold exactly when three API processes admit at once
 * (counted, not sampled), group commit (every caller its own answer, one bad
 * item failing only itself, a SIGKILL mid-group losing no acknowledged job),
 * and the estimate of a job that waits for quota.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { createTestDatabase } from './helpers/db.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { ADMIN_TOKEN } from './helpers/app.ts';
import { gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;
const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;

/** One GraphQL request; the raw answer (accepted or refused), never thrown. */
async function post(url: string, query: string, variables: Record<string, unknown>, token: string): Promise<{ status: number; retryAfter: string | null; body: any }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  return { status: res.status, retryAfter: res.headers.get('retry-after'), body: await res.json() };
}

async function tenantAt(url: string, name: string, tier: string, limits: Record<string, unknown> = {}): Promise<{ id: string; apiKey: string }> {
  const { createTenant } = await gqlAt(url, CREATE, { i: { name, tier } });
  if (Object.keys(limits).length > 0) await gqlAt(url, UPDATE, { i: { id: createTenant.tenant.id, ...limits } });
  return { id: createTenant.tenant.id, apiKey: createTenant.apiKey };
}

const job = (i: number, priority = 'STANDARD') => ({ api: 'dnslookup', params: { domain: `d${i}.example` }, priority });

describe('exact bounds: three API processes admitting at once', () => {
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  const nodes: NodeProcess[] = [];

  before(async () => {
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 2, onnotice: () => {} });
    // API role only: nothing drains, so every waiting job is one that admission let in.
    const env = { DATABASE_URL: db.url, GLOBAL_QUEUE_BOUND: '300', CLASS_SHARES: 'BULK=0.5,STANDARD=0.8,INTERACTIVE=1' };
    nodes.push(await startNode('api', env));
    nodes.push(...(await Promise.all([startNode('api', env), startNode('api', env)])));
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop('SIGKILL')));
    await sql.end();
    await db.drop();
  });

  const waiting = async (tenantId?: string) => {
    const [r] = tenantId
      ? await sql`select count(*)::int as n from jobs where tenant_id = ${tenantId} and state in ('QUEUED', 'WAITING_QUOTA')`
      : await sql`select count(*)::int as n from jobs where state in ('QUEUED', 'WAITING_QUOTA')`;
    return r!.n as number;
  };
  const queued = async (tenantId: string) => {
    const [r] = await sql`select count(*)::int as n from pgboss.job where name like ${`t.${tenantId}.%`}`;
    return r!.n as number;
  };

  test("a tenant's bound (its class share) is met exactly, never passed", async () => {
    const urls = nodes.map((n) => n.url!);
    // queueBound 50, STANDARD may fill 80 %: 40 jobs. 90 single submissions each, spread over three processes.
    const tenants = await Promise.all([0, 1, 2, 3].map((i) => tenantAt(urls[0]!, `bounded-${i}`, 'PRO', { queueBound: 50 })));
    const answers = await Promise.all(
      tenants.flatMap((t, ti) => Array.from({ length: 90 }, (_, i) => post(urls[(i + ti) % 3]!, SUBMIT, { i: job(i) }, t.apiKey).then((r) => ({ t, r })))),
    );
    for (const t of tenants) {
      const mine = answers.filter((a) => a.t === t).map((a) => a.r);
      const accepted = mine.filter((r) => r.body.data?.submitJob);
      const refused = mine.filter((r) => r.body.errors);
      assert.equal(accepted.length, 40, 'exactly the class share of the bound was admitted');
      assert.equal(refused.length, 50);
      for (const r of refused) {
        assert.equal(r.status, 429);
        assert.equal(r.body.errors[0].extensions.code, 'QUEUE_FULL');
        assert.equal(r.body.errors[0].extensions.scope, 'TENANT');
        assert.equal(r.body.errors[0].extensions.priority, 'STANDARD', 'the class share caused it');
        assert.equal(r.body.errors[0].extensions.retryable, true);
        assert.equal(r.retryAfter, String(r.body.errors[0].extensions.retryAfterSeconds));
      }
      assert.equal(await waiting(t.id), 40, 'the jobs table agrees');
      assert.equal(await queued(t.id), 40, 'and pg-boss holds one queue entry per accepted job');
      const [depth] = await sql`select sum(depth)::int as n from sched_queues where tenant_id = ${t.id}`;
      assert.equal(depth!.n, 40, 'the depth counters agree');
    }
  });

  test('the global bound (per class share) is never passed, singles and bulk mixed', async () => {
    const urls = nodes.map((n) => n.url!);
    const before = await waiting();
    assert.equal(before, 160);
    const tenants = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => tenantAt(urls[1]!, `big-${i}`, 'ENTERPRISE')));
    // STANDARD may fill 240 of 300: 80 more. Far more is asked, from every process at once.
    const std = await Promise.all(
      tenants.flatMap((t, ti) =>
        Array.from({ length: 30 }, (_, i) =>
          i % 3 === 0
            ? post(urls[(i + ti) % 3]!, SUBMIT_MANY, { i: { jobs: [job(i), job(i + 1000), job(i + 2000)] } }, t.apiKey)
            : post(urls[(i + ti) % 3]!, SUBMIT, { i: job(i) }, t.apiKey),
        ),
      ),
    );
    const acceptedStd = std.reduce((n, r) => n + (r.body.data?.submitJob ? 1 : (r.body.data?.submitJobs?.jobs.length ?? 0)), 0);
    const refusedStd = std.filter((r) => r.body.errors);
    assert.ok(refusedStd.length > 0, 'demand passed the bound');
    for (const r of refusedStd) {
      assert.equal(r.body.errors[0].extensions.code, 'QUEUE_FULL');
      assert.equal(r.body.errors[0].extensions.scope, 'GLOBAL');
      assert.equal(r.body.errors[0].extensions.priority, 'STANDARD');
    }
    assert.equal(await waiting(), before + acceptedStd, 'every accepted job is stored, nothing else');
    assert.ok(before + acceptedStd <= 240, `STANDARD share never passed: ${before + acceptedStd} waiting`);

    // INTERACTIVE may fill the whole bound; single submissions fill it exactly.
    const inter = await Promise.all(
      tenants.flatMap((t, ti) => Array.from({ length: 40 }, (_, i) => post(urls[(i + ti) % 3]!, SUBMIT, { i: job(i, 'INTERACTIVE') }, t.apiKey))),
    );
    const acceptedInter = inter.filter((r) => r.body.data?.submitJob).length;
    assert.equal(await waiting(), 300, 'the global bound is met exactly');
    assert.equal(before + acceptedStd + acceptedInter, 300);
    const [pgboss] = await sql`select count(*)::int as n from pgboss.job where name like 't.%'`;
    assert.equal(pgboss!.n, 300);
  });
});

describe('group commit', () => {
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    // A long window and a group size the test fills: concurrent submissions share a transaction.
    t = await startTestApp({ SLUICE_ROLE: 'api', GROUP_COMMIT_MS: '1000', GROUP_COMMIT_MAX: '40' });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  test('concurrent single submissions share transactions, and every caller gets its own job', async () => {
    const a = await t.createTenant('grouped-a', 'PRO');
    const b = await t.createTenant('grouped-b', 'PRO');
    const sent = Array.from({ length: 80 }, (_, i) => ({ tenant: i % 2 ? a : b, input: { api: 'dnslookup', params: { domain: `caller-${i}.example` } } }));
    const answers = await Promise.all(sent.map((s) => post(t.url, SUBMIT, { i: s.input }, s.tenant.apiKey)));
    const ids = answers.map((r) => r.body.data.submitJob.job.id as string);
    assert.equal(new Set(ids).size, 80);
    const rows = await sql`select id, tenant_id, params, created_at from jobs where id = any(${ids}::uuid[])`;
    const byId = new Map(rows.map((r) => [r.id as string, r]));
    sent.forEach((s, i) => {
      const row = byId.get(ids[i]!);
      assert.ok(row, `caller ${i}'s job is stored`);
      assert.equal(row.tenant_id, s.tenant.id, `caller ${i}'s job is its tenant's`);
      assert.deepEqual(row.params, s.input.params, `caller ${i} got the job it submitted`);
    });
    // Jobs of one transaction share created_at (transaction start): fewer transactions than submissions.
    const transactions = new Set(rows.map((r) => (r.created_at as Date).getTime())).size;
    assert.ok(transactions < 80, `grouped: ${transactions} transactions for 80 submissions`);
  });

  test('one bad item fails only its own submission: a conflict, a full queue, a missing pg-boss queue', async () => {
    const good = await t.createTenant('good', 'PRO');
    const full = await t.createTenant('full', 'PRO');
    const broken = await t.createTenant('broken', 'PRO');
    await t.gql(UPDATE, { i: { id: full.id, queueBound: 1 } });
    await post(t.url, SUBMIT, { i: { api: 'dnslookup', params: { domain: 'first.example' }, priority: 'INTERACTIVE', idempotencyKey: 'k1' } }, good.apiKey);
    await post(t.url, SUBMIT, { i: { api: 'dnslookup', params: { domain: 'only.example' }, priority: 'INTERACTIVE' } }, full.apiKey);
    // The broken tenant's STANDARD queue is gone from pg-boss: its insert fails in the database.
    await sql`delete from pgboss.queue where name = ${`t.${broken.id}.standard`}`;

    const calls = [
      ...Array.from({ length: 36 }, (_, i) => ({ tenant: good, input: { api: 'dnslookup', params: { domain: `ok-${i}.example` } }, expect: 'ok' })),
      { tenant: good, input: { api: 'dnslookup', params: { domain: 'second.example' }, idempotencyKey: 'k1' }, expect: 'IDEMPOTENCY_CONFLICT' },
      { tenant: full, input: { api: 'dnslookup', params: { domain: 'more.example' }, priority: 'INTERACTIVE' }, expect: 'QUEUE_FULL' },
      { tenant: broken, input: { api: 'dnslookup', params: { domain: 'lost-queue.example' } }, expect: 'INTERNAL_SERVER_ERROR' },
      { tenant: good, input: { api: 'dnslookup', params: { domain: 'first.example' }, priority: 'INTERACTIVE', idempotencyKey: 'k1' }, expect: 'replay' },
    ];
    const answers = await Promise.all(calls.map((c) => post(t.url, SUBMIT, { i: c.input }, c.tenant.apiKey)));
    const [original] = await sql`select id from jobs where tenant_id = ${good.id} and idempotency_key = 'k1'`;
    calls.forEach((c, i) => {
      const r = answers[i]!;
      if (c.expect === 'ok') assert.ok(r.body.data?.submitJob?.job?.id, `call ${i} accepted: ${JSON.stringify(r.body)}`);
      else if (c.expect === 'replay') assert.equal(r.body.data?.submitJob?.job?.id, original!.id);
      else assert.equal(r.body.errors?.[0]?.extensions?.code, c.expect, `call ${i}: ${JSON.stringify(r.body)}`);
    });
    const conflict = answers[36]!.body.errors[0];
    assert.equal(conflict.extensions.jobId, original!.id, 'the conflict names the original job');
    assert.equal(answers[37]!.body.errors[0].extensions.scope, 'TENANT');
    assert.doesNotMatch(JSON.stringify(answers[38]!.body), /pgboss|insert|select/i, 'no SQL reaches the client');
    const [n] = await sql`select count(*)::int as n from jobs where tenant_id = ${good.id}`;
    assert.equal(n!.n, 37, 'the 36 good ones and the original');
    const [m] = await sql`select count(*)::int as n from jobs where tenant_id = ${broken.id}`;
    assert.equal(m!.n, 0, 'the failed one left nothing behind');
  });

  test('a submission bigger than the bound itself is refused as never fitting: 413, retryable false, no Retry-After', async () => {
    const small = await t.createTenant('small', 'FREE');
    await t.gql(UPDATE, { i: { id: small.id, queueBound: 10 } });
    const many = (n: number, priority: string) => Array.from({ length: n }, (_, i) => job(i, priority));
    const whole = await post(t.url, SUBMIT_MANY, { i: { jobs: many(11, 'INTERACTIVE') } }, small.apiKey);
    assert.equal(whole.status, 413);
    assert.equal(whole.retryAfter, null);
    assert.equal(whole.body.errors[0].extensions.code, 'QUEUE_FULL');
    assert.equal(whole.body.errors[0].extensions.retryable, false);
    assert.equal(whole.body.errors[0].extensions.retryAfterSeconds, undefined);
    assert.equal(whole.body.errors[0].extensions.priority, undefined, 'the whole bound, not a share');
    // STANDARD may fill 90 % of 10 (the default shares): 10 STANDARD jobs never fit, and the share is named.
    const share = await post(t.url, SUBMIT_MANY, { i: { jobs: many(10, 'STANDARD') } }, small.apiKey);
    assert.equal(share.status, 413);
    assert.equal(share.body.errors[0].extensions.retryable, false);
    assert.equal(share.body.errors[0].extensions.scope, 'TENANT');
    assert.equal(share.body.errors[0].extensions.priority, 'STANDARD');
    // While one that fits later is retryable, with Retry-After.
    assert.ok((await post(t.url, SUBMIT_MANY, { i: { jobs: many(5, 'STANDARD') } }, small.apiKey)).body.data);
    const later = await post(t.url, SUBMIT_MANY, { i: { jobs: many(5, 'STANDARD') } }, small.apiKey);
    assert.equal(later.status, 429);
    assert.equal(later.body.errors[0].extensions.retryable, true);
    assert.equal(later.retryAfter, String(later.body.errors[0].extensions.retryAfterSeconds));
  });
});

describe('a crash mid-group', () => {
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  let node: NodeProcess | null = null;

  before(async () => {
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await node?.stop('SIGKILL');
    await sql.end();
    await db.drop();
  });

  test('SIGKILL while groups commit loses no acknowledged job, and leaves no half-written one', async () => {
    node = await startNode('api', { DATABASE_URL: db.url, GROUP_COMMIT_MS: '5', GROUP_COMMIT_MAX: '50' });
    const url = node.url!;
    const tenant = await tenantAt(url, 'crashed', 'ENTERPRISE');
    const acked: string[] = [];
    let stop = false;
    const client = async (c: number) => {
      for (let i = 0; !stop; i++) {
        try {
          const r = await post(url, SUBMIT, { i: { api: 'dnslookup', params: { domain: `c${c}-${i}.example` } } }, tenant.apiKey);
          if (r.body.data?.submitJob) acked.push(r.body.data.submitJob.job.id);
        } catch {
          return; // the process is gone
        }
      }
    };
    const clients = Array.from({ length: 32 }, (_, c) => client(c));
    await eventually(async () => acked.length >= 300, 60_000, 20);
    node.child.kill('SIGKILL');
    stop = true;
    await Promise.all(clients);
    await node.stop('SIGKILL');
    node = null;

    const stored = await sql`select id from jobs where tenant_id = ${tenant.id}`;
    const storedIds = new Set(stored.map((r) => r.id as string));
    const missing = acked.filter((id) => !storedIds.has(id));
    assert.deepEqual(missing, [], 'every acknowledged job is stored');
    const queuedRows = await sql`select id from pgboss.job where name = ${`t.${tenant.id}.standard`}`;
    const queuedIds = new Set(queuedRows.map((r) => r.id as string));
    assert.deepEqual([...storedIds].filter((id) => !queuedIds.has(id)), [], 'every stored job has its queue entry');
    assert.deepEqual([...queuedIds].filter((id) => !storedIds.has(id)), [], 'and no queue entry lacks its job');
    const [depth] = await sql`select sum(depth)::int as n from sched_queues where tenant_id = ${tenant.id}`;
    assert.equal(depth!.n, storedIds.size, 'the depth counters agree');
    assert.ok(storedIds.size >= acked.length);
  });
});

describe('estimates that do not lie', () => {
  let t: TestApp;
  before(async () => {
    t = await startTestApp({});
  });
  after(() => t.stop());

  test('a job waiting for quota is estimated at the period end, and says QUOTA', async () => {
    const a = await t.createTenant('thrifty', 'FREE');
    await t.gql(UPDATE, { i: { id: a.id, monthlyQuota: 1, quotaPolicy: 'WAIT' } });
    const first = await post(t.url, SUBMIT, { i: { api: 'dnslookup', params: { domain: 'paid.example' } } }, a.apiKey);
    const second = await post(t.url, SUBMIT, { i: { api: 'dnslookup', params: { domain: 'waits.example' } } }, a.apiKey);
    assert.ok(first.body.data && second.body.data);
    const q = `query($id: ID!) { job(id: $id) { state estimatedStartAt waitReason } me { usage { periodEnd } } }`;
    const waiting = await eventually(async () => {
      const r = await post(t.url, q, { id: second.body.data.submitJob.job.id }, a.apiKey);
      return r.body.data.job.state === 'WAITING_QUOTA' ? r.body.data : null;
    }, 30_000);
    assert.equal(waiting.job.waitReason, 'QUOTA');
    assert.equal(waiting.job.estimatedStartAt, waiting.me.usage.periodEnd, 'it starts when the quota renews, not "a second from now"');

    // A quota that cannot pay for the job even after renewal: no estimate, and the reason.
    await t.gql(UPDATE, { i: { id: a.id, monthlyQuota: 0 } });
    const never = await post(t.url, q, { id: second.body.data.submitJob.job.id }, a.apiKey);
    assert.equal(never.body.data.job.state, 'WAITING_QUOTA');
    assert.equal(never.body.data.job.estimatedStartAt, null);
    assert.equal(never.body.data.job.waitReason, 'QUOTA');
    void ADMIN_TOKEN;
  });
});
