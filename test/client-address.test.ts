/**
 * The client's address through trusted proxies (src/http/client-address.ts),
 * the key checksum (src/tenants/keys.ts), the front door's route table and
 * the introspection count: pure functions, examples and properties.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { parse } from 'graphql';
import { clientAddress, forwardedEntries, ipBytes, normalizeAddress, parseForwarded, parseNode, parseTrustProxy, parseXForwardedFor } from '../src/http/client-address.ts';
import { generateTenantKey, keyChecksum, tenantKeyShape } from '../src/tenants/keys.ts';
import { route } from '../src/http/routes.ts';
import { introspectionFieldCount, introspectionRefusal } from '../src/http/introspection.ts';
import { bodyPending } from '../src/http/refusal.ts';
import { contentSecurityPolicy, cspHost } from '../src/http/console.ts';
import { failedAuthRefusal } from '../src/http/front-door.ts';
import { loadEnv, ConfigError } from '../src/config/env.ts';

const ipv4 = fc.tuple(fc.nat(255), fc.nat(255), fc.nat(255), fc.nat(255)).map((p) => p.join('.'));
const ipv6 = fc.ipV6();

test('TRUST_PROXY: none, hop counts, addresses, CIDRs and names; `true` and garbage refused at start', () => {
  for (const v of [undefined, '', ' ', 'false', 'FALSE', '0', 'none']) assert.deepEqual(parseTrustProxy(v), { kind: 'none' }, String(v));
  assert.deepEqual(parseTrustProxy('1'), { kind: 'hops', hops: 1 });
  assert.deepEqual(parseTrustProxy(' 3 '), { kind: 'hops', hops: 3 });
  const r = parseTrustProxy('10.0.0.0/8, 192.168.0.0/16,::1,fd00::/8,loopback');
  assert.equal(r.kind, 'ranges');
  assert.equal(r.kind === 'ranges' && r.ranges.length, 6);
  for (const bad of ['true', '*', '10.0.0.0/33', '10.0.0/8', 'example.com', '1.2.3.4/x', 'fd00::/129', '99']) assert.throws(() => parseTrustProxy(bad), Error, bad);
  assert.throws(() => loadEnv({ TRUST_PROXY: 'true' }), (e: Error) => e instanceof ConfigError && /TRUST_PROXY/.test(e.message));
  assert.equal(loadEnv({ TRUST_PROXY: '10.0.0.0/8' }).TRUST_PROXY, '10.0.0.0/8');
  assert.equal(loadEnv({}).TRUST_PROXY_HEADER, 'x-forwarded-for');
});

test('addresses: IPv4-mapped IPv6 is IPv4, IPv6 lower-cased, zones dropped; bytes of v4, v6 and embedded v4', () => {
  assert.equal(normalizeAddress('::ffff:10.1.2.3'), '10.1.2.3');
  assert.equal(normalizeAddress('2001:DB8::1'), '2001:db8::1');
  assert.equal(normalizeAddress('fe80::1%eth0'), 'fe80::1');
  assert.equal(normalizeAddress('unknown'), null);
  assert.equal(normalizeAddress('_hidden'), null);
  assert.deepEqual([...ipBytes('10.1.2.3')!], [10, 1, 2, 3]);
  assert.deepEqual([...ipBytes('::1')!], [...Array(15).fill(0), 1]);
  assert.deepEqual([...ipBytes('64:ff9b::1.2.3.4')!], [0, 0x64, 0xff, 0x9b, ...Array(8).fill(0), 1, 2, 3, 4]);
});

test('forwarded nodes: ports, brackets, quotes; obfuscated identifiers and garbage are not addresses', () => {
  assert.equal(parseNode('192.0.2.60'), '192.0.2.60');
  assert.equal(parseNode('192.0.2.60:8080'), '192.0.2.60');
  assert.equal(parseNode('"[2001:db8:cafe::17]:4711"'), '2001:db8:cafe::17');
  assert.equal(parseNode('[2001:db8::1]'), '2001:db8::1');
  assert.equal(parseNode('2001:db8::1'), '2001:db8::1'); // X-Forwarded-For writes IPv6 bare
  assert.equal(parseNode('"192.0.2.1:_port"'), '192.0.2.1');
  for (const n of ['_hidden', '"_SEVKISEK"', 'unknown', '', '[1.2.3.4]', '[2001:db8::1]x', '300.1.1.1', 'evil.example', '[2001:db8::1']) assert.equal(parseNode(n), null, n);
});

test('RFC 7239 Forwarded: every element\'s for=, across lines and with quoted commas and semicolons', () => {
  assert.deepEqual(parseForwarded(['for=192.0.2.43, for="[2001:db8:cafe::17]";proto=https']), ['192.0.2.43', '"[2001:db8:cafe::17]"']);
  assert.deepEqual(parseForwarded(['For="_gazonk"', 'for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com']), ['"_gazonk"', '198.51.100.17']);
  assert.deepEqual(parseForwarded(['proto=https;host="a,b;c", for=10.0.0.1']), ['', '10.0.0.1']);
  assert.deepEqual(parseXForwardedFor(['203.0.113.9, 10.0.0.2', '10.0.0.3']), ['203.0.113.9', '10.0.0.2', '10.0.0.3']);
  assert.deepEqual(forwardedEntries({ 'x-forwarded-for': '1.1.1.1, 2.2.2.2' }, 'x-forwarded-for'), ['1.1.1.1', '2.2.2.2']);
  assert.deepEqual(forwardedEntries({ 'x-forwarded-for': '1.1.1.1' }, 'forwarded'), [], 'only the configured header is read');
});

test('clientAddress: walks from the peer leftwards while the hop is trusted, stops at the first untrusted or unreadable entry', () => {
  const none = parseTrustProxy('');
  const one = parseTrustProxy('1');
  const two = parseTrustProxy('2');
  const lan = parseTrustProxy('10.0.0.0/8');
  const xff = ['198.51.100.1', '203.0.113.9', '10.0.0.2'];
  assert.equal(clientAddress('10.0.0.1', xff, none), '10.0.0.1', 'trusting none: the peer');
  assert.equal(clientAddress('10.0.0.1', xff, one), '10.0.0.2', 'one hop: the entry the peer wrote');
  assert.equal(clientAddress('10.0.0.1', xff, two), '203.0.113.9');
  assert.equal(clientAddress('10.0.0.1', xff, lan), '203.0.113.9', 'both 10.x hops are trusted; 203.0.113.9 is not');
  assert.equal(clientAddress('198.51.100.200', xff, lan), '198.51.100.200', 'an untrusted peer: its headers are ignored');
  assert.equal(clientAddress('10.0.0.1', [], one), '10.0.0.1', 'no header: the peer');
  assert.equal(clientAddress('::ffff:10.0.0.1', ['192.0.2.5'], lan), '192.0.2.5', 'a mapped peer is matched as IPv4');
  assert.equal(clientAddress('10.0.0.1', ['192.0.2.5', '_hidden'], lan), '10.0.0.1', 'an obfuscated identifier stops the walk at the proxy that wrote it');
  assert.equal(clientAddress('10.0.0.1', ['spoofed', '10.0.0.7'], lan), '10.0.0.7');
  assert.equal(clientAddress(undefined, xff, one), 'unknown');
  assert.equal(clientAddress('fd00::1', ['2001:db8::5'], parseTrustProxy('fd00::/8')), '2001:db8::5');
});

test('property: with n trusted hops, the client is the n-th address from the peer, and nothing further left can change it', () => {
  fc.assert(
    fc.property(ipv4, fc.array(ipv4, { maxLength: 6 }), fc.array(fc.oneof(ipv4, fc.string({ maxLength: 8 })), { maxLength: 4 }), fc.nat(4), (peer, honest, forged, hops) => {
      const chain = [...honest];
      const got = clientAddress(peer, [...forged, ...chain], { kind: 'hops', hops });
      const addresses = [peer, ...[...chain].reverse()];
      if (hops < addresses.length) assert.equal(got, addresses[hops]);
      // Whatever the client prepends, the answer within the trusted hops is the same.
      if (hops < addresses.length) assert.equal(clientAddress(peer, [...fc.sample(ipv4, 2), ...chain], { kind: 'hops', hops }), got);
    }),
    { numRuns: 300, seed: 7 },
  );
});

test('property: an untrusted peer is always the client, whatever it forwards; parseNode never throws and returns a normalized IP or null', () => {
  const lan = parseTrustProxy('10.0.0.0/8,fd00::/8');
  fc.assert(
    fc.property(ipv4.filter((a) => !a.startsWith('10.')), fc.array(fc.string({ maxLength: 50 }), { maxLength: 5 }), (peer, header) => {
      assert.equal(clientAddress(peer, header, lan), peer);
    }),
    { numRuns: 300, seed: 8 },
  );
  fc.assert(
    fc.property(fc.oneof(fc.string({ maxLength: 60 }), ipv4, ipv6, ipv6.map((a) => `"[${a}]:443"`)), (node) => {
      const r = parseNode(node);
      assert.ok(r === null || normalizeAddress(r) === r, node);
    }),
    { numRuns: 500, seed: 9 },
  );
  fc.assert(
    fc.property(fc.string({ maxLength: 120 }), (value) => {
      parseForwarded([value]); // never throws
    }),
    { numRuns: 300, seed: 10 },
  );
});

test('key checksum: minted keys have the shape and pass; a changed checksum, a changed body or another secret is forged; old keys are legacy', () => {
  const secret = 'installation-secret';
  const key = generateTenantKey(secret);
  assert.match(key, /^slc_[A-Za-z0-9_-]{43}_[A-Za-z0-9_-]{8}$/);
  assert.equal(tenantKeyShape(key, secret), 'checked');
  assert.equal(tenantKeyShape(key, 'another-installation'), 'forged');
  const random = key.slice(4, 47);
  assert.equal(key.slice(48), keyChecksum(random, secret));
  const flipped = key.slice(0, -1) + (key.endsWith('A') ? 'B' : 'A');
  assert.equal(tenantKeyShape(flipped, secret), 'forged');
  const otherBody = `slc_${'x'.repeat(43)}_${key.slice(48)}`;
  assert.equal(tenantKeyShape(otherBody, secret), 'forged');
  assert.equal(tenantKeyShape(`slc_${'a'.repeat(43)}`, secret), 'legacy');
  for (const t of ['slc_nope', 'slc_', '', 'Basic', `slc_${'a'.repeat(44)}`, `slcadm_${'a'.repeat(43)}`, key + 'x']) assert.equal(tenantKeyShape(t, secret), 'forged', t);
  fc.assert(
    fc.property(fc.string({ maxLength: 80 }), (t) => {
      assert.notEqual(tenantKeyShape(t, secret), 'checked', t);
    }),
    { numRuns: 500, seed: 11 },
  );
});

test('routes: the documented doors only; /graphql/ and /x/graphql are not /graphql', () => {
  assert.deepEqual(route('POST', '/graphql'), { kind: 'graphql' });
  assert.deepEqual(route('GET', '/graphql'), { kind: 'graphql' });
  assert.deepEqual(route('GET', '/usage.csv'), { kind: 'usage-csv' });
  assert.deepEqual(route('GET', '/usage/events'), { kind: 'usage-events' });
  assert.deepEqual(route('HEAD', '/healthz'), { kind: 'ops' });
  assert.deepEqual(route('GET', '/console/app.js'), { kind: 'console' });
  assert.deepEqual(route('GET', '/'), { kind: 'root' });
  for (const p of ['/graphql/', '/x/graphql', '/GRAPHQL', '/graphql.json', '/usage', '/consoles', '//graphql', '/nope']) assert.deepEqual(route('POST', p), { kind: 'not-found' }, p);
  assert.equal(route('PUT', '/graphql').kind, 'method-not-allowed');
  assert.equal(route('POST', '/usage.csv').kind, 'method-not-allowed');
  assert.equal(route('POST', '/console/').kind, 'method-not-allowed');
});

test('introspection: aliases and fragments counted; the refusal by mode and caller', () => {
  assert.equal(introspectionFieldCount(parse('{ __typename }')), 0);
  assert.equal(introspectionFieldCount(parse('{ a: __schema { types { name } } b: __schema { types { name } } c: __type(name: "Job") { name } }')), 3);
  assert.equal(introspectionFieldCount(parse('query { ...F ... on Query { __schema { queryType { name } } } } fragment F on Query { x: __schema { types { name } } }')), 2);
  assert.equal(introspectionFieldCount(parse('query A { __schema { types { name } } } query B { __typename }'), 'B'), 0);
  assert.equal(introspectionRefusal('public', 'anonymous', 3), null);
  assert.equal(introspectionRefusal('keys', 'tenant', 3), null);
  assert.equal(introspectionRefusal('keys', 'admin', 1), null);
  assert.equal(introspectionRefusal('keys', 'anonymous', 0), null);
  assert.equal(introspectionRefusal('keys', 'anonymous', 1)?.extensions.code, 'UNAUTHENTICATED');
  assert.equal(introspectionRefusal('off', 'admin', 1)?.extensions.code, 'INTROSPECTION_DISABLED');
  assert.equal(loadEnv({}).INTROSPECTION, undefined, 'unset: decided by NODE_ENV in app.ts');
});

test('refusals: 401 under the budget, 429 with Retry-After past it; a body is pending until it has all come', () => {
  assert.equal(failedAuthRefusal(null).status, 401);
  const past = failedAuthRefusal(17);
  assert.deepEqual([past.status, past.headers['retry-after'], past.error.extensions.code], [429, '17', 'TOO_MANY_AUTH_FAILURES']);
  assert.equal(bodyPending({ complete: false, headers: { 'content-length': '10' } }), true);
  assert.equal(bodyPending({ complete: false, headers: { 'transfer-encoding': 'chunked' } }), true);
  assert.equal(bodyPending({ complete: true, headers: { 'content-length': '10' } }), false);
  assert.equal(bodyPending({ complete: false, headers: {} }), false);
});

test("the console's CSP: connections to its own origin only; a Host header that is not a plain host is left out", () => {
  const csp = contentSecurityPolicy(null, 'sluice.example.com:4000');
  const connect = /connect-src ([^;]*)/.exec(csp)![1]!.split(' ');
  assert.deepEqual(connect, ["'self'", 'ws://sluice.example.com:4000', 'wss://sluice.example.com:4000']);
  assert.doesNotMatch(csp, /connect-src[^;]*\s(ws|wss):(\s|;)/, 'never a bare ws: or wss:');
  assert.equal(cspHost('[::1]:4000'), '[::1]:4000');
  for (const evil of ['evil.example; script-src *', 'a b', 'x.example/path', "'unsafe-inline'", '*.example', '', 'a'.repeat(300)]) {
    assert.equal(cspHost(evil), null, evil);
    assert.match(contentSecurityPolicy(null, evil), /connect-src 'self';/);
  }
});
