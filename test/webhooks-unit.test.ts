/**
 * Webhooks' pure parts: the Standard Webhooks signature (the specification's own test vector),
 * which addresses and URLs are refused (the special-use registries address by address), the retry
 * schedule, the disable rule, the event body, the per-tenant budget, sealed secrets, and the
 * errors a tenant reads.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { afterAttempt, eventBody, isDelivered, isPrivateAddress, shouldDisable, urlRefusal, type JobJson } from '../src/webhooks/policy.ts';
import { randomBytes } from 'node:crypto';
import { newWebhookSecret, signatureHeader, signWebhook, verifyWebhook } from '../src/webhooks/signature.ts';
import { RESOLVES_PRIVATE, connectionErrorMessage } from '../src/webhooks/deliver.ts';
import { TenantBudget } from '../src/webhooks/budget.ts';
import { SecretBox, SecretKeyError, keyId, parseSecretKey } from '../src/webhooks/secret-box.ts';

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

test('special-use addresses, range by range (IANA IPv4 and IPv6 special-purpose registries): each edge refused, its public neighbours pass', () => {
  // [address, refused]: the first and last address of each range, and the public addresses beside it.
  const table: Array<[string, boolean]> = [
    ['0.0.0.0', true], ['0.255.255.255', true], ['1.0.0.0', false],
    ['9.255.255.255', false], ['10.0.0.0', true], ['10.255.255.255', true], ['11.0.0.0', false],
    ['100.63.255.255', false], ['100.64.0.0', true], ['100.127.255.255', true], ['100.128.0.0', false],
    ['126.255.255.255', false], ['127.0.0.0', true], ['127.255.255.255', true], ['128.0.0.0', false],
    ['169.253.255.255', false], ['169.254.0.0', true], ['169.254.169.254', true], ['169.254.255.255', true], ['169.255.0.0', false],
    ['172.15.255.255', false], ['172.16.0.0', true], ['172.31.255.255', true], ['172.32.0.0', false],
    ['191.255.255.255', false], ['192.0.0.0', true], ['192.0.0.9', true], ['192.0.0.255', true], ['192.0.1.0', false],
    ['192.0.2.0', true], ['192.0.2.255', true], ['192.0.3.0', false],
    ['192.31.196.0', true], ['192.31.196.255', true], ['192.31.197.0', false],
    ['192.52.193.0', true], ['192.52.193.255', true], ['192.52.194.0', false],
    ['192.88.98.255', false], ['192.88.99.0', true], ['192.88.99.255', true], ['192.88.100.0', false],
    ['192.167.255.255', false], ['192.168.0.0', true], ['192.168.255.255', true], ['192.169.0.0', false],
    ['192.175.48.0', true], ['192.175.48.255', true], ['192.175.49.0', false],
    ['198.17.255.255', false], ['198.18.0.0', true], ['198.19.255.255', true], ['198.20.0.0', false],
    ['198.51.99.255', false], ['198.51.100.0', true], ['198.51.100.255', true], ['198.51.101.0', false],
    ['203.0.112.255', false], ['203.0.113.0', true], ['203.0.113.255', true], ['203.0.114.0', false],
    ['223.255.255.255', false], ['224.0.0.0', true], ['239.255.255.255', true], ['240.0.0.0', true], ['255.255.255.254', true], ['255.255.255.255', true],
    ['8.8.8.8', false], ['1.1.1.1', false],
    // IPv6: unspecified, loopback and the deprecated IPv4-compatible ::/96.
    ['::', true], ['::1', true], ['::2', true], ['::8.8.8.8', true], ['::ffff:ffff', true],
    // IPv4-mapped ::ffff:0:0/96: the IPv4 inside is judged.
    ['::ffff:0.0.0.0', true], ['::ffff:127.0.0.1', true], ['::ffff:7f00:1', true], ['::ffff:10.0.0.1', true], ['::ffff:169.254.169.254', true], ['::ffff:8.8.8.8', false], ['::ffff:1.1.1.1', false],
    // IPv4-translated ::ffff:0:0:0/96: refused whole.
    ['::ffff:0:0:0', true], ['::ffff:0:8.8.8.8', true], ['::ffff:0:ffff:ffff', true],
    // NAT64 64:ff9b::/96: the IPv4 inside is judged; the local-use 64:ff9b:1::/48 is refused whole.
    ['64:ff9b::8.8.8.8', false], ['64:ff9b::a9fe:a9fe', true], ['64:ff9b::10.1.2.3', true], ['64:ff9b::127.0.0.1', true], ['64:ff9b::192.168.0.1', true],
    ['64:ff9b:1::', true], ['64:ff9b:1:ffff:ffff:ffff:ffff:ffff', true], ['64:ff9b:1::8.8.8.8', true],
    // Discard-only 100::/64.
    ['100::', true], ['100::ffff:ffff:ffff:ffff', true],
    // IETF protocol assignments 2001::/23 (Teredo 2001::/32, benchmarking 2001:2::/48, ORCHIDv2 2001:20::/28, anycast 2001:1::1).
    ['2001::', true], ['2001:0:ffff:ffff:ffff:ffff:ffff:ffff', true], ['2001:1::1', true], ['2001:2::1', true], ['2001:20::1', true], ['2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff', true],
    ['2001:200::', false], ['2001:4860:4860::8888', false],
    // Documentation 2001:db8::/32 and 3fff::/20.
    ['2001:db7:ffff:ffff:ffff:ffff:ffff:ffff', false], ['2001:db8::', true], ['2001:db8:ffff:ffff:ffff:ffff:ffff:ffff', true], ['2001:db9::', false],
    ['3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff', false], ['3fff::', true], ['3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff', true], ['3fff:1000::', false],
    // 6to4 2002::/16, refused whole (also when the IPv4 inside is public).
    ['2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff', false], ['2002::', true], ['2002:808:808::1', true], ['2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff', true], ['2003::', false],
    // SRv6 SIDs 5f00::/16 (outside global unicast anyway).
    ['5f00::', true], ['5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff', true],
    // Unique local fc00::/7, link-local fe80::/10, deprecated site-local fec0::/10, multicast ff00::/8.
    ['fc00::', true], ['fd12:3456::1', true], ['fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', true],
    ['fe80::', true], ['fe80::1%eth0', true], ['febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff', true], ['fec0::1', true], ['ff00::', true], ['ff02::1', true], ['ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', true],
    // Outside global unicast 2000::/3: unassigned, refused.
    ['1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', true], ['2000::', false], ['3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff', false], ['4000::', true],
    ['2606:4700:4700::1111', false], ['2a00:1450:4001:80b::200e', false],
    // Not an address at all.
    ['not-an-ip', true], ['', true], ['1.2.3', true],
  ];
  const wrong = table.filter(([a, refused]) => isPrivateAddress(a) !== refused);
  assert.deepEqual(wrong, [], `judged wrongly: ${wrong.map(([a, r]) => `${a} should be ${r ? 'refused' : 'allowed'}`).join(', ')}`);
});

test('a connection error a tenant reads names no address', () => {
  const err = (code: string | undefined, message: string) => Object.assign(new Error(message), code ? { code } : {}) as NodeJS.ErrnoException;
  assert.equal(connectionErrorMessage(err('ECONNREFUSED', 'connect ECONNREFUSED 10.0.0.5:443')), 'ECONNREFUSED: the connection was refused');
  assert.equal(connectionErrorMessage(err('ECONNRESET', 'read ECONNRESET')), 'ECONNRESET: the connection was reset');
  const odd = connectionErrorMessage(err('EWHATEVER', 'something at 192.168.1.20:8443 and [fd00::1]:443 failed'));
  assert.doesNotMatch(odd, /192\.168|fd00/);
  assert.match(odd, /^EWHATEVER: something at <address> and <address> failed$/);
  assert.match(RESOLVES_PRIVATE, /private or special-use/);
});

test('the per-tenant budget: a burst, then the rate; in flight capped; a quiet tenant is not limited', () => {
  const budget = new TenantBudget({ ratePerSecond: 10, burst: 5, concurrency: 3 });
  // Nobody has sent: every tenant may take the burst, bounded by the in-flight cap.
  assert.deepEqual(budget.allowances(0), { fallback: 3, limited: {} });
  for (let i = 0; i < 3; i++) budget.took('a', 0);
  assert.deepEqual(budget.allowances(0).limited, { a: 0 }, 'a has 3 in flight: no more now');
  for (let i = 0; i < 3; i++) budget.done('a');
  assert.deepEqual(budget.allowances(0).limited, { a: 2 }, 'two tokens of five left');
  budget.took('a', 0);
  budget.took('a', 0);
  budget.done('a');
  budget.done('a');
  assert.deepEqual(budget.allowances(0).limited, { a: 0 }, 'out of tokens');
  assert.equal(budget.nextTokenInMs(0), 100, 'one token every 100 ms at 10 a second');
  assert.deepEqual(budget.allowances(250).limited, { a: 2 }, '2.5 tokens after 250 ms');
  assert.equal(budget.allowances(250).fallback, 3, 'another tenant is not held back by a');
  // Full again after the burst's worth of time: forgotten.
  assert.deepEqual(budget.allowances(1_000).limited, {});
  assert.equal(budget.nextTokenInMs(1_000), null);
  // Rate 0: only the in-flight cap.
  const unlimited = new TenantBudget({ ratePerSecond: 0, burst: 5, concurrency: 2 });
  for (let i = 0; i < 100; i++) {
    unlimited.took('b', 0);
    unlimited.done('b');
  }
  assert.deepEqual(unlimited.allowances(0), { fallback: 2, limited: {} });
});

test('secret box: AES-256-GCM sealing, legacy plaintext read as is, key rotation, damage and unknown keys refused', () => {
  const k1 = randomBytes(32);
  const k2 = randomBytes(32);
  const secret = newWebhookSecret();
  const box1 = new SecretBox([k1]);
  const sealed = box1.seal(secret);
  assert.match(sealed, new RegExp(`^v1:${keyId(k1)}:[A-Za-z0-9_-]+:[A-Za-z0-9_-]+:[A-Za-z0-9_-]+$`));
  assert.ok(!sealed.includes('whsec_') && !sealed.includes(secret.slice(6, 20)));
  assert.notEqual(box1.seal(secret), sealed, 'a fresh IV each time');
  assert.equal(box1.open(sealed), secret);
  assert.equal(box1.open(secret), secret, 'a legacy plaintext row reads as is');
  assert.ok(box1.isCurrent(sealed) && !box1.isCurrent(secret));
  // Rotation: the new key seals, the previous still opens.
  const box2 = new SecretBox([k2, k1]);
  assert.equal(box2.open(sealed), secret);
  assert.ok(!box2.isCurrent(sealed));
  assert.equal(box2.open(box2.seal(secret)), secret);
  assert.throws(() => new SecretBox([k2]).open(sealed), SecretKeyError, 'a key that is not configured');
  const parts = sealed.split(':');
  parts[4] = Buffer.from('tampered').toString('base64url');
  assert.throws(() => box1.open(parts.join(':')), SecretKeyError, 'a damaged ciphertext');
  // Keys from configuration: 64 hex digits or base64 of 32 bytes.
  assert.deepEqual(parseSecretKey(k1.toString('hex')), k1);
  assert.deepEqual(parseSecretKey(k1.toString('base64')), k1);
  assert.deepEqual(parseSecretKey(k1.toString('base64url')), k1);
  assert.throws(() => parseSecretKey('too-short'), /32 bytes/);
});
