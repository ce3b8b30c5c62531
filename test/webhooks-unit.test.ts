/**
 * Webhooks' pure parts: the Standard Webhooks signature (the specification's own test vector),
 * which addresses and URLs are refused, the retry schedule, the disable rule, the event body.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { afterAttempt, eventBody, isDelivered, isPrivateAddress, shouldDisable, urlRefusal, type JobJson } from '../src/webhooks/policy.ts';
import { newWebhookSecret, signatureHeader, signWebhook, verifyWebhook } from '../src/webhooks/signature.ts';

test('signature: the Standard Webhooks test vector, several signatures, verification', () => {
  // From the specification's reference libraries (standard-webhooks, test vectors).
  const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
  const sig = signWebhook(secret, 'msg_p5jXN8AQM9LWM0D4loKWxJek', 1614265330, '{"test": 2432232314}');
  assert.equal(sig, 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=');
  const other = newWebhookSecret();
  assert.match(other, /^whsec_[A-Za-z0-9+/]{43}=$/);
  const header = signatureHeader([other, secret], 'msg_1', 1700000000, '{}');
  assert.equal(header.split(' ').length, 2);
  assert.ok(verifyWebhook(secret, 'msg_1', 1700000000, '{}', header), 'the old secret still verifies during the overlap');
  assert.ok(verifyWebhook(other, 'msg_1', 1700000000, '{}', header));
  assert.ok(!verifyWebhook(secret, 'msg_1', 1700000001, '{}', header), 'another timestamp does not verify');
  assert.ok(!verifyWebhook(secret, 'msg_1', 1700000000, '{ }', header), 'another body does not verify');
});

test('private, loopback, link-local and reserved addresses are refused; public ones pass', () => {
  for (const a of ['127.0.0.1', '10.1.2.3', '172.16.0.1', '172.31.255.255', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0', '224.0.0.1', '255.255.255.255',
    '::1', '::', 'fe80::1', 'fc00::1', 'fd12:3456::1', 'ff02::1', '::ffff:127.0.0.1', '::ffff:7f00:1', '::ffff:10.0.0.1', '64:ff9b::a9fe:a9fe', 'not-an-ip']) {
    assert.equal(isPrivateAddress(a), true, a);
  }
  for (const a of ['8.8.8.8', '1.1.1.1', '172.32.0.1', '192.169.0.1', '2606:4700:4700::1111', '::ffff:8.8.8.8', '2a00:1450:4001:80b::200e']) {
    assert.equal(isPrivateAddress(a), false, a);
  }
});

test('URLs: https only, no literal private address, unless WEBHOOK_ALLOW_PRIVATE', () => {
  assert.equal(urlRefusal('https://hooks.example.com/sluice', false), null);
  assert.match(urlRefusal('http://hooks.example.com/', false)!, /https/);
  assert.match(urlRefusal('https://127.0.0.1/x', false)!, /private/);
  assert.match(urlRefusal('https://[::1]:8443/x', false)!, /private/);
  assert.match(urlRefusal('https://[::ffff:192.168.0.1]/', false)!, /private/);
  assert.match(urlRefusal('ftp://example.com/', false)!, /https/);
  assert.match(urlRefusal('not a url', false)!, /valid/);
  assert.match(urlRefusal('https://user:pw@example.com/', false)!, /credentials/);
  assert.match(urlRefusal('https://example.com/' + 'a'.repeat(3000), false)!, /at most/);
  assert.equal(urlRefusal('http://127.0.0.1:3000/hook', true), null);
  // A name is judged when each delivery resolves it, not here.
  assert.equal(urlRefusal('https://localhost/', false), null);
});

test('retries double from the base up to the cap, for about a day, then give up', () => {
  const policy = { baseMs: 5_000, maxMs: 3_600_000, retryForMs: 86_400_000 };
  assert.deepEqual(afterAttempt(true, 1, 0, policy), { status: 'SUCCEEDED' });
  assert.deepEqual(afterAttempt(false, 1, 0, policy), { status: 'PENDING', retryInMs: 5_000 });
  assert.deepEqual(afterAttempt(false, 3, 0, policy), { status: 'PENDING', retryInMs: 20_000 });
  assert.deepEqual(afterAttempt(false, 40, 0, policy), { status: 'PENDING', retryInMs: 3_600_000 });
  assert.deepEqual(afterAttempt(false, 30, 86_000_000, policy), { status: 'FAILED' });
  // The whole schedule: attempts until given up span about a day.
  let age = 0;
  let attempts = 0;
  for (;;) {
    attempts++;
    const next = afterAttempt(false, attempts, age, policy);
    if (next.status !== 'PENDING') break;
    age += next.retryInMs;
  }
  assert.ok(age > 80_000_000 && age <= 86_400_000, `retried for ${age} ms`);
  assert.ok(attempts > 20 && attempts < 40, `${attempts} attempts`);
});

test('disable rule and what counts as delivered', () => {
  const since = new Date('2026-01-01T00:00:00Z');
  assert.equal(shouldDisable(since, new Date('2026-01-01T23:59:59Z'), 86_400_000), false);
  assert.equal(shouldDisable(since, new Date('2026-01-02T00:00:00Z'), 86_400_000), true);
  assert.equal(isDelivered(200), true);
  assert.equal(isDelivered(204), true);
  assert.equal(isDelivered(301), false);
  assert.equal(isDelivered(500), false);
});

test('the event body: type, timestamp (the finish), the job; result only when succeeded', () => {
  const job: JobJson = {
    id: '0b3c3f5e-0000-4000-8000-000000000001', api: 'dnslookup', params: { domain: 'x' }, priority: 'STANDARD', state: 'FAILED', idempotencyKey: null, attempts: 1,
    createdAt: '2026-01-01T00:00:00.000001+00:00', startedAt: '2026-01-01T00:00:01+00:00', finishedAt: '2026-01-01T00:00:02.5+00:00',
    result: { ignored: true }, errorCode: 'UPSTREAM_400', errorMessage: 'Invalid domain', httpStatus: 400, creditsBilled: 0,
  };
  const body = JSON.parse(eventBody('JOB_FAILED', job, new Date(0)));
  assert.equal(body.type, 'job.failed');
  assert.equal(body.timestamp, '2026-01-01T00:00:02.500Z');
  assert.equal(body.data.id, job.id);
  assert.equal(body.data.result, null);
  assert.deepEqual(body.data.error, { code: 'UPSTREAM_400', message: 'Invalid domain' });
  assert.equal(body.data.creditsBilled, 0);
  assert.equal(eventBody('JOB_FAILED', job, new Date(0)), eventBody('JOB_FAILED', job, new Date(1)), 'the same row gives the same bytes');
});
