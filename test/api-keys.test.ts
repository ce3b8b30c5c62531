/**
 * Named API keys over real HTTP: scopes (SUBMIT, READ) refused with FORBIDDEN,
 * a tenant managing its own keys and the admin anyone's, expiry, lastUsedAt
 * written without a write per request, and every bad input with its code.
 * (Sockets closing on revocation: test/revocation.test.ts.)
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const CREATE = `mutation($i: CreateApiKeyInput!) { createApiKey(input: $i) { key { id name prefix scopes createdAt expiresAt lastUsedAt revokedAt } secret } }`;
const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const JOBS = `{ jobs(first: 5) { edges { node { id } } } }`;

describe('named API keys and scopes', () => {
  let t: TestApp;
  let acme: { id: string; apiKey: string };
  let other: { id: string; apiKey: string };

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api' });
    acme = await t.createTenant('acme', 'PRO');
    other = await t.createTenant('other', 'PRO');
  });
  after(() => t.stop());

  const create = async (input: Record<string, unknown>, token?: string) => {
    const r = await t.gql(CREATE, { i: input }, token);
    return r;
  };

  test("a tenant's first key is 'default' with both scopes", async () => {
    const r = await t.gql('{ apiKeys { name scopes expiresAt revokedAt prefix } }', {}, acme.apiKey);
    assert.deepEqual(r.body.data.apiKeys, [{ name: 'default', scopes: ['SUBMIT', 'READ'], expiresAt: null, revokedAt: null, prefix: acme.apiKey.slice(0, 10) }]);
  });

  test('a READ key reads but cannot submit or manage keys; a SUBMIT key submits and cancels but cannot read', async () => {
    const read = (await create({ name: 'dashboard', scopes: ['READ'] }, acme.apiKey)).body.data.createApiKey;
    assert.deepEqual(read.key.scopes, ['READ']);
    assert.match(read.secret, /^slc_/);
    const submit = (await create({ name: 'ci', scopes: ['SUBMIT'] }, acme.apiKey)).body.data.createApiKey;

    assert.ok((await t.gql(JOBS, {}, read.secret)).body.data.jobs, 'READ lists jobs');
    const refused = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'a.example' } } }, read.secret);
    assert.equal(refused.status, 403);
    assert.equal(refused.body.errors[0].extensions.code, 'FORBIDDEN');
    assert.match(refused.body.errors[0].message, /SUBMIT scope/);
    assert.equal(refused.body.data, undefined, 'nothing ran');
    const mint = await create({ name: 'escalate', scopes: ['SUBMIT', 'READ'] }, read.secret);
    assert.equal(mint.body.errors[0].extensions.code, 'FORBIDDEN', 'a read-only key cannot mint a key that submits');

    const submitted = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'b.example' } } }, submit.secret);
    assert.equal(submitted.body.data.submitJob.job.state, 'QUEUED');
    const cancelled = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { state } }`, { id: submitted.body.data.submitJob.job.id }, submit.secret);
    assert.equal(cancelled.body.data.cancelJob.state, 'CANCELLED');
    const noRead = await t.gql(JOBS, {}, submit.secret);
    assert.equal(noRead.body.errors[0].extensions.code, 'FORBIDDEN');
    assert.match(noRead.body.errors[0].message, /READ scope/);
  });

  test('a tenant lists and revokes only its own keys; the admin names the tenant', async () => {
    const mine = (await t.gql('{ apiKeys { id name } }', {}, acme.apiKey)).body.data.apiKeys as { id: string; name: string }[];
    assert.deepEqual(mine.map((k) => k.name), ['default', 'dashboard', 'ci']);
    const theirs = (await t.gql('{ apiKeys { id } }', {}, other.apiKey)).body.data.apiKeys as { id: string }[];
    assert.equal(theirs.length, 1);
    const peek = await t.gql('query($id: ID!) { apiKeys(tenantId: $id) { id } }', { id: other.id }, acme.apiKey);
    assert.equal(peek.body.errors[0].extensions.code, 'FORBIDDEN');
    const steal = await t.gql('mutation($id: ID!) { revokeApiKey(id: $id) { id } }', { id: theirs[0]!.id }, acme.apiKey);
    assert.equal(steal.body.errors[0].extensions.code, 'NOT_FOUND', "another tenant's key is not found, not revoked");
    assert.equal((await t.gql('{ me { tenant { id } } }', {}, other.apiKey)).status, 200);

    const adminList = await t.gql('query($id: ID!) { apiKeys(tenantId: $id) { name } }', { id: acme.id });
    assert.equal(adminList.body.data.apiKeys.length, 3);
    const noTenant = await t.gql('{ apiKeys { name } }');
    assert.equal(noTenant.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    const byAdmin = (await create({ tenantId: other.id, name: 'ops', scopes: ['READ'] })).body.data.createApiKey;
    assert.equal((await t.gql('{ me { tenant { id } } }', {}, byAdmin.secret)).body.data.me.tenant.id, other.id);
    const revoked = await t.gql('mutation($id: ID!) { revokeApiKey(id: $id) { id revokedAt } }', { id: byAdmin.key.id });
    assert.ok(revoked.body.data.revokeApiKey.revokedAt);
    const refused = await t.gql('{ me { tenant { id } } }', {}, byAdmin.secret);
    assert.equal(refused.status, 401);
    assert.equal(refused.body.errors[0].extensions.code, 'UNAUTHENTICATED');
  });

  test('bad input is refused with a code and the field', async () => {
    const cases: [Record<string, unknown>, string, string][] = [
      [{ name: '  ', scopes: ['READ'] }, 'BAD_USER_INPUT', 'name'],
      [{ name: 'x'.repeat(101), scopes: ['READ'] }, 'BAD_USER_INPUT', 'name'],
      [{ name: 'none', scopes: [] }, 'BAD_USER_INPUT', 'scopes'],
      [{ name: 'past', scopes: ['READ'], expiresAt: new Date(Date.now() - 1000).toISOString() }, 'BAD_USER_INPUT', 'expiresAt'],
    ];
    for (const [input, code, field] of cases) {
      const r = await create(input, acme.apiKey);
      assert.equal(r.body.errors?.[0]?.extensions?.code, code, JSON.stringify(r.body));
      assert.equal(r.body.errors[0].extensions.field, field);
    }
    const unknownScope = await create({ name: 'x', scopes: ['ADMIN'] }, acme.apiKey);
    assert.ok(unknownScope.body.errors?.[0]?.extensions?.code, 'an unknown scope is refused with a code');
    const badId = await t.gql('mutation { revokeApiKey(id: "nope") { id } }', {}, acme.apiKey);
    assert.equal(badId.body.errors[0].extensions.code, 'BAD_USER_INPUT', 'an id that is not a UUID is the caller\'s mistake');
    assert.equal(badId.body.errors[0].extensions.field, 'id');
    const noSuchTenant = await create({ tenantId: '00000000-0000-0000-0000-000000000000', name: 'x', scopes: ['READ'] });
    assert.equal(noSuchTenant.body.errors[0].extensions.code, 'NOT_FOUND');
  });

  test('a key with expiresAt works until then and is refused after', async () => {
    const soon = (await create({ name: 'short', scopes: ['READ'], expiresAt: new Date(Date.now() + 2_000).toISOString() }, acme.apiKey)).body.data.createApiKey;
    assert.ok(soon.key.expiresAt);
    const first = await t.gql('{ me { tenant { id } } }', {}, soon.secret);
    // On a loaded machine the first request may already be past the 2 s; either way it is never accepted after.
    if (Date.now() < Date.parse(soon.key.expiresAt)) assert.ok([200, 401].includes(first.status));
    const refused = await eventually(async () => {
      const r = await t.gql('{ me { tenant { id } } }', {}, soon.secret);
      return r.status === 401 ? r : null;
    }, 20_000, 200);
    assert.equal(refused.body.errors[0].extensions.code, 'UNAUTHENTICATED');
    assert.ok(Date.now() >= Date.parse(soon.key.expiresAt), 'refused only once expired');
  });

  test('lastUsedAt: written after a use, not again for uses within the minute (one write per key, not per request)', async () => {
    const k = (await create({ name: 'meter', scopes: ['READ'] }, acme.apiKey)).body.data.createApiKey;
    assert.equal(k.key.lastUsedAt, null);
    const sql = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
    try {
      await t.gql('{ me { tenant { id } } }', {}, k.secret);
      const used = await eventually(async () => {
        const keys = (await t.gql('{ apiKeys { id lastUsedAt } }', {}, acme.apiKey)).body.data.apiKeys as { id: string; lastUsedAt: string | null }[];
        return keys.find((x) => x.id === k.key.id)?.lastUsedAt ?? null;
      }, 20_000, 250);
      const before = (await sql`select xmin::text from tenant_api_keys where id = ${k.key.id}`)[0]!.xmin as string;
      for (let i = 0; i < 20; i++) assert.equal((await t.gql('{ me { tenant { id } } }', {}, k.secret)).status, 200);
      // The flush runs every 5 s: wait past one, then the row is still the same version.
      await new Promise((r) => setTimeout(r, 6_000));
      const row = (await sql`select xmin::text, last_used_at from tenant_api_keys where id = ${k.key.id}`)[0]!;
      const after = row.xmin as string;
      const last_used_at = row.last_used_at as Date;
      assert.equal(after, before, 'twenty uses within the minute wrote nothing');
      assert.equal(new Date(last_used_at).toISOString(), new Date(used).toISOString());
    } finally {
      await sql.end();
    }
  });
});
