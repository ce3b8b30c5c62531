/**
 * The front door: credentials, tenant isolation (I8) and every submission
 * error, each with its code, against a real server.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ADMIN_TOKEN, collect, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;

describe('auth, isolation and errors (API role only: jobs stay queued)', () => {
  let t: TestApp;
  let a: { id: string; apiKey: string };
  let b: { id: string; apiKey: string };

  before(async () => {
    // No dispatcher in this process, so submitted jobs stay QUEUED and can be cancelled.
    t = await startTestApp({ SLUICE_ROLE: 'api' });
    a = await t.createTenant('tenant-a', 'PRO');
    b = await t.createTenant('tenant-b', 'PRO');
  });
  after(() => t.stop());

  test('a missing or wrong key gets 401 UNAUTHENTICATED and no data', async () => {
    for (const token of [null, 'slc_not_a_real_key']) {
      const r = await t.gql(`{ me { tenant { id } } }`, {}, token);
      assert.equal(r.status, 401);
      assert.equal(r.body.errors?.[0]?.extensions?.code, 'UNAUTHENTICATED');
      assert.equal(r.body.data, undefined);
    }
    const raw = await fetch(t.url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Basic xyz' }, body: '{"query":"{ apis { name } }"}' });
    assert.equal(raw.status, 401);
  });

  test('introspection needs a key outside development (INTROSPECTION=keys): GraphiQL loads the docs with the key in its Headers tab', async () => {
    const anonymous = await t.gql(`{ __schema { queryType { name } } }`, {}, null);
    assert.equal(anonymous.status, 401);
    assert.equal(anonymous.body.errors[0].extensions.code, 'UNAUTHENTICATED');
    const r = await t.gql(`{ __schema { queryType { name } } }`, {}, a.apiKey);
    assert.equal(r.status, 200);
    assert.equal(r.body.data.__schema.queryType.name, 'Query');
  });

  test('roles: tenants cannot call admin operations, the admin token is not a tenant', async () => {
    const r = await t.gql(`{ tenants { id } }`, {}, a.apiKey);
    assert.equal(r.status, 403);
    assert.equal(r.body.errors[0].extensions.code, 'FORBIDDEN');
    const mixed = await t.gql(`{ me { tenant { id } } tenants { id } }`, {}, a.apiKey);
    assert.equal(mixed.status, 403);
    assert.equal(mixed.body.data, undefined, 'no partial data');
    const admin = await t.gql(`{ me { tenant { id } } }`, {}, ADMIN_TOKEN);
    assert.equal(admin.body.errors[0].extensions.code, 'FORBIDDEN');
  });

  test('admin manages tenants: list, update limits, rotate keys', async () => {
    const list = await t.gql(`{ tenants { id name tier weight concurrencyCap monthlyQuota queueBound quotaPolicy } }`);
    assert.ok(list.body.data.tenants.some((x: any) => x.id === a.id && x.tier === 'PRO' && x.weight === 2));
    const upd = await t.gql(
      `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { tier weight concurrencyCap monthlyQuota queueBound quotaPolicy } }`,
      { i: { id: b.id, tier: 'ENTERPRISE', weight: 7, concurrencyCap: 3, quotaPolicy: 'FAIL' } },
    );
    assert.deepEqual(upd.body.data.updateTenant, { tier: 'ENTERPRISE', weight: 7, concurrencyCap: 3, monthlyQuota: 1_000_000, queueBound: 200_000, quotaPolicy: 'FAIL' });
    const cleared = await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { weight } }`, { i: { id: b.id, weight: null } });
    assert.equal(cleared.body.data.updateTenant.weight, 4, 'null goes back to the tier default');
    const bad = await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { weight } }`, { i: { id: b.id, concurrencyCap: 0 } });
    assert.equal(bad.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    const missing = await t.gql(`mutation { rotateTenantKey(id: "00000000-0000-0000-0000-000000000000") { apiKey } }`);
    assert.equal(missing.body.errors[0].extensions.code, 'NOT_FOUND');
    const dup = await t.gql(`mutation { createTenant(input: { name: "tenant-a", tier: FREE }) { apiKey } }`);
    assert.equal(dup.body.errors[0].extensions.code, 'BAD_USER_INPUT');

    const c = await t.createTenant('rotating', 'FREE');
    const rotated = await t.gql(`mutation($id: ID!) { rotateTenantKey(id: $id) { tenant { id } apiKey } }`, { id: c.id });
    const newKey = rotated.body.data.rotateTenantKey.apiKey;
    assert.notEqual(newKey, c.apiKey);
    // The old key keeps working for the overlap (KEY_ROTATION_OVERLAP_SECONDS, 24 h by default), with an expiry to show for it.
    assert.equal((await t.gql(`{ me { tenant { id } } }`, {}, c.apiKey)).body.data.me.tenant.id, c.id, 'the old key works during the overlap');
    assert.equal((await t.gql(`{ me { tenant { id } } }`, {}, newKey)).body.data.me.tenant.id, c.id);
    const keys = (await t.gql(`query($id: ID!) { apiKeys(tenantId: $id) { id name expiresAt revokedAt } }`, { id: c.id })).body.data.apiKeys;
    assert.equal(keys.length, 2);
    const hoursLeft = (Date.parse(keys[0].expiresAt) - Date.now()) / 3_600_000;
    assert.ok(hoursLeft > 23 && hoursLeft <= 24, `the old key expires in about 24 h: ${keys[0].expiresAt}`);
    assert.equal(keys[1].expiresAt, null, 'the new key does not expire');
    await t.gql(`mutation($id: ID!) { revokeApiKey(id: $id) { revokedAt } }`, { id: keys[0].id });
    assert.equal((await t.gql(`{ me { tenant { id } } }`, {}, c.apiKey)).status, 401, 'a revoked key stops working at once');
  });

  test('A cannot read, list, cancel or subscribe to B\'s jobs', async () => {
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'b-secret.example' } } }, b.apiKey);
    const id = r.body.data.submitJob.job.id;
    assert.equal((await t.gql(`query($id: ID!) { job(id: $id) { id } }`, { id }, a.apiKey)).body.data.job, null);
    const listed = await t.gql(`{ jobs(first: 100) { edges { node { id } } } }`, {}, a.apiKey);
    assert.ok(!listed.body.data.jobs.edges.some((e: any) => e.node.id === id));
    const cancel = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id } }`, { id }, a.apiKey);
    assert.equal(cancel.body.errors[0].extensions.code, 'NOT_FOUND');
    await assert.rejects(
      collect(t.ws(a.apiKey), `subscription($id: ID!) { jobUpdated(id: $id) { id } }`, { id }, () => true, 10_000),
      (err: any) => err.errors?.[0]?.extensions?.code === 'NOT_FOUND' || /no job/.test(err.message),
    );
    // And the job is untouched: B still sees it queued.
    assert.equal((await t.gql(`query($id: ID!) { job(id: $id) { state } }`, { id }, b.apiKey)).body.data.job.state, 'QUEUED');
  });

  test('a graphql-ws connection with a wrong key is refused', async () => {
    await assert.rejects(collect(t.ws('slc_wrong'), `subscription { jobsCompleted { id } }`, {}, () => true, 10_000));
    await assert.rejects(collect(t.ws(null), `subscription { jobsCompleted { id } }`, {}, () => true, 10_000));
  });

  test('cancelJob cancels a queued job, and only a queued one', async () => {
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'cancel.example' } } }, a.apiKey);
    const id = r.body.data.submitJob.job.id;
    const cancelled = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id state finishedAt } }`, { id }, a.apiKey);
    assert.equal(cancelled.body.data.cancelJob.state, 'CANCELLED');
    assert.ok(cancelled.body.data.cancelJob.finishedAt);
    const again = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id } }`, { id }, a.apiKey);
    assert.equal(again.body.errors[0].extensions.code, 'NOT_CANCELLABLE');
    const depth = await t.gql(`{ me { queues { priority depth } } }`, {}, a.apiKey);
    assert.ok(depth.body.data.me.queues.every((q: any) => typeof q.depth === 'number'));
  });

  test('every submission error has its code, and a refused bulk submission adds nothing', async () => {
    const before = (await t.gql(`{ jobs { totalCount } }`, {}, a.apiKey)).body.data.jobs.totalCount;
    const cases: Array<[unknown, string]> = [
      [{ api: 'nosuchapi', params: {} }, 'UNKNOWN_API'],
      [{ api: 'exchangerate', params: { currency1: 'USD' } }, 'MISSING_PARAMS'],
      [{ api: 'dnslookup', params: ['not', 'an', 'object'] }, 'BAD_USER_INPUT'],
    ];
    for (const [input, code] of cases) {
      const r = await t.gql(SUBMIT, { i: input }, a.apiKey);
      assert.equal(r.body.errors?.[0]?.extensions?.code, code, JSON.stringify(input));
      assert.equal(r.body.data?.submitJob ?? null, null);
    }
    const badPriority = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'x.example' }, priority: 'URGENT' } }, a.apiKey);
    assert.equal(badPriority.body.errors?.[0]?.extensions?.code, 'BAD_PRIORITY');
    const badPriorityLiteral = await t.gql(`mutation { submitJob(input: { api: "dnslookup", params: { domain: "x" }, priority: URGENT }) { job { id } } }`, {}, a.apiKey);
    assert.equal(badPriorityLiteral.body.errors?.[0]?.extensions?.code, 'BAD_PRIORITY');

    const bulk = await t.gql(SUBMIT_MANY, { i: { jobs: [{ api: 'dnslookup', params: { domain: 'ok.example' } }, { api: 'dnslookup', params: {} }] } }, a.apiKey);
    assert.equal(bulk.body.errors[0].extensions.code, 'MISSING_PARAMS');
    assert.equal(bulk.body.errors[0].extensions.index, 1);

    const tooMany = Array.from({ length: 10_001 }, (_, i) => ({ api: 'dnslookup', params: { domain: `n${i}.example` } }));
    const big = await t.gql(SUBMIT_MANY, { i: { jobs: tooMany } }, a.apiKey);
    assert.equal(big.body.errors[0].extensions.code, 'TOO_MANY_ITEMS');

    const after = (await t.gql(`{ jobs { totalCount } }`, {}, a.apiKey)).body.data.jobs.totalCount;
    assert.equal(after, before, 'nothing refused was stored');
  });

  test('10,000 jobs in one submitJobs are accepted whole', async () => {
    const jobs = Array.from({ length: 10_000 }, (_, i) => ({ api: 'dnslookup', params: { domain: `bulk${i}.example` }, priority: 'BULK' }));
    const r = await t.gql(SUBMIT_MANY, { i: { jobs } }, b.apiKey);
    assert.equal(r.body.data.submitJobs.jobs.length, 10_000);
    assert.ok(r.body.data.submitJobs.jobs.every((j: any) => j.state === 'QUEUED'));
    const q = await t.gql(`{ me { queues { priority depth } } }`, {}, b.apiKey);
    assert.ok(q.body.data.me.queues.find((x: any) => x.priority === 'BULK').depth >= 10_000);
  });

  test('a body over the limit gets 413 BODY_TOO_LARGE', async () => {
    const huge = 'x'.repeat(17 * 1024 * 1024);
    const r = await fetch(t.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${a.apiKey}` },
      body: JSON.stringify({ query: SUBMIT, variables: { i: { api: 'dnslookup', params: { domain: huge } } } }),
    });
    assert.equal(r.status, 413);
    const body = (await r.json()) as any;
    assert.equal(body.errors[0].extensions.code, 'BODY_TOO_LARGE');
  });
});
