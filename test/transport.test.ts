/**
 * Transports and limits before authentication, over real HTTP and graphql-ws:
 * subscriptions over HTTP (SSE) refused with a code that points to graphql-ws;
 * the key checked from the headers before the body is read; small bodies and
 * graphql-ws messages until a credential is accepted; a per-address budget of
 * failed authentications (401, then 429 with Retry-After); Node's server
 * timeouts; GraphiQL off in production and served with a CSP; /metrics refused
 * off loopback without a token; a short admin token refused at start; the
 * audit log of admin mutations.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { request } from 'node:http';
import { connect } from 'node:net';
import WebSocket from 'ws';
import { ConfigError, loadEnv } from '../src/config/env.ts';
import { AuthFailureBudget, authRetryAfter, isLoopbackHost, limitSocketPayload, recordFailure } from '../src/http/front-door.ts';
import { auditedTenantId } from '../src/http/audit.ts';
import { metricsRefused } from '../src/http/ops.ts';
import { ADMIN_TOKEN, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { capturingLogger } from './helpers/log.ts';

/** A request whose headers are sent and whose declared body never comes: the answer must not need it. */
function headersOnly(url: string, headers: Record<string, string>): Promise<{ status: number; body: any; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': String(8 * 1024 * 1024), ...headers } }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text), headers: res.headers }));
    });
    req.on('error', reject);
    req.flushHeaders();
    req.write('{"query":"'); // a start, then nothing: the server answers from the headers
  });
}

async function post(url: string, body: string, token: string | null, extra: Record<string, string> = {}): Promise<{ status: number; body: any; headers: Headers }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}), ...extra }, body });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null, headers: res.headers };
}

/** A raw graphql-transport-ws socket: what a client sends, byte for byte. */
function rawSocket(url: string): Promise<{ ws: WebSocket; messages: any[]; closed: Promise<{ code: number; reason: string }> }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url.replace(/^http/, 'ws'), 'graphql-transport-ws');
    const messages: any[] = [];
    const closed = new Promise<{ code: number; reason: string }>((r) => ws.on('close', (code, reason) => r({ code, reason: String(reason) })));
    ws.on('message', (m) => messages.push(JSON.parse(String(m))));
    ws.on('open', () => resolve({ ws, messages, closed }));
    ws.on('error', reject);
  });
}

test('pure parts: the failure budget, loopback hosts, the metrics rule, the audited tenant', () => {
  let w = recordFailure(undefined, 0);
  w = recordFailure(w, 10_000);
  assert.equal(authRetryAfter(w, 20_000, 3), null, 'two failures, a limit of three');
  w = recordFailure(w, 20_000);
  assert.equal(authRetryAfter(w, 20_000, 3), 40, 'the window began at 0: 40 s left');
  assert.equal(authRetryAfter(w, 60_000, 3), null, 'a new minute');
  assert.deepEqual(recordFailure(w, 60_000), { startedAt: 60_000, failures: 1 });
  let now = 0;
  const budget = new AuthFailureBudget({ perMinute: 1, maxAddresses: 2, now: () => now });
  budget.fail('a');
  budget.fail('b');
  budget.fail('c');
  assert.equal(budget.retryAfter('a'), null, 'the oldest address was forgotten');
  assert.equal(budget.retryAfter('c'), 60);
  now = 59_500;
  assert.equal(budget.retryAfter('c'), 1);

  for (const h of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost', '::ffff:127.0.0.1']) assert.equal(isLoopbackHost(h), true, h);
  for (const h of ['0.0.0.0', '::', '10.0.0.1', '192.168.1.2', 'example.org']) assert.equal(isLoopbackHost(h), false, h);
  assert.equal(metricsRefused(false, undefined), true);
  assert.equal(metricsRefused(false, 't'), false);
  assert.equal(metricsRefused(true, undefined), false);

  assert.equal(auditedTenantId({ id: 't1' }, null), 't1');
  assert.equal(auditedTenantId({ input: { id: 't2', name: 'x' } }, null), 't2');
  assert.equal(auditedTenantId({ input: { name: 'x' } }, { tenant: { id: 't3' }, apiKey: 'slc_secret' }), 't3');
  assert.equal(auditedTenantId({}, null), null);
});

test("limitSocketPayload: the receiver's own limit when ws exposes it; otherwise a message past it closes 1009; oversize errors are not re-emitted", () => {
  const withReceiver = Object.assign(new EventEmitter(), { _receiver: { _maxPayload: 100 }, close: () => {} });
  limitSocketPayload(withReceiver as never, 10);
  assert.equal(withReceiver._receiver._maxPayload, 10);
  let errors = 0;
  withReceiver.on('error', () => void errors++);
  withReceiver.emit('error', Object.assign(new RangeError('Max payload size exceeded'), { code: 'WS_ERR_UNSUPPORTED_MESSAGE_LENGTH' }));
  withReceiver.emit('error', new Error('something else'));
  assert.equal(errors, 1, 'only the oversize error is kept from graphql-ws (which prints a stack)');

  const closes: number[] = [];
  const bare = Object.assign(new EventEmitter(), { close: (code: number) => void closes.push(code) });
  limitSocketPayload(bare as never, 10);
  bare.emit('message', Buffer.alloc(10));
  assert.deepEqual(closes, []);
  bare.emit('message', Buffer.alloc(11));
  assert.deepEqual(closes, [1009]);
  limitSocketPayload(bare as never, 100); // raised after connection_init: one listener, the new limit
  bare.emit('message', Buffer.alloc(50));
  assert.deepEqual(closes, [1009]);
  assert.equal(bare.listenerCount('message'), 1);
});

test('a SLUICE_ADMIN_TOKEN shorter than 32 characters is refused at start, with the variable named', () => {
  assert.throws(() => loadEnv({ SLUICE_ADMIN_TOKEN: 'slcadm_short' }), (err: Error) => err instanceof ConfigError && /SLUICE_ADMIN_TOKEN: .*32 characters/.test(err.message));
  assert.equal(loadEnv({ SLUICE_ADMIN_TOKEN: 'x'.repeat(32) }).SLUICE_ADMIN_TOKEN, 'x'.repeat(32));
  assert.equal(loadEnv({}).SLUICE_ADMIN_TOKEN, undefined);
  assert.throws(() => loadEnv({ HTTP_HEADERS_TIMEOUT_MS: '20000', HTTP_REQUEST_TIMEOUT_MS: '10000' }), /HTTP_HEADERS_TIMEOUT_MS/);
});

describe('the front door of a demo process', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  const logs = capturingLogger();

  before(async () => {
    t = await startTestApp(
      { UNAUTHENTICATED_MAX_BODY_BYTES: '4096', MAX_BODY_BYTES: '262144', HTTP_HEADERS_TIMEOUT_MS: '1000', HTTP_REQUEST_TIMEOUT_MS: '5000', HTTP_KEEP_ALIVE_TIMEOUT_MS: '300' },
      {},
      { log: logs.log },
    );
    tenant = await t.createTenant('front-door-co');
  });
  after(async () => {
    await t?.stop();
  });

  test('a subscription over HTTP (SSE) is refused with SUBSCRIPTIONS_NEED_GRAPHQL_WS, for every caller, and the answer ends', async () => {
    for (const token of [tenant.apiKey, null]) {
      const r = await post(t.url, JSON.stringify({ query: 'subscription { tenantUsage { usage { quota } } }' }), token);
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.errors[0].extensions.code, 'SUBSCRIPTIONS_NEED_GRAPHQL_WS');
      assert.match(r.body.errors[0].message, /graphql-ws/);
    }
    // A client that asks for an event stream gets the same 400 JSON, not a 200 stream: nothing is left polling.
    for (const method of ['POST', 'GET'] as const) {
      const query = 'subscription { tenantUsage { usage { quota } } }';
      const res = await fetch(method === 'GET' ? `${t.url}?query=${encodeURIComponent(query)}` : t.url, {
        method,
        headers: { accept: 'text/event-stream', authorization: `Bearer ${tenant.apiKey}`, ...(method === 'POST' ? { 'content-type': 'application/json' } : {}) },
        ...(method === 'POST' ? { body: JSON.stringify({ query }) } : {}),
      });
      const text = await res.text(); // resolves only once the server ends the answer
      assert.equal(res.status, 400, `${method}: ${text.slice(0, 200)}`);
      assert.match(res.headers.get('content-type') ?? '', /application\/json/);
      assert.equal(JSON.parse(text).errors[0].extensions.code, 'SUBSCRIPTIONS_NEED_GRAPHQL_WS');
    }
    // Queries still answer over HTTP, also to an SSE-accepting client.
    const q = await post(t.url, JSON.stringify({ query: '{ me { tenant { id } } }' }), tenant.apiKey);
    assert.equal(q.body.data.me.tenant.id, tenant.id);
  });

  test('a wrong key is refused 401 from the headers alone, before its body is read', async () => {
    const r = await headersOnly(t.url, { authorization: 'Bearer slc_wrong_key' });
    assert.equal(r.status, 401);
    assert.equal(r.body.errors[0].extensions.code, 'UNAUTHENTICATED');
    assert.equal(r.headers['www-authenticate'], 'Bearer');
  });

  test('without a key a body may be UNAUTHENTICATED_MAX_BODY_BYTES; with one, MAX_BODY_BYTES', async () => {
    const declared = await headersOnly(t.url, {});
    assert.equal(declared.status, 413);
    assert.equal(declared.body.errors[0].extensions.code, 'BODY_TOO_LARGE');
    assert.equal(declared.body.errors[0].extensions.maxBytes, 4096);
    assert.match(declared.body.errors[0].message, /without an API key/);
    // 10 KiB: over the anonymous limit (sent chunked, no length declared), well under the authenticated one.
    const padded = JSON.stringify({ query: `{ apis { name } } ${'#'.repeat(10 * 1024)}` });
    const anon = await fetch(t.url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: new Blob([padded]).stream(), duplex: 'half' } as RequestInit);
    assert.equal(anon.status, 413);
    assert.equal((await anon.json()).errors[0].extensions.maxBytes, 4096);
    const keyed = await post(t.url, padded, tenant.apiKey);
    assert.equal(keyed.status, 200, JSON.stringify(keyed.body));
    assert.ok(keyed.body.data.apis.length > 0);
    const small = await post(t.url, JSON.stringify({ query: '{ __typename }' }), null);
    assert.equal(small.status, 200, 'small anonymous requests (public fields, GraphiQL) pass');
    const huge = await headersOnly(t.url, { authorization: `Bearer ${tenant.apiKey}` });
    assert.equal(huge.status, 413);
    assert.equal(huge.body.errors[0].extensions.maxBytes, 262144);
  });

  test('graphql-ws reads small messages until connection_init is accepted, then MAX_BODY_BYTES', async () => {
    const big = JSON.stringify({ type: 'connection_init', payload: { authorization: `Bearer ${tenant.apiKey}`, pad: 'x'.repeat(8 * 1024) } });
    const early = await rawSocket(t.url);
    early.ws.send(big);
    const closed = await early.closed;
    assert.equal(closed.code, 1009, JSON.stringify(closed));
    assert.deepEqual(early.messages, [], 'never acknowledged');

    const ok = await rawSocket(t.url);
    try {
      ok.ws.send(JSON.stringify({ type: 'connection_init', payload: { authorization: `Bearer ${tenant.apiKey}` } }));
      await eventually(async () => ok.messages.some((m) => m.type === 'connection_ack'), 10_000, 10);
      // 16 KiB now: past the pre-auth limit, within MAX_BODY_BYTES.
      ok.ws.send(JSON.stringify({ id: '1', type: 'subscribe', payload: { query: `{ apis { name } } ${'#'.repeat(16 * 1024)}` } }));
      await eventually(async () => ok.messages.some((m) => m.id === '1' && m.type === 'complete'), 10_000, 10);
      const next = ok.messages.find((m) => m.id === '1' && m.type === 'next');
      assert.ok(next?.payload.data.apis.length > 0, JSON.stringify(ok.messages).slice(0, 300));
      assert.equal(ok.ws.readyState, WebSocket.OPEN);
    } finally {
      ok.ws.close();
    }
  });

  test("Node's server timeouts: headers must arrive in HTTP_HEADERS_TIMEOUT_MS; idle keep-alive sockets close", async () => {
    const port = new URL(t.url).port;
    const slow = connect(Number(port), '127.0.0.1');
    let answer = '';
    slow.on('data', (d) => (answer += d));
    const ended = new Promise<void>((r) => slow.on('close', () => r()));
    await new Promise<void>((r) => slow.on('connect', () => r()));
    slow.write('POST /graphql HTTP/1.1\r\nHost: x\r\n'); // and never the rest of the headers
    await Promise.race([ended, new Promise((_, rej) => setTimeout(() => rej(new Error('a client stalling its headers kept its socket for 15 s')), 15_000))]);
    assert.match(answer, /^HTTP\/1\.1 408/);

    const idle = connect(Number(port), '127.0.0.1');
    let served = '';
    idle.on('data', (d) => (served += d)); // read, so the server's FIN is seen
    const idleClosed = new Promise<void>((r) => idle.on('close', () => r()));
    await new Promise<void>((r) => idle.on('connect', () => r()));
    idle.write('GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n');
    await Promise.race([idleClosed, new Promise((_, rej) => setTimeout(() => rej(new Error('an idle keep-alive socket stayed open for 15 s')), 15_000))]);
    assert.match(served, /^HTTP\/1\.1 200/);
    assert.doesNotMatch(served, /connection: close/i, 'a keep-alive answer: the server closed it for idling');
  });

  test('GraphiQL (on in demo mode) comes with a CSP that forbids framing', async () => {
    const res = await fetch(t.url, { headers: { accept: 'text/html' } });
    assert.equal(res.status, 200);
    const csp = res.headers.get('content-security-policy') ?? '';
    assert.match(csp, /frame-ancestors 'none'/);
    assert.match(csp, /script-src 'sha256-[A-Za-z0-9+/=]+'/);
    assert.doesNotMatch(csp, /unsafe-eval|script-src[^;]*unsafe-inline/);
    assert.equal(res.headers.get('x-frame-options'), 'DENY');
    assert.match(await res.text(), /sluiceStorage/);
    // JSON answers are not HTML: no page policy on them.
    const json = await post(t.url, JSON.stringify({ query: '{ __typename }' }), null);
    assert.equal(json.headers.get('content-security-policy'), null);
  });

  test('admin mutations write an audit line: action, tenant id, who; never the key', async () => {
    const created = await t.gql(`mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`, { i: { name: 'audited', tier: 'PRO' } });
    const id = created.body.data.createTenant.tenant.id as string;
    const key = created.body.data.createTenant.apiKey as string;
    await t.gql('mutation($id: ID!) { suspendTenant(id: $id) { id } }', { id });
    const r = await t.gql('mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }', { id });
    const rotated = r.body.data.rotateTenantKey.apiKey as string;
    const audit = logs.lines.filter((l) => l.audit === true && l.tenantId === id);
    assert.deepEqual(audit.map((l) => l.action), ['createTenant', 'suspendTenant', 'rotateTenantKey']);
    for (const l of audit) {
      assert.deepEqual(l.who, { role: 'admin', address: '127.0.0.1' });
      assert.equal(l.ok, true);
      assert.equal(l.msg, 'admin action');
    }
    const all = JSON.stringify(logs.lines);
    for (const secret of [key, rotated, ADMIN_TOKEN]) assert.ok(!all.includes(secret), 'no secret in the log');
    // A tenant's own mutations are not admin actions.
    await t.gql('mutation { submitJob(input: {api: "dnslookup", params: {domain: "x.example"}}) { job { id } } }', {}, tenant.apiKey);
    assert.ok(!logs.lines.some((l) => l.audit === true && l.action === 'submitJob'));
  });
});

describe('a production-like API process: failed-auth budget, GraphiQL off, /metrics off without a token', () => {
  let t: TestApp;
  let base: string;
  let tenant: { id: string; apiKey: string };
  const logs = capturingLogger();

  before(async () => {
    // A real key (never called: an API-only process dispatches nothing) and all interfaces.
    t = await startTestApp({ SLUICE_ROLE: 'api', APIVERVE_API_KEY: 'apiverve-test-key', HOST: '0.0.0.0', AUTH_FAILURES_PER_MINUTE: '3' }, {}, { log: logs.log });
    base = `http://127.0.0.1:${t.app.port}`;
    tenant = await t.createTenant('budgeted');
  });
  after(async () => {
    await t?.stop();
  });

  test('GraphiQL is off unless GRAPHIQL=true', async () => {
    const res = await fetch(`${base}/graphql`, { headers: { accept: 'text/html' } });
    const text = await res.text();
    assert.doesNotMatch(text, /sluiceConnectionParams|graphiql/i);
  });

  test('/metrics off loopback without METRICS_TOKEN: 403, and a log line at start says why', async () => {
    const res = await fetch(`${base}/metrics`);
    assert.equal(res.status, 403);
    assert.match(await res.text(), /METRICS_TOKEN/);
    assert.ok(logs.lines.some((l) => l.level === 40 && /METRICS_TOKEN is not set/.test(String(l.msg))), 'a warning at start');
  });

  test('failed authentications from one address: 401, then 429 with Retry-After for the failing caller only (HTTP and graphql-ws); valid keys and no-key requests still pass', async () => {
    const query = JSON.stringify({ query: '{ apis { name } }' });
    for (let i = 0; i < 3; i++) {
      const r = await post(`${base}/graphql`, query, `slc_guess_${i}`);
      assert.equal(r.status, 401, `guess ${i}`);
    }
    const blocked = await post(`${base}/graphql`, query, 'slc_guess_3');
    assert.equal(blocked.status, 429);
    assert.equal(blocked.body.errors[0].extensions.code, 'TOO_MANY_AUTH_FAILURES');
    const retryAfter = Number(blocked.headers.get('retry-after'));
    assert.ok(retryAfter >= 1 && retryAfter <= 60, String(retryAfter));
    // Past the budget, a valid key from the same address is still served: only the failing caller waits.
    const valid = await post(`${base}/graphql`, JSON.stringify({ query: '{ me { tenant { id } } }' }), tenant.apiKey);
    assert.equal(valid.status, 200, JSON.stringify(valid.body));
    assert.equal(valid.body.data.me.tenant.id, tenant.id);
    assert.equal((await post(`${base}/graphql`, JSON.stringify({ query: '{ __typename }' }), null)).status, 200);
    // graphql-ws: the upgrade is not refused by address; a valid key connects and runs its operation...
    const ok = await rawSocket(`${base}/graphql`);
    ok.ws.send(JSON.stringify({ type: 'connection_init', payload: { authorization: `Bearer ${tenant.apiKey}` } }));
    await eventually(async () => ok.messages.some((m) => m.type === 'connection_ack'), 5_000, 20);
    ok.ws.close();
    // ...and a failing credential is closed 4429 with the wait in its reason.
    const bad = await rawSocket(`${base}/graphql`);
    bad.ws.send(JSON.stringify({ type: 'connection_init', payload: { authorization: 'Bearer slc_guess_ws' } }));
    const closed = await bad.closed;
    assert.equal(closed.code, 4429);
    assert.match(closed.reason, /^TOO_MANY_AUTH_FAILURES: retry in \d+ s$/);
  });
});
