/**
 * Revoked keys lose everything: after revokeApiKey, every graphql-ws
 * connection opened with that key, on every node, is closed with 4401 and a
 * reason (the tenant's other keys keep theirs); after rotateTenantKey, the old
 * key's connections close when its overlap ends. Refused connections say why: 4401 for a missing or unknown key;
 * a forbidden operation is refused alone (FORBIDDEN), its siblings carry on.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { startTestApp, eventually, type TestApp } from './helpers/app.ts';
import { connected, watch, type Watched } from './helpers/ws-watch.ts';

describe('revoked keys and refused graphql-ws connections', () => {
  let a: TestApp;
  let b: TestApp;
  let tenant: { id: string; apiKey: string };
  let other: { id: string; apiKey: string };
  const watched: Watched[] = [];
  const open = (app: TestApp, token: string | null, query: string) => {
    const w = watch(app.url, token, query);
    watched.push(w);
    return w;
  };

  before(async () => {
    // A short rotation overlap, so the test sees the old key's connections close when it ends.
    a = await startTestApp({ SLUICE_ROLE: 'api', KEY_ROTATION_OVERLAP_SECONDS: '3' });
    // A second node of the same deployment: revocation must reach its connections too.
    b = await startTestApp({ SLUICE_ROLE: 'api', DATABASE_URL: a.databaseUrl, KEY_ROTATION_OVERLAP_SECONDS: '3' });
    tenant = await a.createTenant('revoked', 'PRO');
    other = await a.createTenant('bystander', 'PRO');
  });
  after(async () => {
    await Promise.all(watched.map((w) => w.client.dispose()));
    await b.stop();
    await a.stop();
  });

  test('revokeApiKey closes every subscription of that key on every node with 4401; the tenant\'s other key and other tenants stay open', async () => {
    const created = await a.gql(`mutation($i: CreateApiKeyInput!) { createApiKey(input: $i) { key { id } secret } }`, { i: { tenantId: tenant.id, name: 'dashboard', scopes: ['READ'] } });
    const dashboard = created.body.data.createApiKey as { key: { id: string }; secret: string };
    const usageA = open(a, dashboard.secret, 'subscription { tenantUsage { usage { quota } } }');
    const usageB = open(b, dashboard.secret, 'subscription { tenantUsage { usage { quota } } }');
    const completedB = open(b, dashboard.secret, 'subscription { jobsCompleted { id state } }');
    const sibling = open(b, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    const bystander = open(a, other.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    await Promise.all([usageA, usageB, sibling, bystander].map(connected));
    await eventually(async () => completedB.acknowledged, 20_000, 20);

    // The tenant revokes its own dashboard key, on node A.
    const revoked = await a.gql(`mutation($id: ID!) { revokeApiKey(id: $id) { id revokedAt } }`, { id: dashboard.key.id }, tenant.apiKey);
    assert.ok(revoked.body.data?.revokeApiKey.revokedAt, JSON.stringify(revoked.body));

    for (const w of [usageA, usageB, completedB]) {
      await eventually(async () => w.closed, 10_000, 20);
      assert.equal(w.closed!.code, 4401, JSON.stringify(w.closed));
      assert.match(w.closed!.reason, /revoked/);
    }
    assert.equal(sibling.closed, null, "the tenant's other key keeps its connection");
    assert.equal(bystander.closed, null, "another tenant's connection is untouched");

    // The revoked key cannot reconnect.
    const again = open(a, dashboard.secret, 'subscription { tenantUsage { usage { quota } } }');
    await eventually(async () => again.closed, 10_000, 20);
    assert.equal(again.closed!.code, 4401);
  });

  test('rotateTenantKey: the old key\'s subscriptions stay open for the overlap, then close with 4401 on every node; the new key connects', async () => {
    const oldA = open(a, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    const oldB = open(b, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    await Promise.all([oldA, oldB].map(connected));
    const r = await a.gql(`mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }`, { id: tenant.id });
    const newKey = r.body.data.rotateTenantKey.apiKey as string;
    const fresh = open(b, newKey, 'subscription { tenantUsage { usage { quota } } }');
    await connected(fresh);
    // Within the overlap (3 s here) the old key still authenticates: a request with it is answered.
    const during = await a.gql('{ me { tenant { id } } }', {}, tenant.apiKey);
    if (during.status === 200) assert.equal(oldA.closed, null, 'open while the old key still works');
    for (const w of [oldA, oldB]) {
      await eventually(async () => w.closed, 20_000, 20);
      assert.equal(w.closed!.code, 4401, JSON.stringify(w.closed));
      assert.match(w.closed!.reason, /expired/);
    }
    assert.equal((await a.gql('{ me { tenant { id } } }', {}, tenant.apiKey)).status, 401, 'the old key is refused after the overlap');
    assert.equal(fresh.closed, null, 'the new key keeps its connection');
    tenant = { ...tenant, apiKey: newKey };
  });

  test('a missing or unknown key is refused with 4401 and a reason', async () => {
    const missing = open(a, null, 'subscription { jobsCompleted { id } }');
    const unknown = open(a, 'slc_unknown', 'subscription { jobsCompleted { id } }');
    for (const w of [missing, unknown]) {
      await eventually(async () => w.closed, 10_000, 20);
      assert.equal(w.closed!.code, 4401, JSON.stringify(w.closed));
      assert.ok(w.closed!.reason.length > 0, 'the close says why');
    }
    assert.match(missing.closed!.reason, /missing/);
  });

  test('a forbidden operation gets FORBIDDEN for itself alone: the connection and its sibling subscription carry on', async () => {
    const usage = open(a, other.apiKey, 'subscription { tenantUsage { queues { priority depth } } }');
    await connected(usage);
    const before = usage.events.length;
    // The same connection (graphql-ws multiplexes one socket per client) asks for an admin field.
    const refused = await new Promise<unknown>((resolve) => {
      usage.client.subscribe({ query: 'subscription { systemStatus { alerts { key } } }' }, { next: (v) => resolve(v), error: (e) => resolve(e), complete: () => resolve('complete') });
    });
    const errors = (Array.isArray(refused) ? refused : ((refused as { errors?: unknown[] }).errors ?? [])) as { message: string; extensions?: { code?: string } }[];
    assert.equal(errors[0]?.extensions?.code, 'FORBIDDEN', JSON.stringify(refused));
    assert.match(errors[0]!.message, /admin/);
    // The sibling still runs: a submission changes the queues and it pushes the change.
    const r = await a.gql('mutation { submitJob(input: {api: "dnslookup", params: {domain: "x.example"}}) { job { id } } }', {}, other.apiKey);
    assert.ok(r.body.data?.submitJob, JSON.stringify(r.body));
    await eventually(async () => usage.events.length > before, 10_000, 20);
    assert.equal(usage.closed, null, 'the connection stays open');
  });
});
