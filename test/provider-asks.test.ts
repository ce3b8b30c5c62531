/**
 * The provider's asks are hints with caps: a retry-after (or a reset given as an epoch time) never
 * pauses a window, or delays a put-back job, past RETRY_AFTER_MAX_SECONDS, and a capped ask raises
 * an alert naming the window and the value. The pure readings first, then a stand-in provider over
 * real HTTP that answers every call 429 with `retry-after: 999999999`.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import postgres from 'postgres';
import { parseRetryAfter } from '../src/provider/headers.ts';
import { boundedRetryAfter, classifyBatchItem, classifyResponse } from '../src/provider/classify.ts';
import { creditsStopUntil, MAX_RENEWAL_SECONDS } from '../src/dispatch/retry.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const NOW = Date.parse('2026-12-05T10:00:00Z');

describe("reading the provider's asks (pure)", () => {
  test('delta seconds are read as they are; epoch seconds and milliseconds as times, never as decades', () => {
    assert.equal(parseRetryAfter('30', NOW), 30);
    assert.equal(parseRetryAfter('0.2', NOW), 1);
    assert.equal(parseRetryAfter('999999999', NOW), 999_999_999, 'below the epoch range: a (huge) delay, capped by the caller');
    assert.equal(parseRetryAfter(String(NOW / 1000 + 42), NOW), 42, 'epoch seconds');
    assert.equal(parseRetryAfter(String(NOW + 42_000), NOW), 42, 'epoch milliseconds');
    assert.equal(parseRetryAfter(String(NOW / 1000 - 100), NOW), 0, 'an epoch time in the past: no wait');
    assert.equal(parseRetryAfter('Sat, 05 Dec 2026 10:01:00 GMT', NOW), 60);
  });

  test('an ask beyond the cap is capped and kept for the alert', () => {
    assert.deepEqual(boundedRetryAfter(999_999_999, 300), { retryAfterSeconds: 300, askedRetryAfterSeconds: 999_999_999 });
    assert.deepEqual(boundedRetryAfter(300, 300), { retryAfterSeconds: 300 });
    assert.deepEqual(boundedRetryAfter(null, 300), { retryAfterSeconds: null });
    const outcome = classifyResponse({
      httpStatus: 429, headers: { 'retry-after': '999999999' }, bodyText: '{"status":"error","error":"Rate limit exceeded"}',
      cost: 1, latencyMs: 5, observedAt: new Date(NOW), maxRetryAfterSeconds: 120,
    });
    assert.equal(outcome.kind, 'rate_limited');
    assert.equal(outcome.retryAfterSeconds, 120);
    assert.equal(outcome.askedRetryAfterSeconds, 999_999_999);
    const reset = classifyResponse({
      httpStatus: 429, headers: { 'x-rate-limit-reset': String(NOW / 1000 + 10 * 365 * 86_400) }, bodyText: '{"status":"error","error":"Rate limit exceeded"}',
      cost: 1, latencyMs: 5, observedAt: new Date(NOW),
    });
    assert.equal(reset.retryAfterSeconds, 300, 'a reset ten years out, sent as an epoch time: capped at the default 300 s');
    const item = classifyBatchItem('a', { id: 'a', status: 429, retryAfter: 1e8, error: 'Rate limit exceeded' }, 1, { timeoutBilling: 'billed', maxRetryAfterSeconds: 60 });
    assert.equal(item.retryAfterSeconds, 60);
    assert.equal(item.askedRetryAfterSeconds, 1e8);
  });

  test('a renewal decades away does not stop the account for decades', () => {
    assert.equal(creditsStopUntil(new Date(NOW + 3 * 86_400_000), NOW, 3600).getTime(), NOW + 3 * 86_400_000, 'a renewal within the month is believed');
    assert.equal(creditsStopUntil(new Date(Date.parse('2058-08-13T00:00:00Z')), NOW, 3600).getTime(), NOW + 3_600_000);
    assert.equal(creditsStopUntil(new Date(NOW + (MAX_RENEWAL_SECONDS + 60) * 1000), NOW, 3600).getTime(), NOW + 3_600_000);
    assert.equal(creditsStopUntil(null, NOW, 3600).getTime(), NOW + 3_600_000);
  });
});

describe("a provider asking for a pause of 31 years", () => {
  let provider: Server;
  let calls = 0;
  let t: TestApp;
  let sql: postgres.Sql;
  const CAP = 20;

  before(async () => {
    provider = createServer((req, res) => {
      calls++;
      req.resume();
      const body = JSON.stringify({ status: 'error', error: 'Rate limit exceeded' });
      res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '999999999', 'content-length': Buffer.byteLength(body) }).end(body);
    });
    await new Promise<void>((r) => provider.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(provider.address() as AddressInfo).port}`;
    t = await startTestApp({
      APIVERVE_API_KEY: 'stand-in-key', APIVERVE_BASE_URL: url, APIVERVE_PLAN: 'PRO', APIVERVE_RATE_PER_MINUTE: '600',
      APIVERVE_CONCURRENT_CALLS: '10', RETRY_AFTER_MAX_SECONDS: String(CAP), SWEEP_INTERVAL_MS: '200',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await new Promise<void>((r) => provider.close(() => r()));
  });

  test('the window pauses for at most the cap, the job waits at most the cap, and an alert names the window and the value', async () => {
    const tenant = await t.createTenant('paused', 'PRO');
    const r = await t.gql(`mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }`, { i: { api: 'dnslookup', params: { domain: 'pause.example' } } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    const id = r.body.data.submitJob.job.id as string;
    const paused = await eventually(async () => {
      const [w] = await sql`select extract(epoch from paused_until - now())::float8 as left_s, pause_reason, capped_ask_seconds from windows where paused_until > now() and pause_reason = 'RATE_LIMITED' limit 1`;
      return w ?? null;
    });
    assert.ok(calls >= 1, 'the provider was called');
    assert.ok((paused.left_s as number) <= CAP + 1, `paused ${paused.left_s} s, at most the cap of ${CAP} s`);
    assert.equal(paused.capped_ask_seconds, 999_999_999, 'the ask is kept for the alert');
    const [job] = await sql`select state, extract(epoch from run_after - now())::float8 as wait_s from jobs where id = ${id}`;
    assert.equal(job!.state, 'QUEUED', 'put back, not failed');
    assert.ok((job!.wait_s as number) <= CAP + 1, `the put-back waits ${job!.wait_s} s, at most the cap`);
    const alert = await eventually(async () => {
      const [a] = await sql`select key, message from alerts where cleared_at is null and key like 'PROVIDER_ASK_CAPPED:%'`;
      return a ?? null;
    });
    assert.match(alert.message as string, /999999999/);
    assert.match(alert.key as string, /^PROVIDER_ASK_CAPPED:primary$/);
  });
});
