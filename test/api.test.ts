/**
 * The whole path of a job through a real Sluice: HTTP, graphql-ws, Postgres,
 * pg-boss and the provider simulator over real HTTP.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { collect, eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const JOB = `query($id: ID!) { job(id: $id) { id api params priority state result error { code message } httpStatus creditsBilled attempts createdAt startedAt finishedAt } }`;

describe('a running Sluice', () => {
  let t: TestApp;
  let a: { id: string; apiKey: string };
  let b: { id: string; apiKey: string };

  before(async () => {
    t = await startTestApp();
    a = await t.createTenant('acme', 'PRO');
    b = await t.createTenant('globex', 'FREE');
  });
  after(() => t.stop());

  test('createTenant to a subscription receiving the finished job', async () => {
    const ws = t.ws(a.apiKey);
    const submitted = await t.gql(SUBMIT, { i: { api: 'emailvalidator', params: { email: 'jane@mailinator.com' }, priority: 'INTERACTIVE' } }, a.apiKey);
    assert.equal(submitted.status, 200);
    const { id, state } = submitted.body.data.submitJob.job;
    assert.equal(state, 'QUEUED');

    const events = await collect<{ jobUpdated: { id: string; state: string; result: any } }>(
      ws,
      `subscription($id: ID!) { jobUpdated(id: $id) { id state result } }`,
      { id },
      (ev) => ['SUCCEEDED', 'FAILED'].includes(ev.at(-1)!.jobUpdated.state),
    );
    const states = events.map((e) => e.jobUpdated.state);
    assert.equal(states.at(-1), 'SUCCEEDED');
    // Each state reached is reported once and in order (the first event is the state at subscribe time).
    assert.deepEqual(states, [...new Set(states)]);
    assert.deepEqual(states, ['QUEUED', 'RUNNING', 'SUCCEEDED'].slice(3 - states.length));
    assert.equal(events.at(-1)!.jobUpdated.result.email, 'jane@mailinator.com');
    assert.equal(events.at(-1)!.jobUpdated.result.isDisposable, true);

    const read = await t.gql(JOB, { id }, a.apiKey);
    const job = read.body.data.job;
    assert.equal(job.state, 'SUCCEEDED');
    assert.equal(job.api, 'emailvalidator');
    assert.deepEqual(job.params, { email: 'jane@mailinator.com' });
    assert.equal(job.priority, 'INTERACTIVE');
    assert.equal(job.httpStatus, 200);
    assert.equal(job.creditsBilled, 5);
    assert.equal(job.attempts, 1);
    assert.equal(job.error, null);
    assert.ok(Date.parse(job.createdAt) <= Date.parse(job.startedAt) && Date.parse(job.startedAt) <= Date.parse(job.finishedAt));
  });

  test('jobsCompleted delivers every finished job of the tenant, and only of that tenant', async () => {
    const ws = t.ws(a.apiKey);
    const wsB = t.ws(b.apiKey);
    const seenByB: string[] = [];
    const disposeB = wsB.subscribe<{ jobsCompleted: { id: string } }>(
      { query: `subscription { jobsCompleted { id } }` },
      { next: (v) => seenByB.push(v.data!.jobsCompleted.id), error: () => {}, complete: () => {} },
    );
    const pending = collect<{ jobsCompleted: { id: string; state: string; result: any } }>(
      ws,
      `subscription { jobsCompleted { id state result } }`,
      {},
      (ev) => ev.length >= 3,
    );
    await new Promise((r) => setTimeout(r, 300)); // let the subscription reach the server
    const r = await t.gql(SUBMIT_MANY, {
      i: {
        jobs: [
          { api: 'exchangerate', params: { currency1: 'USD', currency2: 'EUR' } },
          { api: 'dnslookup', params: { domain: 'example.com' } },
          { api: 'exchangerate', params: { currency1: 'GBP', currency2: 'JPY' }, priority: 'BULK' },
        ],
      },
    }, a.apiKey);
    const ids = r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id);
    assert.equal(ids.length, 3);
    const events = await pending;
    assert.deepEqual(new Set(events.map((e) => e.jobsCompleted.id)), new Set(ids));
    assert.ok(events.every((e) => e.jobsCompleted.state === 'SUCCEEDED'));
    const dns = events.find((e) => e.jobsCompleted.result?.domain === 'example.com');
    assert.ok(dns, 'the dnslookup result carries its domain');
    disposeB();
    assert.deepEqual(seenByB.filter((id) => ids.includes(id)), []);
  });

  test('jobs is a Relay connection with totalCount, filters and forward pagination', async () => {
    const many = Array.from({ length: 7 }, (_, i) => ({ api: 'dnslookup', params: { domain: `d${i}.example` }, priority: 'BULK' }));
    await t.gql(SUBMIT_MANY, { i: { jobs: many } }, b.apiKey);
    const page = `query($after: String) { jobs(first: 3, after: $after, filter: { priority: BULK, api: "dnslookup" }) { totalCount pageInfo { hasNextPage endCursor } edges { cursor node { id params } } } }`;
    const seen: string[] = [];
    let after: string | null = null;
    for (let i = 0; i < 5; i++) {
      const r: any = await t.gql(page, { after }, b.apiKey);
      const conn: any = r.body.data.jobs;
      assert.equal(conn.totalCount, 7);
      seen.push(...conn.edges.map((e: any) => e.node.id));
      if (!conn.pageInfo.hasNextPage) break;
      after = conn.pageInfo.endCursor;
    }
    assert.equal(seen.length, 7);
    assert.equal(new Set(seen).size, 7);
    const none = await t.gql(`{ jobs(filter: { api: "emailvalidator" }) { totalCount edges { node { id } } } }`, {}, b.apiKey);
    assert.equal(none.body.data.jobs.totalCount, 0);
  });

  test('the same idempotency key returns the original job, never a second one; a different request under it is a conflict', async () => {
    const input = { api: 'dnslookup', params: { domain: 'idem.example' }, idempotencyKey: 'order-42' };
    const first = await t.gql(SUBMIT, { i: input }, a.apiKey);
    const firstId = first.body.data.submitJob.job.id;
    const again = await t.gql(SUBMIT, { i: input }, a.apiKey);
    assert.equal(again.body.data.submitJob.job.id, firstId);
    // The same key with other params (or another api) is not a replay: refused, naming the original job.
    const other = await t.gql(SUBMIT, { i: { ...input, params: { domain: 'other.example' } } }, a.apiKey);
    assert.equal(other.body.errors[0].extensions.code, 'IDEMPOTENCY_CONFLICT');
    assert.equal(other.body.errors[0].extensions.jobId, firstId);
    assert.match(other.body.errors[0].message, new RegExp(firstId));
    const otherApi = await t.gql(SUBMIT, { i: { ...input, api: 'emailvalidator', params: { email: 'idem@example.com' } } }, a.apiKey);
    assert.equal(otherApi.body.errors[0].extensions.code, 'IDEMPOTENCY_CONFLICT');
    // In a bulk submission: the whole submission is refused, naming the item and the original.
    const bulkConflict = await t.gql(SUBMIT_MANY, { i: { jobs: [{ ...input, idempotencyKey: 'order-44' }, { ...input, params: { domain: 'x.example' } }] } }, a.apiKey);
    assert.equal(bulkConflict.body.errors[0].extensions.code, 'IDEMPOTENCY_CONFLICT');
    assert.equal(bulkConflict.body.errors[0].extensions.index, 1);
    assert.equal(bulkConflict.body.errors[0].extensions.jobId, firstId);
    // The same key twice in one submission: BAD_USER_INPUT naming both items.
    const twice = await t.gql(SUBMIT_MANY, { i: { jobs: [input, { ...input, idempotencyKey: 'order-43' }, { ...input, idempotencyKey: 'order-43' }] } }, a.apiKey);
    assert.equal(twice.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    assert.deepEqual(twice.body.errors[0].extensions.indices, [1, 2]);
    const bulk = await t.gql(SUBMIT_MANY, { i: { jobs: [input, { ...input, idempotencyKey: 'order-43' }] } }, a.apiKey);
    const [x, y] = bulk.body.data.submitJobs.jobs;
    assert.equal(x.id, firstId, 'a replay inside a bulk submission answers with the original');
    assert.notEqual(y.id, x.id);
    // Another tenant's key space is its own.
    const elsewhere = await t.gql(SUBMIT, { i: input }, b.apiKey);
    assert.notEqual(elsewhere.body.data.submitJob.job.id, firstId);
    const count = await t.gql(`{ jobs(filter: { api: "dnslookup" }) { edges { node { idempotencyKey } } } }`, {}, a.apiKey);
    const keys = count.body.data.jobs.edges.map((e: any) => e.node.idempotencyKey).filter((k: string | null) => k?.startsWith('order-'));
    assert.deepEqual(keys.sort(), ['order-42', 'order-43'], 'refused submissions stored nothing');
  });

  test('me shows the tenant, its usage this period and its queues', async () => {
    const r = await t.gql(`{ me { tenant { id name tier } usage { creditsUsed creditsReserved creditsRemaining quota periodStart periodEnd } queues { priority depth running } } }`, {}, a.apiKey);
    const me = r.body.data.me;
    assert.deepEqual(me.tenant, { id: a.id, name: 'acme', tier: 'PRO' });
    assert.ok(me.usage.creditsUsed >= 5, 'the emailvalidator job billed 5 credits');
    assert.equal(me.usage.creditsRemaining, me.usage.quota - me.usage.creditsUsed - me.usage.creditsReserved);
    assert.ok(Date.parse(me.usage.periodStart) <= Date.now() && Date.now() < Date.parse(me.usage.periodEnd));
    assert.deepEqual(me.queues.map((q: any) => q.priority), ['INTERACTIVE', 'STANDARD', 'BULK']);
  });

  test('apis lists the catalog with costs', async () => {
    const r = await t.gql(`{ apis { name creditCost method requiredParams } }`, {}, a.apiKey);
    const email = r.body.data.apis.find((x: any) => x.name === 'emailvalidator');
    assert.deepEqual(email, { name: 'emailvalidator', creditCost: 5, method: 'GET', requiredParams: ['email'] });
  });
});
