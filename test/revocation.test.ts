/**
 * Revoked keys lose everything: after rotateTenantKey, every graphql-ws
 * connection opened with the old key, on every node, is closed with 4401 and
 * a reason. Refused connections say why: 4401 for a missing or unknown key;
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
    a = await startTestApp({ SLUICE_ROLE: 'api' });
    // A second node of the same deployment: revocation must reach its connections too.
    b = await startTestApp({ SLUICE_ROLE: 'api', DATABASE_URL: a.databaseUrl });
    tenant = await a.createTenant('revoked', 'PRO');
    other = await a.createTenant('bystander', 'PRO');
  });
  after(async () => {
    await Promise.all(watched.map((w) => w.client.dispose()));
    await b.stop();
    await a.stop();
  });

  test('rotateTenantKey closes every subscription of the old key on every node with 4401; others stay open', async () => {
    const usageA = open(a, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    const usageB = open(b, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    const completedB = open(b, tenant.apiKey, 'subscription { jobsCompleted { id state } }');
    const bystander = open(a, other.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    await Promise.all([usageA, usageB, bystander].map(connected));
    await eventually(async () => completedB.acknowledged, 20_000, 20);

    const r = await a.gql(`mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }`, { id: tenant.id });
    const newKey = r.body.data.rotateTenantKey.apiKey as string;

    for (const w of [usageA, usageB, completedB]) {
      await eventually(async () => w.closed, 10_000, 20);
      assert.equal(w.closed!.code, 4401, JSON.stringify(w.closed));
      assert.match(w.closed!.reason, /revoked/);
    }
    assert.equal(bystander.closed, null, "another tenant's connection is untouched");

    // The old key cannot reconnect; the new one can.
    const again = open(a, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    await eventually(async () => again.closed, 10_000, 20);
    assert.equal(again.closed!.code, 4401);
    const fresh = open(b, newKey, 'subscription { tenantUsage { usage { quota } } }');
    await connected(fresh);
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
