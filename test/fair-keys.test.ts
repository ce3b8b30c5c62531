/**
 * Fairness keys inside a tenant: the rank rule as a pure model (scheduler/fair-keys.ts), and end
 * to end over real HTTP against real Postgres and the simulator: one tenant's keys are served
 * round robin in the order of dispatch (jobs.started_at, one job per lease: the tenant's cap is
 * 1), jobs without a key share the default key, validation refuses a bad key, Job.fairnessKey
 * reads back, a job put back for another attempt keeps its rank, and retention prunes the keys' state once served.
 *
 * The jobs are in before a worker starts (an API process first, then a worker on the same
 * database), so the order of dispatch is the ranks' order, not the submissions' timing.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { FAIR_RANK_MAX, FairKeyQueue, nextRanks } from '../src/scheduler/fair-keys.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { Retention } from '../src/retention/retention.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

describe('the rank rule (pure)', () => {
  test('a key follows its last waiting rank, never before the head; a new key starts at the head', () => {
    assert.deepEqual(nextRanks(null, null, 3), [0, 1, 2]);
    assert.deepEqual(nextRanks(5, null, 2), [5, 6]);
    assert.deepEqual(nextRanks(5, 9, 2), [10, 11]);
    // A last rank below the head (its jobs were served): level with the head, no credit for idling.
    assert.deepEqual(nextRanks(5, 2, 1), [5]);
    // int4: ranks stop at the cap (first come first served there), never wrap.
    assert.deepEqual(nextRanks(FAIR_RANK_MAX - 1, null, 3), [FAIR_RANK_MAX - 1, FAIR_RANK_MAX, FAIR_RANK_MAX]);
  });

  test('900 of a big key, then 20 of a small key: the small key is served in its first 40 jobs', () => {
    const q = new FairKeyQueue();
    q.insert(Array.from({ length: 900 }, (_, i) => ({ id: `big-${i}`, key: 'big' })));
    q.serve(100);
    q.insert(Array.from({ length: 20 }, (_, i) => ({ id: `small-${i}`, key: 'small' })));
    const next = q.serve(40);
    assert.deepEqual(next.filter((j) => j.key === 'small').length, 20);
    // Alternating, the waiting key first at each rank (it was inserted first).
    assert.deepEqual(next.slice(0, 4).map((j) => j.key), ['big', 'small', 'big', 'small']);
  });

  test('without keys, first in first out exactly', () => {
    const q = new FairKeyQueue();
    q.insert(Array.from({ length: 5 }, (_, i) => ({ id: `a${i}`, key: null })));
    q.serve(2);
    q.insert(Array.from({ length: 3 }, (_, i) => ({ id: `b${i}`, key: null })));
    assert.deepEqual(q.serve(10).map((j) => j.id), ['a2', 'a3', 'a4', 'b0', 'b1', 'b2']);
  });

  test('three keys of different sizes: each round serves every key with jobs waiting once', () => {
    const q = new FairKeyQueue();
    q.insert(Array.from({ length: 6 }, (_, i) => ({ id: `x${i}`, key: 'x' })));
    q.insert(Array.from({ length: 2 }, (_, i) => ({ id: `y${i}`, key: 'y' })));
    q.insert(Array.from({ length: 3 }, (_, i) => ({ id: `z${i}`, key: 'z' })));
    assert.deepEqual(q.serve(11).map((j) => j.id), ['x0', 'y0', 'z0', 'x1', 'y1', 'z1', 'x2', 'z2', 'x3', 'x4', 'x5']);
  });
});

describe('fairness keys end to end', () => {
  let sim: Simulator;
  let api: TestApp;
  let worker: TestApp | undefined;
  let sql: postgres.Sql;
  let tenant: { id: string; apiKey: string };
  const SUBMIT = 'mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }';
  const env = () => ({ APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_RATE_PER_MINUTE: '6000', INITIAL_LATENCY_MS: '5' });
  const submit = async (key: string | null, n: number, tag: string) => {
    const jobs = Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}-${i}.example.org` }, ...(key === null ? {} : { fairnessKey: key }) }));
    const r = await api.gql(SUBMIT, { i: { jobs } }, tenant.apiKey);
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
    return r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id) as string[];
  };

  before(async () => {
    // exchangerate is down (503, retryable): its jobs are put back to wait for another attempt.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 5, latencyP95Ms: 10, seed: 11, conditions: { apis: { exchangerate: { outage: 503 } } } });
    api = await startTestApp({ ...env(), SLUICE_ROLE: 'api' });
    sql = postgres(api.databaseUrl, { max: 2, onnotice: () => {} });
    tenant = await api.createTenant('platform', 'PRO');
    // One job per lease: the order of dispatch is visible in started_at.
    const r = await api.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, concurrencyCap: 1 } });
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
  });
  after(async () => {
    await worker?.stop();
    await sql?.end();
    await api?.stop();
    await sim?.stop();
  });

  test('a bad fairnessKey is BAD_USER_INPUT naming the field; nothing is submitted', async () => {
    for (const bad of ['', 'k'.repeat(65)]) {
      const r = await api.gql(SUBMIT, { i: { jobs: [{ api: 'dnslookup', params: { domain: 'a.example.org' } }, { api: 'dnslookup', params: { domain: 'b.example.org' }, fairnessKey: bad }] } }, tenant.apiKey);
      assert.equal(r.body.errors?.[0]?.extensions?.code, 'BAD_USER_INPUT', JSON.stringify(r.body));
      assert.equal(r.body.errors[0].extensions.field, 'fairnessKey');
      assert.equal(r.body.errors[0].extensions.index, 1);
    }
    const single = await api.gql('mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }', { i: { api: 'dnslookup', params: { domain: 'c.example.org' }, fairnessKey: '' } }, tenant.apiKey);
    assert.equal(single.body.errors?.[0]?.extensions?.code, 'BAD_USER_INPUT');
    assert.equal(single.body.errors[0].extensions.field, 'fairnessKey');
    const [n] = await sql`select count(*)::int as n from jobs`;
    assert.equal(n!.n, 0);
  });

  test('keys are served round robin in the order of dispatch; the default key is one key; fairnessKey reads back', async () => {
    // A big key's backlog first, then a small key, then jobs without a key, then a 64-character key.
    const big = await submit('customer-big', 8, 'big');
    const small = await submit('customer-small', 3, 'small');
    const plain = await submit(null, 2, 'plain');
    const longKey = 'k'.repeat(64);
    const long = await submit(longKey, 1, 'long');
    const read = await api.gql('query($id: ID!) { job(id: $id) { fairnessKey } }', { id: small[0] }, tenant.apiKey);
    assert.equal(read.body.data.job.fairnessKey, 'customer-small');
    const readPlain = await api.gql('query($id: ID!) { job(id: $id) { fairnessKey } }', { id: plain[0] }, tenant.apiKey);
    assert.equal(readPlain.body.data.job.fairnessKey, null);
    const list = await api.gql('{ jobs(first: 50) { edges { node { id fairnessKey } } } }', {}, tenant.apiKey);
    assert.equal(list.body.data.jobs.edges.find((e: { node: { id: string } }) => e.node.id === long[0]).node.fairnessKey, longKey);
    // The ranks the submissions were given (the pg-boss priority, negated).
    const ranks = await sql`select j.id, -p.priority as rank from jobs j join pgboss.job p on p.id = j.id`;
    const rank = new Map(ranks.map((r) => [r.id as string, Number(r.rank)]));
    assert.deepEqual(big.map((id) => rank.get(id)), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual(small.map((id) => rank.get(id)), [0, 1, 2]);
    assert.deepEqual(plain.map((id) => rank.get(id)), [0, 1]);
    assert.deepEqual(long.map((id) => rank.get(id)), [0]);

    worker = await startTestApp({ ...env(), SLUICE_ROLE: 'worker', DATABASE_URL: api.databaseUrl });
    await eventually(async () => {
      const [r] = await sql`select count(*) filter (where state = 'SUCCEEDED')::int as done, count(*)::int as n from jobs`;
      return r!.done === r!.n;
    }, 60_000);
    const order = await sql`select id, coalesce(fairness_key, '-') as k from jobs order by started_at, id`;
    const name = (k: string) => (k === longKey ? 'long' : k === '-' ? 'default' : k.replace('customer-', ''));
    assert.deepEqual(
      order.map((r) => name(r.k as string)),
      ['big', 'small', 'default', 'long', 'big', 'small', 'default', 'big', 'small', 'big', 'big', 'big', 'big', 'big'],
    );
    // Within a key, first in first out.
    assert.deepEqual(order.filter((r) => r.k === 'customer-big').map((r) => r.id), big);
    // The event a subscriber or webhook gets carries the key too (the same JSON as a read).
    const [ev] = await sql`select sluice_job_json(${small[0]!}::uuid) as j`;
    assert.equal((ev!.j as { fairnessKey: string }).fairnessKey, 'customer-small');
  });

  test('a key whose jobs were all served starts level with the head again (no credit, no debt)', async () => {
    // The big key was served last; a new backlog of it and a new key both start at the empty queue's head.
    const again = await submit('customer-big', 2, 'again');
    const fresh = await submit('customer-new', 2, 'fresh');
    const ranks = await sql`select j.id, -p.priority as rank from jobs j join pgboss.job p on p.id = j.id where j.id = any(${[...again, ...fresh]}::uuid[])`;
    const rank = new Map(ranks.map((r) => [r.id as string, Number(r.rank)]));
    // The queue was empty: the returning key starts at 0 (its old ranks are gone); the new key
    // starts at the head then (the worker is leasing meanwhile), not behind the returning key.
    assert.equal(rank.get(again[0]!), 0);
    assert.ok(rank.get(fresh[0]!)! <= rank.get(again[1]!)!, `new key at ${rank.get(fresh[0]!)}, returning key's second job at ${rank.get(again[1]!)}`);
    await eventually(async () => {
      const [r] = await sql`select count(*) filter (where state = 'SUCCEEDED')::int as done, count(*)::int as n from jobs`;
      return r!.done === r!.n;
    }, 60_000);
  });

  test('the pg-boss fetch index serves the head read and the lease order', async () => {
    const queue = `t.${tenant.id}.standard`;
    const plan = await sql.unsafe(
      `explain select p.priority from pgboss.job p where p.name = $1 and p.state < 'active' and not p.blocked and p.start_after <= now() order by p.priority desc, p.created_on limit 1`,
      [queue],
    );
    const text = plan.map((r) => r['QUERY PLAN']).join('\n');
    assert.match(text, /job(_common)?_i11/, text);
    assert.doesNotMatch(text, /Sort/, text);
  });

  test('a job put back after a failed attempt keeps its rank (its pg-boss priority)', async () => {
    const jobs = Array.from({ length: 3 }, (_, i) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: i % 2 ? 'EUR' : 'GBP' }, fairnessKey: 'customer-flaky' }));
    const r = await api.gql(SUBMIT, { i: { jobs } }, tenant.apiKey);
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
    const ids = r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id) as string[];
    const before = new Map((await sql`select id, priority from pgboss.job where id = any(${ids}::uuid[])`).map((x) => [x.id as string, x.priority as number]));
    assert.equal(before.size, 3);
    assert.ok([...before.values()].some((p) => p !== 0), 'a rank other than 0 to keep');
    // Every job tried at least once and put back (delete and insert under the same id).
    await eventually(async () => {
      const rows = await sql`select attempts from jobs where id = any(${ids}::uuid[])`;
      return rows.every((x) => (x.attempts as number) >= 1);
    }, 60_000);
    await eventually(async () => {
      const rows = await sql`select id, priority, retry_count, created_on > (select min(created_at) from jobs where id = any(${ids}::uuid[])) + interval '1 millisecond' as reinserted from pgboss.job where id = any(${ids}::uuid[])`;
      if (!rows.every((x) => x.reinserted)) return false;
      for (const x of rows) assert.equal(x.priority, before.get(x.id as string), 'the same priority after the put-back');
      return true;
    }, 60_000);
  });

  test("retention prunes a key's last rank once its newest job has started; a key with a job waiting keeps it", async () => {
    await worker?.stop();
    worker = undefined;
    const waiting = await submit('customer-waiting', 1, 'waiting');
    const retention = new Retention({ sql, retentionSeconds: 3600, batchSize: 100, maxBatches: 10, intervalSeconds: 0 });
    const pass = await retention.runOnce();
    assert.ok(pass, 'the pass ran');
    const left = await sql`select fairness_key, last_job from sched_fair_keys`;
    assert.deepEqual(left.map((r) => [r.fairness_key, r.last_job]), [['customer-waiting', waiting[0]]]);
  });
});
