/**
 * Bulk ingest through an admission reservation (jobs/service.ts submitBulk,
 * admission/store.ts): a submitJobs of ≥ BULK_RESERVE_MIN jobs (keyed or not) is
 * admitted under the gate into `admission_reservations`, then written outside
 * it. Against real processes and a real Postgres:
 *  - whole or nothing, and the reservation is gone once the jobs are written;
 *  - keyed bulks racing for the same keys store one job per key and answer it alike;
 *  - bounds stay exact with bulks and singles admitted at once on two processes;
 *  - a process killed between the reservation and the insert writes nothing,
 *    its reservation keeps counting against the bound, and the sweeper gives
 *    the room back once it expires.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { createTestDatabase } from './helpers/db.ts';
import { eventually } from './helpers/app.ts';
import { gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';
import { reservesRoom } from '../src/jobs/service.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;
const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;

async function post(url: string, query: string, variables: Record<string, unknown>, token: string): Promise<{ status: number; body: any }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  return { status: res.status, body: await res.json() };
}

const job = (i: number) => ({ api: 'dnslookup', params: { domain: `b${i}.example` }, priority: 'STANDARD' });
const jobs = (n: number, from: number) => Array.from({ length: n }, (_, k) => job(from + k));

describe('bulk ingest through admission reservations', () => {
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  let a: NodeProcess;
  let b: NodeProcess;
  const extra: NodeProcess[] = [];
  // API role only: nothing drains, so every waiting job is one admission let in. Whole shares, so
  // the tenant bound is the number to count against.
  const env = (more: Record<string, string> = {}) => ({ DATABASE_URL: db.url, CLASS_SHARES: 'BULK=1,STANDARD=1,INTERACTIVE=1', DB_POOL_MAX: '4', ...more });

  const tenantAt = async (name: string, queueBound: number) => {
    const { createTenant } = await gqlAt(a.url!, CREATE, { i: { name, tier: 'PRO' } });
    await gqlAt(a.url!, UPDATE, { i: { id: createTenant.tenant.id, queueBound } });
    return { id: createTenant.tenant.id as string, apiKey: createTenant.apiKey as string };
  };
  const count = async (q: postgres.PendingQuery<postgres.Row[]>) => ((await q)[0]!.n as number);
  const waiting = (tenantId: string) => count(sql`select count(*)::int as n from jobs where tenant_id = ${tenantId} and state in ('QUEUED', 'WAITING_QUOTA')`);
  const bossRows = (tenantId: string) => count(sql`select count(*)::int as n from pgboss.job where name like ${`t.${tenantId}.%`}`);
  const reserved = (tenantId: string) => count(sql`select coalesce(sum(jobs), 0)::int as n from admission_reservations where tenant_id = ${tenantId}`);

  before(async () => {
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 3, onnotice: () => {} });
    [a, b] = await Promise.all([startNode('api', env()), startNode('api', env())]);
  });
  after(async () => {
    await Promise.all([a, b, ...extra].map((n) => n?.stop('SIGKILL')));
    await sql.end();
    await db.drop();
  });

  test('which submissions reserve: at least the minimum, keyed or not', () => {
    const keyless = (n: number) => Array.from({ length: n }, () => ({ idempotencyKey: null }));
    assert.equal(reservesRoom(keyless(500), 500), true);
    assert.equal(reservesRoom(keyless(499), 500), false);
    assert.equal(reservesRoom([...keyless(600), { idempotencyKey: 'k' }], 500), true, 'keyed jobs too: the unique index decides a key race, the loser decides again');
  });

  test('a bulk submission is written whole, and its reservation is gone once it is', async () => {
    const t = await tenantAt('whole', 10_000);
    const r = await post(a.url!, SUBMIT_MANY, { i: { jobs: jobs(800, 0) } }, t.apiKey);
    assert.equal(r.body.data?.submitJobs.jobs.length, 800, JSON.stringify(r.body.errors));
    assert.equal(await waiting(t.id), 800);
    assert.equal(await bossRows(t.id), 800);
    assert.equal(await reserved(t.id), 0);
    const [depth] = await sql`select sum(depth)::int as n from sched_queues where tenant_id = ${t.id}`;
    assert.equal(depth!.n, 800, 'the depth counters agree');
  });

  test('keyed bulks written outside the gate: concurrent submissions of the same keys get one job per key', async () => {
    const t = await tenantAt('keyed', 10_000);
    const keyed = (n: number, from: number) => jobs(n, from).map((j, k) => ({ ...j, idempotencyKey: `k-${from + k}` }));
    // Two bulks sharing 400 keys, on both processes at once, and singles with keys of either or neither.
    const first = keyed(600, 0);
    const second = keyed(600, 200);
    const singles = [250, 300, 650, 900].map((i) => keyed(1, i)[0]!);
    const answers = await Promise.all([
      post(a.url!, SUBMIT_MANY, { i: { jobs: first } }, t.apiKey),
      post(b.url!, SUBMIT_MANY, { i: { jobs: second } }, t.apiKey),
      ...singles.map((j, i) => post([a, b][i % 2]!.url!, SUBMIT, { i: j }, t.apiKey)),
    ]);
    for (const r of answers) assert.ok(r.body.data, JSON.stringify(r.body.errors));
    // Every answer names the same job for the same key.
    const byKey = new Map<string, string>();
    const note = (key: string, id: string) => {
      const seen = byKey.get(key);
      if (seen) assert.equal(id, seen, `key ${key} answered with two jobs`);
      else byKey.set(key, id);
    };
    answers[0]!.body.data.submitJobs.jobs.forEach((j: { id: string }, k: number) => note(first[k]!.idempotencyKey, j.id));
    answers[1]!.body.data.submitJobs.jobs.forEach((j: { id: string }, k: number) => note(second[k]!.idempotencyKey, j.id));
    singles.forEach((j, i) => note(j.idempotencyKey, answers[2 + i]!.body.data.submitJob.job.id));
    assert.equal(byKey.size, 801, 'keys k-0 … k-799 and k-900');
    assert.equal(await waiting(t.id), 801, 'one stored job per key');
    assert.equal(await bossRows(t.id), 801);
    assert.equal(await reserved(t.id), 0, 'every reservation claimed or given back');
    const [depth] = await sql`select sum(depth)::int as n from sched_queues where tenant_id = ${t.id}`;
    assert.equal(depth!.n, 801, 'the depth counters agree');
  });

  test('bounds stay exact: bulks and singles admitted at once on two processes', async () => {
    const t = await tenantAt('contended', 1_500);
    // Four bulks of 600 (at most two fit) and 120 singles, spread over both processes at once.
    const answers = await Promise.all([
      ...[0, 1, 2, 3].map((k) => post([a, b][k % 2]!.url!, SUBMIT_MANY, { i: { jobs: jobs(600, 10_000 * (k + 1)) } }, t.apiKey).then((r) => ({ n: 600, r }))),
      ...Array.from({ length: 120 }, (_, i) => post([a, b][i % 2]!.url!, SUBMIT, { i: job(100_000 + i) }, t.apiKey).then((r) => ({ n: 1, r }))),
    ]);
    const accepted = answers.filter((x) => x.r.body.data).reduce((s, x) => s + x.n, 0);
    for (const x of answers.filter((y) => y.r.body.errors)) {
      assert.equal(x.r.body.errors[0].extensions.code, 'QUEUE_FULL', JSON.stringify(x.r.body.errors));
      assert.equal(x.r.body.errors[0].extensions.scope, 'TENANT');
    }
    assert.ok(accepted <= 1_500, `admitted ${accepted} of a bound of 1,500`);
    assert.ok(answers.some((x) => x.n === 600 && x.r.body.data), 'a bulk got in');
    assert.equal(await waiting(t.id), accepted, 'every answered acceptance is stored, nothing else');
    assert.equal(await bossRows(t.id), accepted);
    assert.equal(await reserved(t.id), 0);
  });

  test('a process killed between reservation and insert: nothing written, the room counts until the sweeper reclaims it', async () => {
    const t = await tenantAt('crashed', 1_000);
    // The crashing process writes nothing until we let it: its insert's depth trigger needs the
    // tenant's STANDARD sched_queues row, which this transaction holds. Its reservation (gate
    // transaction) touches no such row, so it commits.
    const c = await startNode('api', env({ ADMISSION_RESERVATION_SECONDS: '1' }));
    extra.push(c);
    const holder = await sql.reserve();
    try {
      await holder`begin`;
      await holder`select 1 from sched_queues where tenant_id = ${t.id} and class = 'STANDARD' for update`;
      const doomed = post(c.url!, SUBMIT_MANY, { i: { jobs: jobs(700, 200_000) } }, t.apiKey).catch(() => null);
      await eventually(async () => (await reserved(t.id)) === 700, 30_000, 50);
      await c.stop('SIGKILL');
      await doomed;
    } finally {
      await holder`rollback`;
      holder.release();
    }
    assert.equal(await waiting(t.id), 0, 'whole or nothing: no job of the killed submission');
    assert.equal(await bossRows(t.id), 0);

    // Expired but not reclaimed (no sweeper runs yet): it still counts. 700 reserved + 400 > 1,000.
    assert.equal(await reserved(t.id), 700);
    const refused = await post(a.url!, SUBMIT_MANY, { i: { jobs: jobs(400, 300_000) } }, t.apiKey);
    assert.equal(refused.body.errors?.[0]?.extensions.code, 'QUEUE_FULL', JSON.stringify(refused.body));
    assert.equal(refused.body.errors[0].extensions.scope, 'TENANT');

    // A worker's sweeper deletes the expired reservation; the room is back.
    const w = await startNode('worker', env({ SWEEP_INTERVAL_MS: '200', METRICS_PORT: '0' }));
    extra.push(w);
    await eventually(async () => (await reserved(t.id)) === 0, 30_000, 100);
    const ok = await post(a.url!, SUBMIT_MANY, { i: { jobs: jobs(1_000, 400_000) } }, t.apiKey);
    assert.equal(ok.body.data?.submitJobs.jobs.length, 1_000, JSON.stringify(ok.body.errors));
  });
});
