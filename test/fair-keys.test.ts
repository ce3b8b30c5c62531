/**
 * Fairness keys inside a tenant: the rank rule as a pure model (scheduler/fair-keys.ts), with its
 * bound as a property, and end to end over real HTTP against real Postgres and the simulator: one
 * tenant's keys are served round robin in the order of dispatch (jobs.started_at, one job per
 * lease: the tenant's cap is 1), jobs without a key share the default key, validation refuses a
 * bad key, Job.fairnessKey reads back, a job put back for another attempt keeps its rank, and
 * retention prunes the keys' state once served. In those, the jobs are in before a worker starts
 * (an API process first, then a worker on the same database), so the order of dispatch is the
 * ranks' order, not the submissions' timing.
 *
 * Then live, on a paced window: a backlog of the default key beside a new key arriving per
 * dispatch, every job judged against the bound (keyWaits) by the order of dispatch.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import fc from 'fast-check';
import { FAIR_RANK_MAX, FairKeyQueue, keyWaits, nextRanks, type Dispatched } from '../src/scheduler/fair-keys.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { Retention } from '../src/retention/retention.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

describe('the rank rule (pure)', () => {
  test('a key follows its last waiting rank; a new key starts the round after the head, never in it', () => {
    assert.deepEqual(nextRanks(null, null, 3), [0, 1, 2]);
    assert.deepEqual(nextRanks(5, null, 2), [6, 7]);
    assert.deepEqual(nextRanks(5, 9, 2), [10, 11]);
    // The key being served at the head carries on from its own last rank.
    assert.deepEqual(nextRanks(5, 5, 1), [6]);
    // A last rank below the head (its jobs were served): after the head, no credit for idling.
    assert.deepEqual(nextRanks(5, 2, 1), [6]);
    // int4: ranks stop at the cap (first come first served there), never wrap.
    assert.deepEqual(nextRanks(FAIR_RANK_MAX - 2, null, 3), [FAIR_RANK_MAX - 1, FAIR_RANK_MAX, FAIR_RANK_MAX]);
    assert.deepEqual(nextRanks(FAIR_RANK_MAX, null, 1), [FAIR_RANK_MAX]);
  });

  test('900 of a big key, then 20 of a small key: the small key is served in its first 41 jobs', () => {
    const q = new FairKeyQueue();
    q.insert(Array.from({ length: 900 }, (_, i) => ({ id: `big-${i}`, key: 'big' })));
    q.serve(100);
    q.insert(Array.from({ length: 20 }, (_, i) => ({ id: `small-${i}`, key: 'small' })));
    const next = q.serve(41);
    assert.deepEqual(next.filter((j) => j.key === 'small').length, 20);
    // The head's round first, then alternating, the waiting key first at each rank (it was inserted first).
    assert.deepEqual(next.slice(0, 5).map((j) => j.key), ['big', 'big', 'small', 'big', 'small']);
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
    // y and z join after x0's round (the head's), then one job of each key per round.
    assert.deepEqual(q.serve(11).map((j) => j.id), ['x0', 'x1', 'y0', 'z0', 'x2', 'y1', 'z1', 'x3', 'z2', 'x4', 'x5']);
  });

  test('a new key before every dispatch: the default key\'s backlog is still served, within the bound', () => {
    // New users arriving as fast as the queue is served, one job each, beside a backlog of the
    // default key. Joining the head's round (the rule before), every new key went ahead of the
    // backlog's next job and the head never moved: the backlog got its first job and no other.
    const stream = (q: FairKeyQueue) => {
      const log: Array<Dispatched & { id: string }> = [];
      const arrived = new Map<string, number>();
      let tick = 0;
      const insert = (jobs: Array<{ id: string; key: string | null }>) => {
        tick++;
        for (const j of jobs) arrived.set(j.id, tick);
        q.insert(jobs);
      };
      const serve = (n: number) => {
        for (const j of q.serve(n)) log.push({ id: j.id, key: j.key, arrivedAt: arrived.get(j.id)!, startedAt: ++tick });
      };
      insert(Array.from({ length: 20 }, (_, i) => ({ id: `backlog-${i}`, key: null })));
      for (let i = 0; i < 60; i++) {
        insert([{ id: `new-${i}`, key: `user-${i}` }]);
        serve(1);
      }
      serve(Number.MAX_SAFE_INTEGER);
      return log;
    };
    const joiningTheHead = (head: number | null, last: number | null, count: number) =>
      Array.from({ length: count }, (_, i) => Math.max(head ?? 0, last === null ? 0 : last + 1) + i);
    const before = stream(new FairKeyQueue(joiningTheHead));
    assert.equal(before.slice(0, 60).filter((j) => j.key === '').length, 1, 'the rule before: starved');

    const log = stream(new FairKeyQueue());
    const waits = keyWaits(log);
    for (const w of waits) assert.ok(w.servedAhead <= w.bound, `${w.job.id}: ${w.servedAhead} jobs of other keys ahead, bound ${w.bound} for ${w.keysWaiting} keys waiting`);
    const backlog = waits.filter((w) => w.job.key === '');
    // One job per round: the rounds grow by the keys that arrived during the last one.
    assert.ok(log.slice(0, 60).filter((j) => j.key === '').length >= 8, JSON.stringify(backlog.map((w) => w.servedAhead)));
    assert.ok(backlog.some((w) => w.keysWaiting >= 8), 'new keys were waiting beside the backlog');
    // Before the rule, the bound was not met: the witness that the judge sees the difference.
    assert.ok(keyWaits(before).some((w) => w.servedAhead > w.bound));
  });

  test('property: every job is served within the bound once at the front of its key, FIFO per key', () => {
    // Keys old and new, the default key among them; inserts of several keys at once; dispatches
    // of several jobs at once; everything left served at the end.
    const keyArb = fc.oneof(fc.constant(null), fc.integer({ min: 0, max: 4 }).map((k) => `k${k}`), fc.constant('new'));
    const opArb = fc.oneof(
      fc.record({ insert: fc.array(fc.record({ key: keyArb, n: fc.integer({ min: 1, max: 4 }) }), { minLength: 1, maxLength: 3 }) }),
      fc.record({ serve: fc.integer({ min: 1, max: 5 }) }),
    );
    fc.assert(
      fc.property(fc.array(opArb, { maxLength: 60 }), (ops) => {
        const q = new FairKeyQueue();
        const log: Array<Dispatched & { id: string; n: number }> = [];
        const arrived = new Map<string, { at: number; n: number }>();
        let tick = 0;
        let fresh = 0;
        let n = 0;
        const serve = (count: number) => {
          for (const j of q.serve(count)) log.push({ id: j.id, key: j.key, arrivedAt: arrived.get(j.id)!.at, startedAt: ++tick, n: arrived.get(j.id)!.n });
        };
        for (const op of ops) {
          if ('serve' in op) {
            serve(op.serve);
            continue;
          }
          tick++;
          const jobs = op.insert.flatMap(({ key, n: count }) => {
            const k = key === 'new' ? `new-${fresh++}` : key;
            return Array.from({ length: count }, () => ({ id: `j${n}`, key: k, n: n++ }));
          });
          for (const j of jobs) arrived.set(j.id, { at: tick, n: j.n });
          q.insert(jobs);
        }
        serve(Number.MAX_SAFE_INTEGER);
        for (const w of keyWaits(log)) {
          if (w.servedAhead > w.bound) return false;
        }
        const byKey = new Map<string, number[]>();
        for (const j of log) byKey.set(j.key, [...(byKey.get(j.key) ?? []), j.n]);
        return [...byKey.values()].every((ns) => ns.every((x, i) => i === 0 || ns[i - 1]! < x));
      }),
      { seed: 20_261_204, numRuns: 500 },
    );
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
    // Two submissions without a key: the second follows the first's rank, which the default key
    // keeps on its queue's row (not in sched_fair_keys).
    const plain = [...(await submit(null, 1, 'plain')), ...(await submit(null, 1, 'plain-2'))];
    const [queueRow] = await sql`select fair_last_rank, fair_last_job from sched_queues where tenant_id = ${tenant.id} and class = 'STANDARD'`;
    assert.deepEqual([queueRow!.fair_last_rank, queueRow!.fair_last_job], [2, plain[1]]);
    const [defaultRows] = await sql`select count(*)::int as n from sched_fair_keys where fairness_key = ''`;
    assert.equal(defaultRows!.n, 0);
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
    // The first key starts the empty queue at 0; the others the round after its head's.
    assert.deepEqual(big.map((id) => rank.get(id)), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert.deepEqual(small.map((id) => rank.get(id)), [1, 2, 3]);
    assert.deepEqual(plain.map((id) => rank.get(id)), [1, 2]);
    assert.deepEqual(long.map((id) => rank.get(id)), [1]);

    worker = await startTestApp({ ...env(), SLUICE_ROLE: 'worker', DATABASE_URL: api.databaseUrl });
    await eventually(async () => {
      const [r] = await sql`select count(*) filter (where state = 'SUCCEEDED')::int as done, count(*)::int as n from jobs`;
      return r!.done === r!.n;
    }, 60_000);
    const order = await sql`select id, coalesce(fairness_key, '-') as k from jobs order by started_at, id`;
    const name = (k: string) => (k === longKey ? 'long' : k === '-' ? 'default' : k.replace('customer-', ''));
    assert.deepEqual(
      order.map((r) => name(r.k as string)),
      ['big', 'big', 'small', 'default', 'long', 'big', 'small', 'default', 'big', 'small', 'big', 'big', 'big', 'big'],
    );
    // Within a key, first in first out.
    assert.deepEqual(order.filter((r) => r.k === 'customer-big').map((r) => r.id), big);
    // The event a subscriber or webhook gets carries the key too (the same JSON as a read).
    const [ev] = await sql`select sluice_job_json(${small[0]!}::uuid) as j`;
    assert.equal((ev!.j as { fairnessKey: string }).fairnessKey, 'customer-small');
  });

  test('a key whose jobs were all served starts at the head again (no credit, no debt)', async () => {
    // The big key was served last; a new backlog of it starts the empty queue again, and a new key
    // starts the round after the head's.
    const again = await submit('customer-big', 10, 'again');
    const fresh = await submit('customer-new', 2, 'fresh');
    const ranks = await sql`select j.id, -p.priority as rank from jobs j join pgboss.job p on p.id = j.id where j.id = any(${[...again, ...fresh]}::uuid[])`;
    const rank = new Map(ranks.map((r) => [r.id as string, Number(r.rank)]));
    // The queue was empty: the returning key starts at 0 (its old ranks are gone). The new key
    // starts after the head's round, wherever the worker (leasing meanwhile) has taken it: never
    // in it, and not behind the returning key's backlog.
    assert.equal(rank.get(again[0]!), 0);
    assert.ok(rank.get(fresh[0]!)! >= 1, `new key at ${rank.get(fresh[0]!)}: after the head's round`);
    assert.ok(rank.get(fresh[0]!)! < rank.get(again[9]!)!, `new key at ${rank.get(fresh[0]!)}, returning key's last job at ${rank.get(again[9]!)}`);
    await eventually(async () => {
      const [r] = await sql`select count(*) filter (where state = 'SUCCEEDED')::int as done, count(*)::int as n from jobs`;
      return r!.done === r!.n;
    }, 60_000);
  });

  test('the pg-boss fetch index serves the head read and the lease order', async () => {
    const queue = `t.${tenant.id}.standard`;
    // Whether the index can serve the read in that order, not what the planner picks for the few rows
    // this test leaves (once autovacuum has analyzed them, a scan of the table and a sort of four rows
    // is cheaper): scans of the whole table and sorts are priced out, so a Sort still shows when no
    // index gives that order.
    const plan = await sql.begin(async (tx) => {
      await tx`set local enable_seqscan = off`;
      await tx`set local enable_sort = off`;
      return tx.unsafe(
        `explain select p.priority from pgboss.job p where p.name = $1 and p.state < 'active' and not p.blocked and p.start_after <= now() order by p.priority desc, p.created_on limit 1`,
        [queue],
      );
    });
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

  test('a head at the cap: a new key is ranked at the cap too, not past int4', async () => {
    // No worker: the waiting job of the test before is the head; put it at the cap.
    await sql`update pgboss.job set priority = ${-FAIR_RANK_MAX} where name = ${`t.${tenant.id}.standard`} and state < 'active'`;
    const late = await submit('customer-late', 2, 'late');
    const ranks = await sql`select -priority::bigint as rank from pgboss.job where id = any(${late}::uuid[])`;
    assert.deepEqual(ranks.map((r) => Number(r.rank)), [FAIR_RANK_MAX, FAIR_RANK_MAX]);
  });
});

describe('a backlogged key beside a stream of new keys, live', () => {
  // Time compressed: the window is paced at 4 jobs a second (burst 1, the tenant's cap 1, so one
  // job per dispatch and the order of dispatch is started_at's), and a new key with one job
  // arrives every quarter second: one new key per dispatch, as one new key a second is beside a
  // share of one job a second. Joining the head's round, those keys held the backlog back for good.
  const PACE_PER_S = 4;
  const BACKLOG = 12;
  const NEW_KEYS = 24;
  let sim: Simulator;
  let app: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 5, latencyP95Ms: 10, seed: 5 });
    app = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: String(PACE_PER_S * 60),
      PACE_FRACTION: '1',
      PACER_BURST: '1',
      PACE_LEARN: 'false',
      INITIAL_LATENCY_MS: '5',
    });
    sql = postgres(app.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql?.end();
    await app?.stop();
    await sim?.stop();
  });

  test("the default key's backlog is served within the bound while a new key arrives per dispatch", async () => {
    const tenant = await app.createTenant('platform-stream', 'PRO');
    const cap = await app.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, concurrencyCap: 1 } });
    assert.equal(cap.body.errors, undefined, JSON.stringify(cap.body.errors));
    // When each submission's answer came back (its jobs had arrived by then; test clock = the database's, one machine).
    const answeredAt = new Map<string, number>();
    const submit = async (key: string | null, n: number, tag: string) => {
      const jobs = Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}-${i}.example.org` }, ...(key === null ? {} : { fairnessKey: key }) }));
      const r = await app.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, tenant.apiKey);
      assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
      const at = Date.now();
      for (const j of r.body.data.submitJobs.jobs as Array<{ id: string }>) answeredAt.set(j.id, at);
    };

    await submit(null, BACKLOG, 'backlog');
    const start = Date.now();
    for (let i = 0; i < NEW_KEYS; i++) {
      const due = start + (i * 1000) / PACE_PER_S;
      if (due > Date.now()) await new Promise((r) => setTimeout(r, due - Date.now()));
      await submit(`user-${i}`, 1, `user-${i}`);
    }
    const streamEnd = Date.now();
    await eventually(async () => {
      const [r] = await sql`select count(*) filter (where started_at is not null)::int as started, count(*)::int as n from jobs where tenant_id = ${tenant.id}`;
      return r!.n === BACKLOG + NEW_KEYS && r!.started === r!.n;
    }, 60_000);

    const rows = await sql`
      select id, coalesce(fairness_key, '') as key, extract(epoch from created_at)::float8 * 1000 as created, extract(epoch from started_at)::float8 * 1000 as started
      from jobs where tenant_id = ${tenant.id}`;
    // A job arrived after its transaction began (created_at) and before its answer came back.
    const log = rows.map((r) => ({
      id: r.id as string,
      key: r.key as string,
      arrivedAt: Number(r.created),
      arrivedBy: Math.max(Number(r.created), answeredAt.get(r.id as string)!),
      startedAt: Number(r.started),
    }));
    const waits = keyWaits(log);
    const show = (w: (typeof waits)[number]) => `${w.job.key || 'default'}: ${w.servedAhead} ahead with ${w.keysWaiting} keys waiting`;
    for (const w of waits) assert.ok(w.servedAhead <= w.bound, `over the bound: ${show(w)}\n${waits.map(show).join('\n')}`);
    const backlog = waits.filter((w) => w.job.key === '');
    // The stream did compete (several keys waiting beside the backlog), and the backlog was served
    // while it ran, not only after it.
    assert.ok(backlog.some((w) => w.keysWaiting >= 3), backlog.map(show).join('\n'));
    const duringStream = backlog.filter((w) => w.job.startedAt < streamEnd).length;
    assert.ok(duringStream >= 4, `${duringStream} of the backlog's jobs dispatched while the stream ran\n${waits.map(show).join('\n')}`);
  });
});
