/**
 * Job operations over real HTTP against a running Sluice (dispatcher and the
 * simulator): JobInput.runAt (not before then, counted in the queue bound, wait
 * reason SCHEDULED, out-of-range refused with BAD_RUN_AT), JobFilter.idempotencyKey,
 * and cancelJobs (bounded, coded refusals, pg-boss's rows cancelled too).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const JOB = `query($id: ID!) { job(id: $id) { id state waitReason estimatedStartAt startedAt } }`;
const inAnHour = () => new Date(Date.now() + 3_600_000).toISOString();

describe('job operations: runAt, idempotencyKey filter, cancelJobs', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  let acme: { id: string; apiKey: string };
  let other: { id: string; apiKey: string };

  before(async () => {
    t = await startTestApp();
    sql = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
    acme = await t.createTenant('scheduler', 'PRO');
    other = await t.createTenant('neighbour', 'PRO');
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  test('runAt: the job waits with SCHEDULED (job and queue), then runs, not before', async () => {
    const runAt = new Date(Date.now() + 3_000);
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'later.example' }, priority: 'INTERACTIVE', runAt: runAt.toISOString() } }, acme.apiKey);
    const { id, state } = r.body.data.submitJob.job;
    assert.equal(state, 'QUEUED');
    const early = await t.gql(JOB, { id }, acme.apiKey);
    const queues = await t.gql(`{ me { queues { priority depth waitReason } } }`, {}, acme.apiKey);
    // On a loaded machine the 3 s may already have passed: then it is running or done, never before runAt.
    if (early.body.data.job.state === 'QUEUED' && Date.now() < runAt.getTime() - 500) {
      assert.equal(early.body.data.job.waitReason, 'SCHEDULED');
      assert.ok(Date.parse(early.body.data.job.estimatedStartAt) >= runAt.getTime(), 'it starts at runAt at the earliest');
      const interactive = queues.body.data.me.queues.find((q: { priority: string }) => q.priority === 'INTERACTIVE');
      assert.equal(interactive.waitReason, 'SCHEDULED');
    }
    const done = await eventually(async () => {
      const j = (await t.gql(JOB, { id }, acme.apiKey)).body.data.job;
      return j.state === 'SUCCEEDED' || j.state === 'FAILED' ? j : null;
    }, 60_000, 200);
    assert.ok(Date.parse(done.startedAt) >= runAt.getTime(), `started ${done.startedAt}, not before runAt ${runAt.toISOString()}`);
    const [boss] = await sql`select start_after from pgboss.job where id = ${id}`;
    assert.equal((boss!.start_after as Date).toISOString(), runAt.toISOString(), "pg-boss's startAfter is runAt");
  });

  test('a scheduled job far ahead stays SCHEDULED and counts in the queue bound', async () => {
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: other.id, queueBound: 3 } });
    // INTERACTIVE may fill the whole bound (CLASS_SHARES); the update reaches admission through the cache's notice.
    const jobs = Array.from({ length: 3 }, (_, k) => ({ api: 'dnslookup', params: { domain: `bound${k}.example` }, priority: 'INTERACTIVE', runAt: inAnHour() }));
    const ok = await t.gql(SUBMIT_MANY, { i: { jobs } }, other.apiKey);
    assert.ok(ok.body.data, JSON.stringify(ok.body));
    const id = ok.body.data.submitJobs.jobs[0].id;
    assert.equal((await t.gql(JOB, { id }, other.apiKey)).body.data.job.waitReason, 'SCHEDULED');
    const full = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'one-more.example' }, priority: 'INTERACTIVE' } }, other.apiKey);
    assert.equal(full.body.errors?.[0]?.extensions?.code, 'QUEUE_FULL', JSON.stringify(full.body));
    const queues = await t.gql(`{ me { queues { priority depth waitReason } } }`, {}, other.apiKey);
    const interactive = queues.body.data.me.queues.find((q: { priority: string }) => q.priority === 'INTERACTIVE');
    assert.deepEqual({ depth: interactive.depth, waitReason: interactive.waitReason }, { depth: 3, waitReason: 'SCHEDULED' });
    const cancelled = await t.gql(`mutation { cancelJobs(filter: {}) { cancelled more } }`, {}, other.apiKey);
    assert.deepEqual(cancelled.body.data.cancelJobs, { cancelled: 3, more: false });
  });

  test('runAt too far past or ahead is refused with BAD_RUN_AT, naming the field (and the index in a bulk)', async () => {
    const past = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'p.example' }, runAt: new Date(Date.now() - 3_600_000).toISOString() } }, acme.apiKey);
    assert.equal(past.body.errors[0].extensions.code, 'BAD_RUN_AT');
    assert.equal(past.body.errors[0].extensions.field, 'runAt');
    const far = await t.gql(SUBMIT_MANY, { i: { jobs: [{ api: 'dnslookup', params: { domain: 'a.example' } }, { api: 'dnslookup', params: { domain: 'f.example' }, runAt: new Date(Date.now() + 31 * 86_400_000).toISOString() }] } }, acme.apiKey);
    assert.equal(far.body.errors[0].extensions.code, 'BAD_RUN_AT');
    assert.equal(far.body.errors[0].extensions.index, 1);
    assert.ok(far.body.errors[0].extensions.latest, 'says the latest runAt accepted');
    const notADate = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'x.example' }, runAt: 'tomorrow' } }, acme.apiKey);
    assert.ok(notADate.body.errors?.[0]?.extensions?.code, 'a runAt that is not a timestamp is refused with a code');
  });

  test('JobFilter.idempotencyKey finds the job submitted with that key', async () => {
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'k.example' }, idempotencyKey: 'order-42', runAt: inAnHour() } }, acme.apiKey);
    const id = r.body.data.submitJob.job.id;
    const found = await t.gql(`query($k: String!) { jobs(filter: { idempotencyKey: $k }) { totalCount edges { node { id idempotencyKey } } } }`, { k: 'order-42' }, acme.apiKey);
    assert.deepEqual(found.body.data.jobs, { totalCount: 1, edges: [{ node: { id, idempotencyKey: 'order-42' } }] });
    const none = await t.gql(`{ jobs(filter: { idempotencyKey: "order-43" }) { totalCount edges { node { id } } } }`, {}, acme.apiKey);
    assert.deepEqual(none.body.data.jobs, { totalCount: 0, edges: [] });
    const theirs = await t.gql(`{ jobs(filter: { idempotencyKey: "order-42" }) { totalCount } }`, {}, other.apiKey);
    assert.equal(theirs.body.data.jobs.totalCount, 0, "another tenant's key space");
  });

  test('cancelJobs: the matching waiting jobs, at most `limit` per call, pg-boss rows too; others untouched; refusals coded', async () => {
    const dns = Array.from({ length: 5 }, (_, k) => ({ api: 'dnslookup', params: { domain: `c${k}.example` }, priority: 'BULK', runAt: inAnHour() }));
    const mail = Array.from({ length: 2 }, (_, k) => ({ api: 'emailvalidator', params: { email: `c${k}@example.com` }, priority: 'BULK', runAt: inAnHour() }));
    const submitted = await t.gql(SUBMIT_MANY, { i: { jobs: [...dns, ...mail] } }, acme.apiKey);
    const ids = submitted.body.data.submitJobs.jobs.map((j: { id: string }) => j.id) as string[];
    const theirs = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'theirs.example' }, runAt: inAnHour() } }, other.apiKey);

    const CANCEL = `mutation($f: JobFilter!, $n: Int) { cancelJobs(filter: $f, limit: $n) { cancelled more } }`;
    const first = await t.gql(CANCEL, { f: { api: 'dnslookup', priority: 'BULK' }, n: 3 }, acme.apiKey);
    assert.deepEqual(first.body.data.cancelJobs, { cancelled: 3, more: true });
    const second = await t.gql(CANCEL, { f: { api: 'dnslookup', priority: 'BULK' }, n: 3 }, acme.apiKey);
    assert.deepEqual(second.body.data.cancelJobs, { cancelled: 2, more: false });
    const states = await sql`select j.id, j.state, b.state as boss from jobs j join pgboss.job b on b.id = j.id where j.id = any(${ids}::uuid[]) order by j.created_at`;
    const byId = new Map(states.map((s) => [s.id as string, s]));
    for (const id of ids.slice(0, 5)) assert.deepEqual([byId.get(id)!.state, byId.get(id)!.boss], ['CANCELLED', 'cancelled']);
    for (const id of ids.slice(5)) assert.equal(byId.get(id)!.state, 'QUEUED', 'another api is untouched');
    const theirJob = await t.gql(JOB, { id: theirs.body.data.submitJob.job.id }, other.apiKey);
    assert.equal(theirJob.body.data.job.state, 'QUEUED', "another tenant's job is untouched");

    const finished = await t.gql(CANCEL, { f: { state: 'SUCCEEDED' } }, acme.apiKey);
    assert.equal(finished.body.errors[0].extensions.code, 'NOT_CANCELLABLE');
    const zero = await t.gql(CANCEL, { f: {}, n: 0 }, acme.apiKey);
    assert.equal(zero.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    assert.equal(zero.body.errors[0].extensions.field, 'limit');
    const tooMany = await t.gql(CANCEL, { f: {}, n: 1001 }, acme.apiKey);
    assert.equal(tooMany.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    const readOnly = (await t.gql(`mutation { createApiKey(input: { name: "ro", scopes: [READ] }) { secret } }`, {}, acme.apiKey)).body.data.createApiKey.secret;
    const forbidden = await t.gql(CANCEL, { f: {} }, readOnly);
    assert.equal(forbidden.body.errors[0].extensions.code, 'FORBIDDEN');
    const rest = await t.gql(CANCEL, { f: { state: 'QUEUED' } }, acme.apiKey);
    assert.ok(rest.body.data.cancelJobs.cancelled >= 2, 'the rest of the waiting jobs');
    assert.equal(rest.body.data.cancelJobs.more, false);
  });
});
