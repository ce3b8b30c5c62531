/**
 * Job operations the console acts with, over real HTTP against a real Sluice
 * (simulator over HTTP): retryJob (a FAILED or CANCELLED job submitted again,
 * linked through Job.retryOf; the admin may retry any tenant's job), the jobs
 * filter by idempotency key, and the admin's job search and tenant jobs.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const JOB = `query($id: ID!) { job(id: $id) { id api params priority state retryOf idempotencyKey } }`;
const RETRY = `mutation($id: ID!) { retryJob(id: $id) { id api params priority state retryOf idempotencyKey } }`;

describe('retryJob and finding jobs', () => {
  let t: TestApp;
  let a: { id: string; apiKey: string };
  let b: { id: string; apiKey: string };
  let failedId: string;
  let succeededId: string;

  const stateOf = async (id: string, key: string) => (await t.gql(JOB, { id }, key)).body.data.job?.state as string | undefined;
  const settled = (id: string, key: string, state: string) => eventually(async () => (await stateOf(id, key)) === state, 60_000);
  const countJobs = async (key: string) => (await t.gql('{ jobs { totalCount } }', {}, key)).body.data.jobs.totalCount as number;

  before(async () => {
    // exchangerate is down (503, retryable): its jobs wait to be tried again, so one can be cancelled.
    t = await startTestApp({}, { simulator: { conditions: { apis: { exchangerate: { outage: 503 } } } } });
    a = await t.createTenant('retry-a');
    b = await t.createTenant('retry-b');
    // The simulator answers 400 to a malformed domain: not retryable upstream, so the job FAILS.
    const bad = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'not a domain' }, priority: 'INTERACTIVE', idempotencyKey: 'order-17' } }, a.apiKey);
    failedId = bad.body.data.submitJob.job.id;
    const good = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'example.com' } } }, a.apiKey);
    succeededId = good.body.data.submitJob.job.id;
    await settled(failedId, a.apiKey, 'FAILED');
    await settled(succeededId, a.apiKey, 'SUCCEEDED');
  });
  after(() => t?.stop());

  test('a tenant retries its FAILED job: a new job with the same api, params and class, linked through retryOf', async () => {
    const r = await t.gql(RETRY, { id: failedId }, a.apiKey);
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.errors, undefined);
    const job = r.body.data.retryJob;
    assert.notEqual(job.id, failedId);
    assert.equal(job.retryOf, failedId);
    assert.equal(job.api, 'dnslookup');
    assert.deepEqual(job.params, { domain: 'not a domain' });
    assert.equal(job.priority, 'INTERACTIVE');
    // The original keeps its idempotency key; the retry has none (a key names one job).
    assert.equal(job.idempotencyKey, null);
    assert.ok(['QUEUED', 'RUNNING', 'FAILED'].includes(job.state), job.state);
    // It runs like any job (and fails again the same way); the original is untouched.
    await settled(job.id, a.apiKey, 'FAILED');
    const original = (await t.gql(JOB, { id: failedId }, a.apiKey)).body.data.job;
    assert.equal(original.state, 'FAILED');
    assert.equal(original.retryOf, null);
    const listed = await t.gql('{ jobs(first: 5) { edges { node { id retryOf } } } }', {}, a.apiKey);
    assert.equal(listed.body.data.jobs.edges.find((e: { node: { id: string } }) => e.node.id === job.id)?.node.retryOf, failedId);
  });

  test('a job that did not fail or get cancelled is NOT_RETRYABLE; nothing is submitted', async () => {
    const before = await countJobs(a.apiKey);
    const r = await t.gql(RETRY, { id: succeededId }, a.apiKey);
    assert.equal(r.body.errors?.[0]?.extensions?.code, 'NOT_RETRYABLE', JSON.stringify(r.body));
    assert.equal(r.body.errors[0].extensions.state, 'SUCCEEDED');
    assert.equal(await countJobs(a.apiKey), before);
  });

  test("another tenant's job is NOT_FOUND (its existence is not revealed), as is an unknown id; a malformed one is BAD_USER_INPUT", async () => {
    const before = await countJobs(a.apiKey);
    const other = await t.gql(RETRY, { id: failedId }, b.apiKey);
    assert.equal(other.body.errors?.[0]?.extensions?.code, 'NOT_FOUND');
    assert.equal(await countJobs(a.apiKey), before);
    assert.equal(await countJobs(b.apiKey), 0);
    const unknown = await t.gql(RETRY, { id: '00000000-0000-4000-8000-000000000000' }, a.apiKey);
    assert.equal(unknown.body.errors?.[0]?.extensions?.code, 'NOT_FOUND');
    const malformed = await t.gql(RETRY, { id: 'nope' }, a.apiKey);
    assert.equal(malformed.body.errors?.[0]?.extensions?.code, 'BAD_USER_INPUT');
    const anonymous = await t.gql(RETRY, { id: failedId }, null);
    assert.equal(anonymous.status, 401);
  });

  test("the admin retries any tenant's job: the new job is that tenant's", async () => {
    const r = await t.gql(RETRY, { id: failedId });
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body));
    const id = r.body.data.retryJob.id;
    assert.equal(r.body.data.retryJob.retryOf, failedId);
    const seen = (await t.gql(JOB, { id }, a.apiKey)).body.data.job;
    assert.equal(seen.retryOf, failedId);
    assert.equal((await t.gql(JOB, { id }, b.apiKey)).body.data.job, null);
  });

  test('a CANCELLED job is retried too, and the retry passes admission like any submission', async () => {
    const c = await t.createTenant('retry-c');
    const s = await t.gql(SUBMIT, { i: { api: 'exchangerate', params: { currency1: 'USD', currency2: 'EUR' }, priority: 'BULK' } }, c.apiKey);
    const id = s.body.data.submitJob.job.id;
    // Between its failing attempts it is QUEUED again: cancel it then.
    await eventually(async () => (await t.gql('mutation($id: ID!) { cancelJob(id: $id) { state } }', { id }, c.apiKey)).body.data?.cancelJob.state === 'CANCELLED', 60_000);
    const r = await t.gql(RETRY, { id }, c.apiKey);
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body));
    assert.equal(r.body.data.retryJob.retryOf, id);
    assert.equal(r.body.data.retryJob.priority, 'BULK');
    assert.deepEqual(r.body.data.retryJob.params, { currency1: 'USD', currency2: 'EUR' });
    assert.ok(['QUEUED', 'RUNNING'].includes(r.body.data.retryJob.state), r.body.data.retryJob.state);
    // A suspended tenant's retry is refused as its submissions are.
    await t.gql('mutation($id: ID!) { suspendTenant(id: $id) { id } }', { id: c.id });
    const refused = await t.gql(RETRY, { id }, c.apiKey);
    assert.equal(refused.body.errors?.[0]?.extensions?.code, 'TENANT_SUSPENDED');
  });

  test('jobs filter by idempotency key; the admin finds a job by id or key across tenants and lists a tenant\'s jobs', async () => {
    const mine = await t.gql('query($k: String) { jobs(filter: { idempotencyKey: $k }) { totalCount edges { node { id } } } }', { k: 'order-17' }, a.apiKey);
    assert.equal(mine.body.data.jobs.totalCount, 1);
    assert.equal(mine.body.data.jobs.edges[0].node.id, failedId);
    // Another tenant using the same key has its own job under it; each sees only its own.
    const theirs = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'example.net' }, idempotencyKey: 'order-17' } }, b.apiKey);
    const theirId = theirs.body.data.submitJob.job.id;
    const bMine = await t.gql('query($k: String) { jobs(filter: { idempotencyKey: $k }) { edges { node { id } } } }', { k: 'order-17' }, b.apiKey);
    assert.deepEqual(bMine.body.data.jobs.edges.map((e: { node: { id: string } }) => e.node.id), [theirId]);

    const SEARCH = 'query($q: String!) { jobSearch(text: $q) { tenant { id name } job { id state idempotencyKey } } }';
    const byKey = await t.gql(SEARCH, { q: 'order-17' });
    assert.deepEqual(byKey.body.data.jobSearch.map((h: { tenant: { name: string } }) => h.tenant.name).sort(), ['retry-a', 'retry-b']);
    const byId = await t.gql(SEARCH, { q: failedId });
    assert.deepEqual(byId.body.data.jobSearch.map((h: { job: { id: string; state: string } }) => [h.job.id, h.job.state]), [[failedId, 'FAILED']]);
    assert.deepEqual((await t.gql(SEARCH, { q: 'no-such-key' })).body.data.jobSearch, []);
    assert.equal((await t.gql(SEARCH, { q: '  ' })).body.errors?.[0]?.extensions?.code, 'BAD_USER_INPUT');
    assert.equal((await t.gql(SEARCH, { q: 'order-17' }, a.apiKey)).status, 403);

    const failed = await t.gql('query($t: ID!) { tenantJobs(tenantId: $t, filter: { state: FAILED }, first: 2) { totalCount edges { node { id state } } pageInfo { hasNextPage endCursor } } }', { t: a.id });
    assert.equal(failed.body.errors, undefined, JSON.stringify(failed.body));
    assert.ok(failed.body.data.tenantJobs.totalCount >= 2);
    assert.ok(failed.body.data.tenantJobs.edges.every((e: { node: { state: string } }) => e.node.state === 'FAILED'));
    const next = await t.gql('query($t: ID!, $after: String) { tenantJobs(tenantId: $t, filter: { state: FAILED }, first: 2, after: $after) { edges { node { id } } } }', {
      t: a.id,
      after: failed.body.data.tenantJobs.pageInfo.endCursor,
    });
    const firstIds = failed.body.data.tenantJobs.edges.map((e: { node: { id: string } }) => e.node.id);
    for (const e of next.body.data.tenantJobs.edges) assert.ok(!firstIds.includes(e.node.id));
    assert.equal((await t.gql('query($t: ID!) { tenantJobs(tenantId: $t) { totalCount } }', { t: a.id }, a.apiKey)).status, 403);
  });
});
