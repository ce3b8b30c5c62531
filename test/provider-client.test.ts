/**
 * The provider client: pure header parsing and classification, then contract
 * tests of the real client against the simulator over real HTTP (127.0.0.1,
 * port 0) for every outcome kind, the batch endpoint and the billing rules.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { DEFAULT_CATALOG } from '../src/config/apis.ts';
import { PLANS } from '../src/config/plans.ts';
import {
  classifyBatchItem,
  classifyFailure,
  classifyResponse,
  DEFAULT_RETRY_AFTER_SECONDS,
  decodeUtf8,
  kindForErrorStatus,
  matchBatchResults,
  MAX_DATA_DEPTH,
  reactionTo,
  storableJson,
  storableText,
} from '../src/provider/classify.ts';
import { createProviderClient, type ProviderClientOptions } from '../src/provider/client.ts';
import { headerValue, parseProviderStatus, parseRenewal, parseRetryAfter } from '../src/provider/headers.ts';
import type { BatchItem, OutcomeKind, ProviderClient } from '../src/provider/types.ts';
import { startSimulator, type Simulator, type SimulatorOptions } from '../src/simulator/index.ts';

const EMAIL_COST = DEFAULT_CATALOG.get('emailvalidator')!.creditCost;
const FX = { currency1: 'USD', currency2: 'EUR' };

/** A simulator and a client on it; both closed by the returned `close`. */
async function rig(simOpts: SimulatorOptions = {}, clientOpts: Partial<ProviderClientOptions> = {}) {
  const sim = await startSimulator({ ratePerMinute: 6000, cooldownSeconds: 1, ...simOpts });
  const client = createProviderClient({ baseUrl: sim.url, timeoutMs: 2000, catalog: sim.catalog, ...clientOpts });
  return {
    sim,
    client,
    close: async () => {
      await client.close();
      await sim.stop();
    },
  };
}

async function withRig(
  simOpts: SimulatorOptions,
  fn: (r: { sim: Simulator; client: ProviderClient }) => Promise<void>,
  clientOpts: Partial<ProviderClientOptions> = {},
) {
  const r = await rig(simOpts, clientOpts);
  try {
    await fn(r);
  } finally {
    await r.close();
  }
}

// ------------------------------------------------------------------ headers

describe('header parsing (pure)', () => {
  const documented = {
    'x-rate-limit-limit': '180',
    'x-rate-limit-remaining': '179',
    'x-api-remaining-credits': '-4',
    'x-api-max-credits': '1000000',
    'x-api-credits-used': '1000004',
    'x-api-renewal': '1767225600',
    'x-api-current-plan': 'PRO',
  };

  test('every documented header, including a negative balance', () => {
    const at = new Date('2025-12-15T00:00:00Z');
    const s = parseProviderStatus(documented, at);
    assert.deepEqual(s, {
      remainingCredits: -4,
      maxCredits: 1_000_000,
      creditsUsed: 1_000_004,
      renewalAt: new Date('2026-01-01T00:00:00Z'),
      rateLimitLimit: 180,
      rateLimitRemaining: 179,
      plan: 'PRO',
      observedAt: at,
    });
  });

  test('missing and unreadable headers are null, never an exception', () => {
    const s = parseProviderStatus({ 'x-api-remaining-credits': 'lots', 'x-rate-limit-limit': '', 'x-api-renewal': 'soon' });
    assert.equal(s.remainingCredits, null);
    assert.equal(s.rateLimitLimit, null);
    assert.equal(s.rateLimitRemaining, null);
    assert.equal(s.maxCredits, null);
    assert.equal(s.creditsUsed, null);
    assert.equal(s.renewalAt, null);
    assert.equal(s.plan, null);
  });

  test('works on fetch Headers, arrays and any case', () => {
    const h = new Headers({ 'X-Api-Remaining-Credits': '0', 'x-rate-limit-limit': 'unlimited' });
    const s = parseProviderStatus(h);
    assert.equal(s.remainingCredits, 0);
    assert.equal(s.rateLimitLimit, null); // Mega's "unlimited"
    assert.equal(headerValue({ 'X-Api-Current-Plan': ['MEGA', 'x'] }, 'x-api-current-plan'), 'MEGA');
  });

  test('renewal as seconds, milliseconds or a date string', () => {
    assert.deepEqual(parseRenewal('1767225600'), new Date('2026-01-01T00:00:00Z'));
    assert.deepEqual(parseRenewal('1767225600000'), new Date('2026-01-01T00:00:00Z'));
    assert.deepEqual(parseRenewal('2026-01-01T00:00:00Z'), new Date('2026-01-01T00:00:00Z'));
    assert.equal(parseRenewal('0'), null);
  });

  test('retry-after as seconds (rounded up) or an HTTP date', () => {
    assert.equal(parseRetryAfter('50'), 50);
    assert.equal(parseRetryAfter('0.2'), 1);
    assert.equal(parseRetryAfter(' 7 '), 7);
    const now = Date.parse('2025-01-01T00:00:00Z');
    assert.equal(parseRetryAfter('Wed, 01 Jan 2025 00:00:30 GMT', now), 30);
    assert.equal(parseRetryAfter('-3'), null);
    assert.equal(parseRetryAfter('soon'), null);
    assert.equal(parseRetryAfter(null), null);
  });
});

// ------------------------------------------------------------------ classification

describe('classification (pure)', () => {
  const facts = (httpStatus: number, headers: Record<string, string>, body: unknown) => ({
    httpStatus,
    headers,
    bodyText: typeof body === 'string' ? body : JSON.stringify(body),
    cost: 5,
    latencyMs: 12,
    observedAt: new Date('2025-06-01T00:00:00Z'),
  });
  const err = (msg: string) => ({ status: 'error', error: msg, data: null });

  test('status table', () => {
    const cases: [number, string | null, number | null, OutcomeKind][] = [
      [429, 'Rate limit exceeded. Max 180 requests per minute...', 10, 'rate_limited'],
      [429, 'Monthly credit limit reached...', 0, 'credits_exhausted'],
      [429, 'Rate limit exceeded', -4, 'credits_exhausted'],
      [429, 'Monthly credit limit reached...', null, 'credits_exhausted'],
      [429, 'Too many requests', null, 'rate_limited'],
      [402, 'Payment required', 100, 'credits_exhausted'],
      [403, 'Monthly credit limit reached', 0, 'credits_exhausted'],
      [403, 'API key is suspended or has insufficient permissions.', 10, 'key_unusable'],
      [401, 'Invalid API key.', null, 'key_unusable'],
      [400, 'Missing required parameter: email', 10, 'bad_input'],
      [422, null, null, 'bad_input'],
      [404, 'not found', 10, 'unknown_api'],
      [408, null, null, 'server_error'],
      [500, null, null, 'server_error'],
      [503, null, null, 'server_error'],
    ];
    for (const [status, msg, remaining, kind] of cases) {
      assert.equal(kindForErrorStatus(status, msg, remaining), kind, `${status} ${msg} ${remaining}`);
    }
  });

  test('200 bills the cost map value; a rate-limit 429 carries retry-after', () => {
    const ok = classifyResponse(facts(200, { 'x-api-credits-used': '999' }, { status: 'ok', error: null, data: { a: 1 } }));
    assert.equal(ok.kind, 'billed');
    assert.equal(ok.creditsBilled, 5); // not the header
    assert.deepEqual(ok.data, { a: 1 });
    const rl = classifyResponse(facts(429, { 'retry-after': '50', 'x-api-remaining-credits': '12' }, err('Rate limit exceeded.')));
    assert.equal(rl.kind, 'rate_limited');
    assert.equal(rl.retryAfterSeconds, 50);
    assert.equal(rl.creditsBilled, 0);
    assert.equal(rl.message, 'Rate limit exceeded.');
  });

  test('a 429 without retry-after falls back to x-rate-limit-reset, then to the default', () => {
    const reset = classifyResponse(facts(429, { 'x-rate-limit-reset': '9', 'x-api-remaining-credits': '3' }, err('x')));
    assert.equal(reset.retryAfterSeconds, 9);
    const none = classifyResponse(facts(429, { 'x-api-remaining-credits': '3' }, err('x')));
    assert.equal(none.retryAfterSeconds, DEFAULT_RETRY_AFTER_SECONDS);
  });

  test('credits exhausted waits until the renewal when no retry-after is given', () => {
    const renewal = Date.parse('2025-06-01T01:00:00Z') / 1000;
    const o = classifyResponse(facts(402, { 'x-api-renewal': String(renewal) }, err('Monthly credit limit reached')));
    assert.equal(o.kind, 'credits_exhausted');
    assert.equal(o.retryAfterSeconds, 3600);
  });

  test('a 200 that is not the envelope is a billed, final bad_response; an unreadable 502 is a server_error', () => {
    for (const body of ['<html>oops', '{"status":"ok","data":{"a', '[1,2]', '"ok"', '{"foo":1}', '{"status":"fine","data":{}}', '']) {
      const bad = classifyResponse(facts(200, {}, body));
      assert.deepEqual([bad.kind, bad.creditsBilled, bad.data, reactionTo(bad)], ['bad_response', 5, null, 'fail'], body);
      assert.match(bad.message ?? '', /not its JSON envelope/);
    }
    const gw = classifyResponse(facts(502, {}, '<html>bad gateway'));
    assert.equal(gw.kind, 'server_error');
    assert.equal(gw.creditsBilled, 0);
    // The envelope saying error on a 200: the provider's own word, billed, retried as before.
    const said = classifyResponse(facts(200, {}, err('upstream lookup failed')));
    assert.deepEqual([said.kind, said.creditsBilled, reactionTo(said)], ['server_error', 5, 'retry']);
    // Older shapes without a status still read.
    assert.equal(classifyResponse(facts(200, {}, { data: { a: 1 } })).kind, 'billed');
  });

  test('a body over the limit or not UTF-8 is a bad_response on a 200, and classified by its status otherwise', () => {
    const big = classifyResponse({ ...facts(200, {}, ''), bodyProblem: 'too_large', maxResultBytes: 1000 });
    assert.deepEqual([big.kind, big.creditsBilled], ['bad_response', 5]);
    assert.match(big.message ?? '', /over 1000 bytes \(MAX_RESULT_BYTES\)/);
    const bytes = classifyResponse({ ...facts(200, {}, ''), bodyProblem: 'not_utf8' });
    assert.deepEqual([bytes.kind, bytes.creditsBilled], ['bad_response', 5]);
    assert.match(bytes.message ?? '', /not valid UTF-8/);
    const refusal = classifyResponse({ ...facts(429, { 'x-api-remaining-credits': '5' }, ''), bodyProblem: 'too_large' });
    assert.deepEqual([refusal.kind, refusal.creditsBilled], ['rate_limited', 0]);
    assert.equal(decodeUtf8(Buffer.from([0x7b, 0x80, 0x7d])), null);
    assert.equal(decodeUtf8(Buffer.from('{"a":"é"}')), '{"a":"é"}');
  });

  test('data and messages are made storable: U+0000 and lone surrogates become U+FFFD, pairs and the rest stay', () => {
    assert.equal(storableText('a\u0000b'), 'a\ufffdb');
    assert.equal(storableText('x\ud800y\udc00'), 'x\ufffdy\ufffd');
    assert.equal(storableText('emoji \ud83d\ude00 ok'), 'emoji \ud83d\ude00 ok');
    const clean = { a: [1, 'two', { three: null }] };
    assert.equal(storableJson(clean).ok && (storableJson(clean) as { value: unknown }).value, clean, 'nothing to change: the same object');
    const ok = classifyResponse(facts(200, {}, '{"status":"ok","error":null,"data":{"domain":"a\\u0000b","k\\ud800":["\\udfff"],"records":[]}}'));
    assert.equal(ok.kind, 'billed');
    assert.deepEqual(ok.data, { domain: 'a\ufffdb', 'k\ufffd': ['\ufffd'], records: [] });
    const msg = classifyResponse(facts(400, {}, '{"status":"error","error":"bad\\u0000input","data":null}'));
    assert.equal(msg.message, 'bad\ufffdinput');
    let deep: unknown = 'leaf';
    for (let i = 0; i < MAX_DATA_DEPTH + 1; i++) deep = [deep];
    const tooDeep = classifyResponse(facts(200, {}, { status: 'ok', error: null, data: deep }));
    assert.deepEqual([tooDeep.kind, tooDeep.creditsBilled], ['bad_response', 5]);
    assert.equal(storableJson(deep, MAX_DATA_DEPTH + 2).ok, true);
  });

  test('no answer: timeout billing rule, and a connection that never opened bills nothing', () => {
    const base = { message: 'x', cost: 5, latencyMs: 1 };
    assert.equal(classifyFailure({ ...base, reason: 'timeout', requestSent: true, timeoutBilling: 'billed' }).creditsBilled, 5);
    assert.equal(classifyFailure({ ...base, reason: 'timeout', requestSent: true, timeoutBilling: 'refunded' }).creditsBilled, 0);
    assert.equal(classifyFailure({ ...base, reason: 'timeout', requestSent: true, timeoutBilling: 'billed' }).kind, 'timeout');
    const refused = classifyFailure({ ...base, reason: 'network', requestSent: false, timeoutBilling: 'billed' });
    assert.equal(refused.kind, 'server_error');
    assert.equal(refused.creditsBilled, 0);
    const reset = classifyFailure({ ...base, reason: 'network', requestSent: true, timeoutBilling: 'billed' });
    assert.equal(reset.creditsBilled, 5);
  });

  test('reactionTo', () => {
    const expected: Record<OutcomeKind, string> = {
      billed: 'complete',
      server_error: 'retry',
      timeout: 'retry',
      rate_limited: 'put_back',
      credits_exhausted: 'put_back',
      key_unusable: 'put_back',
      bad_input: 'fail',
      unknown_api: 'fail',
      bad_response: 'fail',
    };
    for (const [kind, reaction] of Object.entries(expected)) assert.equal(reactionTo({ kind: kind as OutcomeKind }), reaction);
  });

  test('batch items: per-item statuses, and matching by id when reordered or missing', () => {
    const opts = { timeoutBilling: 'billed' as const };
    assert.equal(classifyBatchItem('a', { id: 'a', status: 200, data: 1 }, 5, opts).creditsBilled, 5);
    const rl = classifyBatchItem('a', { id: 'a', status: 429, retryAfter: 3, error: 'Rate limit exceeded' }, 5, opts);
    assert.deepEqual([rl.kind, rl.retryAfterSeconds, rl.creditsBilled], ['rate_limited', 3, 0]);
    assert.equal(classifyBatchItem('a', { id: 'a', status: 402, error: 'x' }, 5, opts).kind, 'credits_exhausted');
    assert.equal(classifyBatchItem('a', { id: 'a', status: 400, error: 'x' }, 5, opts).kind, 'bad_input');
    const missing = classifyBatchItem('a', undefined, 5, opts);
    assert.deepEqual([missing.kind, missing.creditsBilled], ['server_error', 5]);
    const r = (id: string, status: number) => ({ id, status });
    const matched = matchBatchResults(['a', 'b', 'a', 'c'], [r('b', 200), r('a', 429), r('a', 200)]);
    assert.deepEqual(matched, [r('a', 429), r('b', 200), r('a', 200), undefined]);
  });
});

// ------------------------------------------------------------------ contract: single calls

describe('client against the simulator: single calls', () => {
  test('billed: data, cost-map credits, parsed headers, lastStatus per key', async () => {
    await withRig({ credits: 1000, subKeys: ['apv_sbk_one'] }, async ({ sim, client }) => {
      const o = await client.call({ api: 'emailvalidator', params: { email: 'jane@mailinator.com' }, apiKey: sim.apiKey });
      assert.equal(o.kind, 'billed');
      assert.equal(o.httpStatus, 200);
      assert.equal(o.creditsBilled, EMAIL_COST);
      assert.equal((o.data as { isDisposable: boolean }).isDisposable, true);
      assert.equal(o.status?.remainingCredits, 1000 - EMAIL_COST);
      assert.equal(o.status?.creditsUsed, EMAIL_COST);
      assert.equal(o.status?.maxCredits, PLANS.PRO.monthlyCredits);
      assert.equal(o.status?.rateLimitLimit, 6000);
      assert.equal(o.status?.plan, 'PRO');
      assert.equal(o.status?.renewalAt?.getTime(), Math.floor(sim.account().renewalAt.getTime() / 1000) * 1000);
      assert.equal(reactionTo(o), 'complete');
      const o2 = await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_sbk_one' });
      assert.equal(o2.kind, 'billed');
      assert.equal(client.lastStatus(sim.apiKey)?.remainingCredits, 1000 - EMAIL_COST);
      assert.equal(client.lastStatus('apv_sbk_one')?.remainingCredits, 1000 - EMAIL_COST - 1); // shared credits
      assert.equal(client.lastStatus()?.remainingCredits, 1000 - EMAIL_COST - 1);
      assert.equal(client.lastStatus('apv_other'), null);
    });
  });

  test('rate_limited: 429 with credits left, retry-after from the header', async () => {
    await withRig({ ratePerMinute: 60, burst: 1, cooldownSeconds: 7 }, async ({ sim, client }) => {
      assert.equal((await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey })).kind, 'billed');
      const o = await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey });
      assert.equal(o.kind, 'rate_limited');
      assert.equal(o.httpStatus, 429);
      assert.equal(o.retryAfterSeconds, 7);
      assert.equal(o.creditsBilled, 0);
      assert.match(o.message ?? '', /^Rate limit exceeded\. Max 60 requests per minute/);
      assert.ok((o.status?.remainingCredits ?? 0) > 0);
      assert.equal(reactionTo(o), 'put_back');
    });
  });

  for (const mode of ['429', '402', '403'] as const) {
    test(`credits_exhausted in ${mode} mode`, async () => {
      await withRig({ credits: 1, creditsExhaustedMode: mode }, async ({ sim, client }) => {
        // A balance above zero lets a dear call through and goes negative (the documented -4).
        const first = await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: sim.apiKey });
        assert.equal(first.kind, 'billed');
        assert.equal(first.status?.remainingCredits, 1 - EMAIL_COST);
        const o = await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey });
        assert.equal(o.kind, 'credits_exhausted');
        assert.equal(o.httpStatus, Number(mode));
        assert.equal(o.creditsBilled, 0);
        assert.match(o.message ?? '', /^Monthly credit limit reached/);
        assert.equal(o.status?.remainingCredits, -4);
        assert.ok((o.retryAfterSeconds ?? 0) > 86_400, 'waits for the renewal');
        assert.equal(reactionTo(o), 'put_back');
        assert.equal(sim.stats().account.creditsRemaining, -4);
      });
    });
  }

  test('bad_input: missing required params or an invalid value', async () => {
    await withRig({}, async ({ sim, client }) => {
      const o = await client.call({ api: 'exchangerate', params: { currency1: 'USD' }, apiKey: sim.apiKey });
      assert.equal(o.kind, 'bad_input');
      assert.equal(o.httpStatus, 400);
      assert.match(o.message ?? '', /currency2/);
      assert.equal(reactionTo(o), 'fail');
      const v = await client.call({ api: 'dnslookup', params: { domain: 'not a domain' }, apiKey: sim.apiKey });
      assert.equal(v.kind, 'bad_input');
      assert.equal(sim.stats().totals.creditsBilled, 0, '400s are not billed');
    });
  });

  test('key_unusable: unknown key 401, deactivated 401 or 403, out-of-scope 403', async () => {
    await withRig({ subKeys: ['apv_sbk_a', { key: 'apv_sbk_fx', apis: ['exchangerate'] }] }, async ({ sim, client }) => {
      const unknown = await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_nope' });
      assert.deepEqual([unknown.kind, unknown.httpStatus], ['key_unusable', 401]);
      assert.equal(unknown.status?.remainingCredits, null, 'no account headers for a stranger');

      sim.deactivateKey('apv_sbk_a');
      const d401 = await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_sbk_a' });
      assert.deepEqual([d401.kind, d401.httpStatus], ['key_unusable', 401]);
      sim.setConditions({ deactivatedKeyStatus: 403 });
      const d403 = await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_sbk_a' });
      assert.deepEqual([d403.kind, d403.httpStatus], ['key_unusable', 403]);
      assert.equal(reactionTo(d403), 'put_back');
      sim.activateKey('apv_sbk_a');
      assert.equal((await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_sbk_a' })).kind, 'billed');

      const scoped = await client.call({ api: 'dnslookup', params: { domain: 'example.com' }, apiKey: 'apv_sbk_fx' });
      assert.deepEqual([scoped.kind, scoped.httpStatus], ['key_unusable', 403]);
      assert.match(scoped.message ?? '', /not enabled for this API key/);
      assert.equal((await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_sbk_fx' })).kind, 'billed');
    });
  });

  test('unknown_api: 404', async () => {
    await withRig({}, async ({ sim, client }) => {
      const o = await client.call({ api: 'weatherforecast', params: {}, apiKey: sim.apiKey });
      assert.deepEqual([o.kind, o.httpStatus, o.creditsBilled], ['unknown_api', 404, 0]);
      assert.equal(reactionTo(o), 'fail');
    });
  });

  test('server_error: injected error rate, an outage of one API, a refused connection', async () => {
    await withRig({}, async ({ sim, client }) => {
      sim.setConditions({ errorRate: 1, errorStatus: 500 });
      const e = await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey });
      assert.deepEqual([e.kind, e.httpStatus, e.creditsBilled], ['server_error', 500, 0]);
      assert.equal(reactionTo(e), 'retry');
      sim.setConditions({ errorRate: 0, apis: { dnslookup: { outage: 503 } } });
      const out = await client.call({ api: 'dnslookup', params: { domain: 'example.com' }, apiKey: sim.apiKey });
      assert.deepEqual([out.kind, out.httpStatus], ['server_error', 503]);
      assert.equal((await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey })).kind, 'billed', 'other APIs unaffected');
      assert.equal(sim.stats().totals.creditsBilled, 1);
    });
    // Nothing listens on a stopped simulator's port.
    const sim = await startSimulator();
    const url = sim.url;
    await sim.stop();
    const client = createProviderClient({ baseUrl: url, timeoutMs: 1000, catalog: DEFAULT_CATALOG });
    const refused = await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_x' });
    assert.deepEqual([refused.kind, refused.httpStatus, refused.creditsBilled], ['server_error', null, 0]);
    assert.match(refused.message ?? '', /ECONNREFUSED/);
    await client.close();
  });

  test('an unreadable 200 body is a billed, final bad_response', async () => {
    const server: Server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/html', 'x-api-remaining-credits': '10' });
      res.end('<html>maintenance</html>');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = createProviderClient({
      baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
      timeoutMs: 1000,
      catalog: DEFAULT_CATALOG,
    });
    const o = await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: 'apv_x' });
    assert.deepEqual([o.kind, o.httpStatus, o.creditsBilled], ['bad_response', 200, EMAIL_COST]);
    await client.close();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  test('a connection cut mid-answer is a server_error billed per the timeout rule', async () => {
    const server: Server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
      res.write('{"status":"ok",');
      setTimeout(() => res.socket?.destroy(), 20);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
    for (const [timeoutBilling, expected] of [['billed', EMAIL_COST], ['refunded', 0]] as const) {
      const client = createProviderClient({ baseUrl, timeoutMs: 1000, catalog: DEFAULT_CATALOG, timeoutBilling });
      const o = await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: 'apv_x' });
      assert.deepEqual([o.kind, o.httpStatus, o.creditsBilled], ['server_error', null, expected]);
      await client.close();
    }
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  test('the client closes a pooled connection idle past idleSocketMs (before a server would), and a slower answer still arrives', async () => {
    // A server that never closes idle connections itself: only the client's idle timeout can.
    let opened = 0;
    let closed = 0;
    const server: Server = createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
      const body = JSON.stringify({ status: 'ok', error: null, data: { ok: true } });
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(body), req.url?.includes('slow') ? 600 : 0);
    });
    server.on('connection', (socket) => {
      opened++;
      socket.on('close', () => closed++);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = createProviderClient({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, timeoutMs: 2000, catalog: DEFAULT_CATALOG, idleSocketMs: 200 });
    try {
      assert.equal((await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: 'apv_x' })).kind, 'billed');
      // Reused at once: busy for three times the idle timeout, and answered.
      const slow = await client.call({ api: 'emailvalidator', params: { email: 'slow@b.co' }, apiKey: 'apv_x' });
      assert.equal(slow.kind, 'billed', 'an answer slower than the idle timeout is not cut');
      assert.deepEqual([opened, closed], [1, 0], 'one connection, reused');
      for (let i = 0; i < 100 && closed === 0; i++) await new Promise((r) => setTimeout(r, 20));
      assert.deepEqual([opened, closed], [1, 1], 'the idle connection was closed by the client');
      assert.equal((await client.call({ api: 'emailvalidator', params: { email: 'c@b.co' }, apiKey: 'apv_x' })).kind, 'billed');
      assert.equal(opened, 2, 'the next call opened a fresh connection');
    } finally {
      await client.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });

  test('timeout: a hung call, billed by default, refunded on request, and the slot freed', async () => {
    await withRig({ conditions: { apis: { emailvalidator: { hang: { probability: 1, afterMs: null } } } } }, async ({ sim, client }) => {
      const o = await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: sim.apiKey, timeoutMs: 150 });
      assert.deepEqual([o.kind, o.httpStatus, o.creditsBilled, o.status], ['timeout', null, EMAIL_COST, null]);
      assert.equal(reactionTo(o), 'retry');
      const refunding = createProviderClient({ baseUrl: sim.url, timeoutMs: 150, catalog: sim.catalog, timeoutBilling: 'refunded' });
      const r = await refunding.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: sim.apiKey });
      assert.deepEqual([r.kind, r.creditsBilled], ['timeout', 0]);
      await refunding.close();
      // The client hung up: the simulator frees the concurrency slot.
      for (let i = 0; i < 50 && sim.stats().account.inFlight > 0; i++) await new Promise((res) => setTimeout(res, 10));
      assert.equal(sim.stats().account.inFlight, 0);
      assert.equal(sim.stats().account.creditsUsed, 0, 'a call that never answers is not billed');
    });
  });

  test('timeout on a late answer: the provider billed it, which is why the default is "billed"', async () => {
    await withRig({ conditions: { hang: { probability: 1, afterMs: 400 } } }, async ({ sim, client }) => {
      const o = await client.call({ api: 'emailvalidator', params: { email: 'a@b.co' }, apiKey: sim.apiKey, timeoutMs: 100 });
      assert.deepEqual([o.kind, o.creditsBilled], ['timeout', EMAIL_COST]);
      assert.equal(sim.stats().account.creditsUsed, EMAIL_COST);
    });
  });

  test('a caller abort is a timeout-kind outcome', async () => {
    await withRig({ conditions: { hang: { probability: 1, afterMs: null } } }, async ({ sim, client }) => {
      const ac = new AbortController();
      setTimeout(() => ac.abort(), 50);
      const o = await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey, signal: ac.signal });
      assert.equal(o.kind, 'timeout');
      assert.match(o.message ?? '', /aborted/);
    });
  });
});

// ------------------------------------------------------------------ contract: bad answers

describe('client against the simulator: bad answers', () => {
  const DNS = { domain: 'example.com' };
  const DNS_COST = DEFAULT_CATALOG.get('dnslookup')!.creditCost;

  test('every bad-answer kind: NUL and lone surrogates stored as U+FFFD (billed); the others a final bad_response billed like the 200', async () => {
    await withRig({}, async ({ sim, client }) => {
      const expected: Record<string, string> = {
        nul: 'billed',
        'lone-surrogate': 'billed',
        html: 'bad_response',
        'truncated-json': 'bad_response',
        'invalid-utf8': 'bad_response',
        huge: 'bad_response',
      };
      for (const [kind, outcome] of Object.entries(expected)) {
        sim.setConditions({ apis: { dnslookup: { badAnswer: { probability: 1, kind: kind as 'nul', hugeBytes: 2 * 1024 * 1024 } } } });
        const before = sim.stats().totals.creditsBilled;
        const o = await client.call({ api: 'dnslookup', params: DNS, apiKey: sim.apiKey });
        assert.deepEqual([o.kind, o.httpStatus, o.creditsBilled], [outcome, 200, DNS_COST], kind);
        assert.equal(sim.stats().totals.creditsBilled - before, o.creditsBilled, `${kind}: billed as the provider billed`);
        if (outcome === 'billed') {
          const text = JSON.stringify(o.data);
          assert.ok(text.includes('\ufffd') && !/\\u0000|\\ud800/.test(text), `${kind}: ${text.slice(0, 80)}`);
        } else assert.equal(o.data, null);
      }
    });
  });

  test('MAX_RESULT_BYTES: a body over the limit is not read past it; at the limit it is fine', async () => {
    await withRig({ conditions: { badAnswer: { probability: 1, kind: 'huge', hugeBytes: 64 * 1024 } } }, async ({ sim }) => {
      const small = createProviderClient({ baseUrl: sim.url, timeoutMs: 2000, catalog: sim.catalog, maxResultBytes: 64 * 1024 - 1 });
      const o = await small.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey });
      assert.deepEqual([o.kind, o.creditsBilled], ['bad_response', 1]);
      assert.match(o.message ?? '', /over 65535 bytes/);
      await small.close();
      const fits = createProviderClient({ baseUrl: sim.url, timeoutMs: 2000, catalog: sim.catalog, maxResultBytes: 64 * 1024 });
      assert.equal((await fits.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey })).kind, 'billed');
      await fits.close();
    });
    // No content-length (chunked): the client stops reading past the limit and drops the socket.
    let written = 0;
    const server: Server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"status":"ok","error":null,"data":{"pad":"');
      const chunk = 'x'.repeat(16 * 1024);
      const timer = setInterval(() => {
        if (res.destroyed || written > 8 * 1024 * 1024) return clearInterval(timer);
        written += chunk.length;
        res.write(chunk);
      }, 1);
      res.on('close', () => clearInterval(timer));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = createProviderClient({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, timeoutMs: 5000, catalog: DEFAULT_CATALOG, maxResultBytes: 100 * 1024 });
    const o = await client.call({ api: 'exchangerate', params: FX, apiKey: 'apv_x' });
    assert.deepEqual([o.kind, o.creditsBilled], ['bad_response', 1]);
    await new Promise((r) => setTimeout(r, 50));
    assert.ok(written < 2 * 1024 * 1024, `the server stopped being read (${written} bytes written)`);
    await client.close();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  test('batch: value kinds per item (stored as U+FFFD), body kinds fail every item, billed per item', async () => {
    await withRig({}, async ({ sim, client }) => {
      const items: BatchItem[] = [
        { id: 'a', params: { domain: 'a.example.com' } },
        { id: 'b', params: { domain: 'b.example.com' } },
      ];
      sim.setConditions({ badAnswer: { probability: 1, kind: 'nul' } });
      const v = await client.callBatch({ api: 'dnslookup', items, apiKey: sim.apiKey });
      assert.deepEqual(v.items.map((i) => [i.kind, i.creditsBilled]), [['billed', DNS_COST], ['billed', DNS_COST]]);
      assert.ok(v.items.every((i) => JSON.stringify(i.data).includes('\ufffd')));
      for (const kind of ['html', 'truncated-json', 'invalid-utf8'] as const) {
        sim.setConditions({ badAnswer: { probability: 1, kind } });
        const before = sim.stats().totals.creditsBilled;
        const b = await client.callBatch({ api: 'dnslookup', items, apiKey: sim.apiKey });
        assert.deepEqual([b.call.kind, b.call.creditsBilled, b.items.length, reactionTo(b.call)], ['bad_response', 2 * DNS_COST, 0, 'fail'], kind);
        assert.equal(sim.stats().totals.creditsBilled - before, 2 * DNS_COST);
      }
    });
  });
});

// ------------------------------------------------------------------ contract: batch

describe('client against the simulator: batch', () => {
  const emails = (n: number, prefix = 'u'): BatchItem[] =>
    Array.from({ length: n }, (_, i) => ({ id: `${prefix}${i}`, params: { email: `${prefix}${i}@example.org` } }));

  test('per-item 200 / 400 / 429 inside an HTTP 200, in request order', async () => {
    await withRig({ ratePerMinute: 60, burst: 3 }, async ({ sim, client }) => {
      const items: BatchItem[] = [
        { id: 'ok1', params: { email: 'a@gmail.com' } },
        { id: 'bad', params: {} },
        { id: 'ok2', params: { email: 'b@gmail.com' } },
        { id: 'late1', params: { email: 'c@gmail.com' } },
        { id: 'late2', params: { email: 'd@gmail.com' } },
      ];
      const b = await client.callBatch({ api: 'emailvalidator', items, apiKey: sim.apiKey });
      assert.equal(b.call.kind, 'billed');
      assert.equal(b.call.httpStatus, 200);
      assert.deepEqual(
        b.items.map((i) => [i.id, i.kind, i.httpStatus, i.creditsBilled]),
        [
          ['ok1', 'billed', 200, EMAIL_COST],
          ['bad', 'bad_input', 400, 0],
          ['ok2', 'billed', 200, EMAIL_COST],
          ['late1', 'rate_limited', 429, 0],
          ['late2', 'rate_limited', 429, 0],
        ],
      );
      // At 1 token/s the first refused item waits ~1 s for its token, the second ~2 s.
      assert.deepEqual(b.items.slice(3).map((i) => i.retryAfterSeconds), [1, 2]);
      assert.equal(b.call.creditsBilled, 2 * EMAIL_COST, 'the call total is the sum of its items');
      assert.equal(b.call.status?.remainingCredits, PLANS.PRO.monthlyCredits - 2 * EMAIL_COST);
      const s = sim.stats().keys[sim.apiKey]!;
      assert.equal(s.calls, 5, 'each item counts as a call');
      assert.equal(s.httpRequests, 1);
      assert.equal(s.rateLimited, 2);
      assert.deepEqual(s.batchItems, { '200': 2, '400': 1, '429': 2 });
      assert.equal(s.cooldownUntil, null, 'per-item 429s do not start the cooldown by default');
    });
  });

  test('items beyond the credits get per-item 402', async () => {
    await withRig({ credits: 2 }, async ({ sim, client }) => {
      const items = [1, 2, 3, 4].map((i) => ({ id: `fx${i}`, params: FX }));
      const b = await client.callBatch({ api: 'exchangerate', items, apiKey: sim.apiKey });
      assert.deepEqual(
        b.items.map((i) => [i.kind, i.httpStatus]),
        [
          ['billed', 200],
          ['billed', 200],
          ['credits_exhausted', 402],
          ['credits_exhausted', 402],
        ],
      );
      assert.equal(sim.stats().keys[sim.apiKey]!.creditsExhausted, 2);
    });
  });

  test('duplicates bill each time', async () => {
    await withRig({}, async ({ sim, client }) => {
      const items = [1, 2, 3].map((i) => ({ id: `dup${i}`, params: { email: 'same@gmail.com' } }));
      const b = await client.callBatch({ api: 'emailvalidator', items, apiKey: sim.apiKey });
      assert.ok(b.items.every((i) => i.kind === 'billed'));
      assert.equal(sim.stats().account.creditsUsed, 3 * EMAIL_COST);
      // Duplicate ids too: each is answered (in order) and billed.
      const again = await client.callBatch({ api: 'emailvalidator', items: [items[0]!, items[0]!], apiKey: sim.apiKey });
      assert.deepEqual(again.items.map((i) => [i.id, i.kind]), [['dup1', 'billed'], ['dup1', 'billed']]);
      assert.equal(sim.stats().account.creditsUsed, 5 * EMAIL_COST);
    });
  });

  test('0 or more than 200 items is a 400 for the whole batch; 200 is fine', async () => {
    await withRig({ ratePerMinute: null }, async ({ sim, client }) => {
      const tooMany = await client.callBatch({ api: 'emailvalidator', items: emails(201), apiKey: sim.apiKey });
      assert.deepEqual([tooMany.call.kind, tooMany.call.httpStatus, tooMany.items.length], ['bad_input', 400, 0]);
      assert.match(tooMany.call.message ?? '', /1 to 200/);
      const none = await client.callBatch({ api: 'emailvalidator', items: [], apiKey: sim.apiKey });
      assert.deepEqual([none.call.kind, none.call.httpStatus], ['bad_input', 400]);
      const full = await client.callBatch({ api: 'exchangerate', items: Array.from({ length: 200 }, (_, i) => ({ id: `${i}`, params: FX })), apiKey: sim.apiKey });
      assert.equal(full.items.filter((i) => i.kind === 'billed').length, 200);
      assert.equal(sim.stats().account.creditsUsed, 200);
    });
  });

  test('a batch refused as a whole: key in cooldown, unknown key, outage, timeout', async () => {
    await withRig({ ratePerMinute: 60, burst: 1, cooldownSeconds: 30 }, async ({ sim, client }) => {
      await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey });
      assert.equal((await client.call({ api: 'exchangerate', params: FX, apiKey: sim.apiKey })).kind, 'rate_limited');
      const cooling = await client.callBatch({ api: 'exchangerate', items: [{ id: 'a', params: FX }], apiKey: sim.apiKey });
      assert.deepEqual([cooling.call.kind, cooling.call.httpStatus, cooling.call.retryAfterSeconds], ['rate_limited', 429, 30]);
      const stranger = await client.callBatch({ api: 'exchangerate', items: [{ id: 'a', params: FX }], apiKey: 'apv_who' });
      assert.equal(stranger.call.kind, 'key_unusable');
    });
    await withRig({ conditions: { apis: { dnslookup: { outage: 500 } } } }, async ({ sim, client }) => {
      const down = await client.callBatch({ api: 'dnslookup', items: [{ id: 'a', params: { domain: 'example.com' } }], apiKey: sim.apiKey });
      assert.deepEqual([down.call.kind, down.call.httpStatus], ['server_error', 500]);
      sim.setConditions({ apis: { dnslookup: null }, hang: { probability: 1, afterMs: null } });
      const hung = await client.callBatch({ api: 'emailvalidator', items: emails(3), apiKey: sim.apiKey, timeoutMs: 100 });
      assert.deepEqual([hung.call.kind, hung.call.creditsBilled, hung.items.length], ['timeout', 3 * EMAIL_COST, 0]);
    });
  });
});
