/**
 * One bad caller locks out no one else, over real HTTP and graphql-ws: the
 * failed-auth budget counts the client's address as trusted proxies report it
 * (TRUST_PROXY), refuses only failing credentials (401, then 429 with
 * Retry-After; graphql-ws 4429), never a valid key; forged keys (a wrong
 * checksum, no key's shape) are refused without a database lookup; refusals
 * are readable by a client still uploading; every undocumented path is 404
 * before its body; introspection needs a key and is charged per alias.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import postgres from 'postgres';
import WebSocket from 'ws';
import { hashSecret } from '../src/tenants/keys.ts';
import { ADMIN_TOKEN, collect, startTestApp, type TestApp } from './helpers/app.ts';
import { capturingLogger } from './helpers/log.ts';

const CHECKSUMMED = /^slc_[A-Za-z0-9_-]{43}_[A-Za-z0-9_-]{8}$/;

async function post(url: string, query: string, token: string | null, extra: Record<string, string> = {}): Promise<{ status: number; body: any; headers: Headers }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}), ...extra }, body: JSON.stringify({ query }) });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null, headers: res.headers };
}

/** A forged key of the checksummed shape: right length, wrong checksum. */
function forgedKey(i: number): string {
  return `slc_${String(i).padStart(43, 'f')}_AAAAAAAA`;
}

/** A WebSocket's connection_init with this credential: 'ack', or the close code and reason. */
function wsInit(url: string, token: string, headers: Record<string, string> = {}): Promise<{ ack: boolean; code?: number; reason?: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url.replace(/^http/, 'ws'), 'graphql-transport-ws', { headers });
    ws.on('open', () => ws.send(JSON.stringify({ type: 'connection_init', payload: { authorization: `Bearer ${token}` } })));
    ws.on('message', (m) => {
      if (JSON.parse(String(m)).type === 'connection_ack') {
        ws.close();
        resolve({ ack: true });
      }
    });
    ws.on('close', (code, reason) => resolve({ ack: false, code, reason: String(reason) }));
    ws.on('unexpected-response', (_req, res) => resolve({ ack: false, code: res.statusCode! }));
    ws.on('error', reject);
  });
}

/**
 * A client that uploads `total` bytes in `chunk`-sized pieces every `everyMs` (a streamed
 * fetch body, as a browser or an SDK sends a large upload), and reads the answer whenever
 * it comes. Resolves with the status, headers and body it read, or with the error the
 * connection broke with before any answer could be read (EPIPE, a reset).
 */
async function slowUpload(url: string, headers: Record<string, string>, total: number, chunk = 64 * 1024, everyMs = 10): Promise<{ status: number; headers: Headers | null; body: any; brokeBeforeAnswer: boolean }> {
  let sent = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(c) {
      if (sent >= total) return c.close();
      await new Promise((r) => setTimeout(r, everyMs));
      const n = Math.min(chunk, total - sent);
      sent += n;
      c.enqueue(new Uint8Array(n).fill(0x20));
    },
  });
  try {
    const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body, duplex: 'half' } as RequestInit);
    const text = await res.text();
    return { status: res.status, headers: res.headers, body: JSON.parse(text), brokeBeforeAnswer: false };
  } catch (err) {
    const e = err as { cause?: { code?: string }; message: string };
    return { status: 0, headers: null, body: { error: e.cause?.code ?? e.message }, brokeBeforeAnswer: true };
  }
}

describe('behind one trusted proxy (TRUST_PROXY=1): the failing caller alone waits', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  const logs = capturingLogger();

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', NODE_ENV: 'production', TRUST_PROXY: '1', AUTH_FAILURES_PER_MINUTE: '3' }, {}, { log: logs.log });
    tenant = await t.createTenant('proxied');
  });
  after(() => t.stop());

  test('every key Sluice mints carries its checksum: createTenant, createApiKey, rotateTenantKey', async () => {
    assert.match(tenant.apiKey, CHECKSUMMED);
    const other = await t.createTenant('minted');
    const named = await t.gql(`mutation { createApiKey(input: { name: "ci", scopes: [READ] }) { secret } }`, {}, other.apiKey);
    assert.match(named.body.data.createApiKey.secret, CHECKSUMMED, JSON.stringify(named.body));
    const rotated = await t.gql(`mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }`, { id: other.id });
    assert.match(rotated.body.data.rotateTenantKey.apiKey, CHECKSUMMED);
    const me = await t.gql('{ me { tenant { id } } }', {}, rotated.body.data.rotateTenantKey.apiKey);
    assert.equal(me.body.data.me.tenant.id, other.id);
  });

  test("an attacker's failures (X-Forwarded-For 203.0.113.9) refuse its own guesses 429 but never a valid key from that address, and nobody else's", async () => {
    const attacker = { 'x-forwarded-for': '203.0.113.9' };
    const q = '{ me { tenant { id } } }';
    for (let i = 0; i < 3; i++) assert.equal((await post(t.url, q, forgedKey(i), attacker)).status, 401);
    const refused = await post(t.url, q, forgedKey(3), attacker);
    assert.equal(refused.status, 429);
    assert.equal(refused.body.errors[0].extensions.code, 'TOO_MANY_AUTH_FAILURES');
    assert.ok(Number(refused.headers.get('retry-after')) >= 1);
    // The same forwarded address with a valid tenant key, and with the admin token: served.
    const valid = await post(t.url, q, tenant.apiKey, attacker);
    assert.equal(valid.status, 200, JSON.stringify(valid.body));
    assert.equal(valid.body.data.me.tenant.id, tenant.id);
    assert.equal((await post(t.url, '{ tenants { id } }', ADMIN_TOKEN, attacker)).status, 200);
    // Another client behind the same proxy has its own budget: its wrong key is a plain 401.
    assert.equal((await post(t.url, q, forgedKey(9), { 'x-forwarded-for': '198.51.100.7' })).status, 401);
    // What the attacker prepends does not move it: the proxy's entry is the rightmost.
    assert.equal((await post(t.url, q, forgedKey(10), { 'x-forwarded-for': '192.0.2.1, 203.0.113.9' })).status, 429);

    // graphql-ws: the upgrade is never refused by address; a valid key connects, a failing one is closed 4429.
    assert.deepEqual(await wsInit(t.url, tenant.apiKey, attacker), { ack: true });
    const bad = await wsInit(t.url, forgedKey(11), attacker);
    assert.equal(bad.code, 4429);
    assert.match(bad.reason!, /^TOO_MANY_AUTH_FAILURES: retry in \d+ s$/);
    const elsewhere = await wsInit(t.url, forgedKey(12), { 'x-forwarded-for': '198.51.100.8' });
    assert.equal(elsewhere.code, 4401, 'another address is under its budget: the usual 4401');
    // A subscription over a socket opened from the attacker's address with a valid key runs.
    const events = await collect<any>(t.ws(tenant.apiKey), '{ me { tenant { id } } }', {}, (e) => e.length === 1, 10_000);
    assert.equal(events[0].me.tenant.id, tenant.id);
  });

  test("the audit log's address is the forwarded client's", async () => {
    const created = await post(t.url, 'mutation { createTenant(input: { name: "audited", tier: FREE }) { tenant { id } } }', ADMIN_TOKEN, { 'x-forwarded-for': '192.0.2.44' });
    assert.equal(created.status, 200);
    const line = logs.lines.filter((l) => l.audit === true && l.action === 'createTenant').at(-1);
    assert.deepEqual((line?.who as { address?: string } | undefined)?.address, '192.0.2.44');
  });

  test('forged keys are refused without a database lookup; old-format keys are still looked up and still work', async () => {
    // An old-format key (issued before checksums), written as it was: it keeps working.
    const db = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
    try {
      const legacy = `slc_${'L'.repeat(40)}old`;
      await db`insert into tenant_api_keys (tenant_id, key_hash, key_prefix, name) values (${tenant.id}, ${hashSecret(legacy)}, ${legacy.slice(0, 10)}, 'legacy')`;
      const me = await post(t.url, '{ me { tenant { id } } }', legacy);
      assert.equal(me.status, 200, JSON.stringify(me.body));
      assert.equal(me.body.data.me.tenant.id, tenant.id);
      // With the keys table gone, a lookup cannot succeed: forged keys are answered all the same
      // (no lookup is made), while an old-format unknown key shows that it is looked up.
      await db.unsafe('alter table tenant_api_keys rename to tenant_api_keys_gone');
      const from = { 'x-forwarded-for': '192.0.2.77' };
      const answers = [];
      for (const token of [forgedKey(20), 'slc_nope', 'not-a-key-at-all', forgedKey(21)]) answers.push((await post(t.url, '{ __typename }', token, from)).status);
      assert.deepEqual(answers, [401, 401, 401, 429], 'refused from the token alone, under and over the budget');
      const oldShape = await post(t.url, '{ __typename }', `slc_${'Q'.repeat(43)}`, { 'x-forwarded-for': '192.0.2.78' });
      assert.ok(oldShape.status >= 500, `an old-format key is looked up (and the lookup failed): ${oldShape.status}`);
    } finally {
      await db.unsafe('alter table if exists tenant_api_keys_gone rename to tenant_api_keys');
      await db.end();
    }
  });
});

describe('without TRUST_PROXY: forwarding headers are not believed', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', NODE_ENV: 'production', AUTH_FAILURES_PER_MINUTE: '2', UNAUTHENTICATED_MAX_BODY_BYTES: '4096' });
    tenant = await t.createTenant('direct');
  });
  after(() => t.stop());

  test('a client rotating X-Forwarded-For and Forwarded stays in its own budget', async () => {
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push((await post(t.url, '{ __typename }', forgedKey(i), { 'x-forwarded-for': `198.51.100.${i}`, forwarded: `for=198.51.100.${i}` })).status);
    assert.deepEqual(statuses, [401, 401, 429, 429]);
    assert.equal((await post(t.url, '{ me { tenant { id } } }', tenant.apiKey)).status, 200);
  });

  test('refusals are readable while the body is still uploading: 401/429 with Retry-After, 404, 413', async () => {
    // A wrong key uploading 4 MB reads its 401, then (past the budget) its 429 and Retry-After, every time.
    for (let i = 0; i < 6; i++) {
      const r = await slowUpload(t.url, { authorization: `Bearer slc_slow_${i}` }, 4 * 1024 * 1024);
      assert.equal(r.brokeBeforeAnswer, false, `attempt ${i}: ${JSON.stringify(r.body)}`);
      assert.ok(r.status === 401 || r.status === 429, String(r.status));
      if (r.status === 429) {
        assert.equal(r.body.errors[0].extensions.code, 'TOO_MANY_AUTH_FAILURES');
        assert.ok(Number(r.headers!.get('retry-after')) >= 1);
      }
    }
    // An undocumented path: 404 at once, readable.
    const lost = await slowUpload(new URL('/x/graphql', t.url).href, { authorization: `Bearer ${tenant.apiKey}` }, 4 * 1024 * 1024);
    assert.deepEqual([lost.brokeBeforeAnswer, lost.status, lost.body.errors?.[0]?.extensions.code], [false, 404, 'NOT_FOUND'], JSON.stringify(lost.body));
    // No key and a body past UNAUTHENTICATED_MAX_BODY_BYTES (streamed: no length declared), and a key past MAX_BODY_BYTES.
    const big = await slowUpload(t.url, {}, 2 * 1024 * 1024);
    assert.deepEqual([big.brokeBeforeAnswer, big.status, big.body.errors?.[0]?.extensions.code], [false, 413, 'BODY_TOO_LARGE'], JSON.stringify(big.body));
    const keyed = await slowUpload(t.url, { authorization: `Bearer ${tenant.apiKey}` }, 24 * 1024 * 1024, 1024 * 1024, 1);
    assert.deepEqual([keyed.brokeBeforeAnswer, keyed.status, keyed.body.errors?.[0]?.extensions.code], [false, 413, 'BODY_TOO_LARGE'], JSON.stringify(keyed.body));
    // The server is fine afterwards.
    assert.equal((await post(t.url, '{ me { tenant { id } } }', tenant.apiKey)).status, 200);
  });

  test('one front door: /graphql/, /x/graphql and unknown paths are 404 NOT_FOUND before their body; other methods 405; WebSocket upgrades elsewhere refused', async () => {
    const origin = new URL(t.url).origin;
    for (const path of ['/graphql/', '/x/graphql', '/api/graphql', '/nope', '/graphql;x']) {
      // A valid key and a query: these paths served GraphQL (with the anonymous body limit and no failure budget).
      const r = await fetch(origin + path, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${tenant.apiKey}` }, body: JSON.stringify({ query: '{ me { tenant { id } } }' }) });
      const body = (await r.json()) as any;
      assert.equal(r.status, 404, path);
      assert.equal(body.errors[0].extensions.code, 'NOT_FOUND', path);
    }
    // A 100 MB body declared, 64 bytes sent: answered at once from the request line.
    const started = Date.now();
    const declared = await new Promise<{ status: number; body: any }>((resolve, reject) => {
      const req = request(`${origin}/somewhere/graphql`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': String(100 * 1024 * 1024) } }, (res) => {
        let text = '';
        res.on('data', (c) => (text += c));
        res.on('end', () => {
          req.destroy();
          resolve({ status: res.statusCode!, body: JSON.parse(text) });
        });
      });
      req.on('error', reject);
      req.write(Buffer.alloc(64, 0x20));
    });
    assert.deepEqual([declared.status, declared.body.errors[0].extensions.code], [404, 'NOT_FOUND']);
    assert.ok(Date.now() - started < 2_000, 'answered without waiting for the body');
    const put = await fetch(t.url, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: '{}' });
    assert.equal(put.status, 405);
    assert.equal(((await put.json()) as any).errors[0].extensions.code, 'METHOD_NOT_ALLOWED');
    assert.match(put.headers.get('allow') ?? '', /POST/);
    for (const path of ['/graphql/', '/x/graphql', '/']) {
      const r = await wsInit(origin + path, tenant.apiKey);
      assert.deepEqual([r.ack, r.code], [false, 404], path);
    }
    assert.deepEqual(await wsInit(`${origin}/graphql?x=1`, tenant.apiKey), { ack: true }, 'a query string is still /graphql');
    // The documented doors still answer.
    for (const path of ['/healthz', '/console/', '/usage.csv']) assert.notEqual((await fetch(origin + path, { headers: { authorization: `Bearer ${tenant.apiKey}` } })).status, 404, path);
  });
});

describe('introspection (INTROSPECTION=keys, the default outside development)', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  const schemaFields = (n: number) => `query { ${Array.from({ length: n }, (_, i) => `s${i}: __schema { ...T }`).join(' ')} } fragment T on __Schema { types { name kind fields { name args { name } type { name kind ofType { name } } } } }`;

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', NODE_ENV: 'production' });
    tenant = await t.createTenant('introspecting', 'PRO'); // a burst of 2,000 points
  });
  after(() => t.stop());

  test("anonymous: 30 aliases of __schema are refused 401 before anything runs, cheaply; __typename stays public", async () => {
    const query = schemaFields(30);
    assert.ok(query.length < 1_600, `${query.length} bytes`);
    const started = performance.now();
    const r = await post(t.url, query, null);
    const ms = performance.now() - started;
    assert.equal(r.status, 401);
    assert.equal(r.body.errors[0].extensions.code, 'UNAUTHENTICATED');
    assert.match(r.body.errors[0].message, /introspection/);
    assert.equal(r.body.data, undefined);
    assert.ok(JSON.stringify(r.body).length < 1_000, 'a short answer, not megabytes');
    assert.ok(ms < 1_000, `${ms} ms`);
    for (const q of ['{ __type(name: "Job") { name } }', '{ x: __type(name: "Job") { name } }']) assert.equal((await post(t.url, q, null)).status, 401, q);
    assert.equal((await post(t.url, '{ __typename }', null)).body.data.__typename, 'Query');
  });

  test('a key may introspect, charged per alias: n aliases of __schema cost n times one; 30 are more than a budget holds; 31 are too many aliases', async () => {
    const one = await post(t.url, schemaFields(1), tenant.apiKey);
    assert.equal(one.status, 200, JSON.stringify(one.body.errors));
    const unit = one.body.extensions.cost.requestedQueryCost;
    assert.ok(unit >= 100, `__schema costs ${unit}`);
    const three = await post(t.url, schemaFields(3), tenant.apiKey);
    assert.equal(three.body.extensions.cost.requestedQueryCost, 3 * unit);
    const thirty = await post(t.url, schemaFields(30), tenant.apiKey);
    assert.equal(thirty.status, 400);
    assert.equal(thirty.body.errors[0].extensions.code, 'QUERY_TOO_COSTLY');
    assert.equal(thirty.body.errors[0].extensions.cost.requestedQueryCost, 30 * unit);
    const thirtyOne = await post(t.url, schemaFields(31), tenant.apiKey);
    assert.equal(thirtyOne.body.errors[0].extensions.code, 'TOO_MANY_ALIASES');
    // The admin token (never charged) may too.
    assert.equal((await post(t.url, schemaFields(1), ADMIN_TOKEN)).status, 200);
  });

  test('over graphql-ws: a key introspects, charged like over HTTP', async () => {
    const events = await collect<any>(t.ws(tenant.apiKey), '{ __schema { queryType { name } } }', {}, (e) => e.length === 1, 10_000);
    assert.equal(events[0].__schema.queryType.name, 'Query');
  });
});

describe('INTROSPECTION=off', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', INTROSPECTION: 'off' });
    tenant = await t.createTenant('no-docs');
  });
  after(() => t.stop());

  test('nobody introspects, over HTTP or graphql-ws: 403 INTROSPECTION_DISABLED', async () => {
    for (const token of [null, tenant.apiKey, ADMIN_TOKEN]) {
      const r = await post(t.url, '{ __schema { queryType { name } } }', token);
      assert.equal(r.status, 403, String(token));
      assert.equal(r.body.errors[0].extensions.code, 'INTROSPECTION_DISABLED');
    }
    await assert.rejects(collect(t.ws(tenant.apiKey), '{ __type(name: "Job") { name } }', {}, () => true, 10_000), (err: any) => err.errors?.[0]?.extensions?.code === 'INTROSPECTION_DISABLED');
    assert.equal((await post(t.url, '{ me { tenant { id } } }', tenant.apiKey)).status, 200);
  });
});
