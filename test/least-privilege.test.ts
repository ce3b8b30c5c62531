/**
 * Least privilege beyond the scope table, over real HTTP and graphql-ws:
 * - keys never outlive or outrank their maker: an hour-long key cannot mint an
 *   endless one, a key in its rotation overlap mints only keys ending with it,
 *   a key cannot grant a scope it lacks; the admin token is not bounded;
 * - the usage doors (GET /usage.csv, GET /usage/events) check READ and are
 *   charged to the request budget with RateLimit headers (429 THROTTLED over it);
 * - malformed ids are BAD_USER_INPUT on every id argument, never a 500;
 * - a caller's mistake (malformed id, unknown job subscription, forbidden field,
 *   a variable of the wrong type) is never logged above info level.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { ADMIN_TOKEN, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { boundByMaker, checkNewKey } from '../src/tenants/api-keys.ts';
import { SluiceError } from '../src/errors.ts';
import type { Logger } from '../src/log.ts';

const CREATE = `mutation($i: CreateApiKeyInput!) { createApiKey(input: $i) { key { id scopes expiresAt } secret expiresAtShortened } }`;
const MALFORMED = '------------------------------------';
const OVERLAP_SECONDS = 5;

describe('keys never outlive or outrank their maker (pure rule)', () => {
  const now = new Date('2030-01-01T00:00:00Z');
  const hour = now.getTime() + 3_600_000;
  const code = (fn: () => unknown) => {
    try {
      fn();
    } catch (err) {
      return err instanceof SluiceError ? [err.code, err.extensions.field] : ['not a SluiceError'];
    }
    return null;
  };

  test('scopes are a subset of the maker\'s: a key cannot grant a scope it lacks (FORBIDDEN, field scopes)', () => {
    assert.deepEqual(code(() => boundByMaker({ scopes: ['SUBMIT'], expiresAt: null }, { scopes: ['READ'], expiresAtMs: null }, now)), ['FORBIDDEN', 'scopes']);
    assert.deepEqual(code(() => boundByMaker({ scopes: ['SUBMIT', 'READ'], expiresAt: null }, { scopes: ['SUBMIT'], expiresAtMs: null }, now)), ['FORBIDDEN', 'scopes']);
    assert.deepEqual(boundByMaker({ scopes: ['READ'], expiresAt: null }, { scopes: ['SUBMIT', 'READ'], expiresAtMs: null }, now), { expiresAt: null, expiresAtShortened: false });
    assert.deepEqual(boundByMaker({ scopes: ['SUBMIT', 'READ'], expiresAt: null }, null, now), { expiresAt: null, expiresAtShortened: false }, 'the admin token is not bounded');
  });

  test("expiresAt is at most the maker's: none or a later one is cut to it, an earlier one kept", () => {
    const maker = { scopes: ['SUBMIT', 'READ'] as const, expiresAtMs: hour };
    assert.deepEqual(boundByMaker({ scopes: ['READ'], expiresAt: null }, maker, now), { expiresAt: new Date(hour), expiresAtShortened: true });
    assert.deepEqual(boundByMaker({ scopes: ['READ'], expiresAt: new Date(hour + 1) }, maker, now), { expiresAt: new Date(hour), expiresAtShortened: true });
    assert.deepEqual(boundByMaker({ scopes: ['READ'], expiresAt: new Date(hour) }, maker, now), { expiresAt: new Date(hour), expiresAtShortened: false });
    assert.deepEqual(boundByMaker({ scopes: ['READ'], expiresAt: new Date(hour - 1) }, maker, now), { expiresAt: new Date(hour - 1), expiresAtShortened: false });
    assert.deepEqual(code(() => boundByMaker({ scopes: ['READ'], expiresAt: null }, { ...maker, expiresAtMs: now.getTime() }, now)), ['UNAUTHENTICATED', undefined]);
    // checkNewKey (the input's shape) and the bound compose: the checked input is what is bounded.
    const checked = checkNewKey({ name: 'ci', scopes: ['READ'] }, now);
    assert.equal(boundByMaker(checked, maker, now).expiresAtShortened, true);
  });
});

describe('least privilege over HTTP and graphql-ws', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  const lines: { level: number; msg: string; time: number }[] = [];

  before(async () => {
    const sink = new Writable({ write: (chunk, _e, cb) => void (lines.push(JSON.parse(String(chunk))), cb()) });
    const log = pino({ level: 'debug' }, sink) as unknown as Logger;
    t = await startTestApp({ SLUICE_ROLE: 'api', KEY_ROTATION_OVERLAP_SECONDS: String(OVERLAP_SECONDS) }, {}, { log });
    tenant = await t.createTenant('bounded', 'ENTERPRISE');
  });
  after(() => t.stop());

  const keysOf = async (tenantId: string) =>
    (await t.gql(`query($t: ID!) { apiKeys(tenantId: $t) { id name expiresAt revokedAt } }`, { t: tenantId })).body.data.apiKeys as { id: string; name: string; expiresAt: string | null }[];

  test('an hour-long key cannot mint an endless key, nor one that outlives it; the admin token can', async () => {
    const hourAt = new Date(Date.now() + 3_600_000).toISOString();
    const hour = (await t.gql(CREATE, { i: { name: 'hour', scopes: ['SUBMIT', 'READ'], expiresAt: hourAt } }, tenant.apiKey)).body.data.createApiKey;
    assert.equal(hour.key.expiresAt, hourAt);
    assert.equal(hour.expiresAtShortened, false, 'the endless default key does not shorten it');

    const endless = await t.gql(CREATE, { i: { name: 'endless', scopes: ['READ'] } }, hour.secret);
    assert.equal(endless.status, 200);
    assert.equal(endless.body.data.createApiKey.key.expiresAt, hourAt, 'asked without an end, it ends with its maker');
    assert.equal(endless.body.data.createApiKey.expiresAtShortened, true);
    const later = (await t.gql(CREATE, { i: { name: 'later', scopes: ['READ'], expiresAt: new Date(Date.now() + 7_200_000).toISOString() } }, hour.secret)).body.data.createApiKey;
    assert.equal(later.key.expiresAt, hourAt);
    assert.equal(later.expiresAtShortened, true);
    const soonerAt = new Date(Date.now() + 1_800_000).toISOString();
    const sooner = (await t.gql(CREATE, { i: { name: 'sooner', scopes: ['READ'], expiresAt: soonerAt } }, hour.secret)).body.data.createApiKey;
    assert.deepEqual([sooner.key.expiresAt, sooner.expiresAtShortened], [soonerAt, false]);
    // What is stored is what was answered.
    const stored = await keysOf(tenant.id);
    assert.equal(stored.find((k) => k.id === endless.body.data.createApiKey.key.id)?.expiresAt, hourAt);

    const byAdmin = (await t.gql(CREATE, { i: { tenantId: tenant.id, name: 'ops', scopes: ['SUBMIT', 'READ'] } })).body.data.createApiKey;
    assert.deepEqual([byAdmin.key.expiresAt, byAdmin.expiresAtShortened], [null, false]);
  });

  test('after rotateTenantKey an old key in its overlap mints only keys ending at the overlap\'s end, and every one of them stops then', async () => {
    const rotating = await t.createTenant('rotating', 'PRO');
    const hourKey = (await t.gql(CREATE, { i: { name: 'hour', scopes: ['SUBMIT', 'READ'], expiresAt: new Date(Date.now() + 3_600_000).toISOString() } }, rotating.apiKey)).body.data.createApiKey;
    // Both old keys are in the key cache now (they just authenticated).
    assert.equal((await t.gql('{ me { tenant { id } } }', {}, rotating.apiKey)).status, 200);
    const rotated = await t.gql(`mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }`, { id: rotating.id });
    const newKey = rotated.body.data.rotateTenantKey.apiKey as string;
    const overlapEnd = (await keysOf(rotating.id)).find((k) => k.name === 'default')!.expiresAt!;
    assert.ok(Math.abs(Date.parse(overlapEnd) - Date.now()) <= OVERLAP_SECONDS * 1000 + 1000, overlapEnd);

    const fromDefault = await t.gql(CREATE, { i: { name: 'escape', scopes: ['SUBMIT', 'READ'] } }, rotating.apiKey);
    assert.equal(fromDefault.body.data.createApiKey.key.expiresAt, overlapEnd, JSON.stringify(fromDefault.body));
    assert.equal(fromDefault.body.data.createApiKey.expiresAtShortened, true);
    const fromHour = await t.gql(CREATE, { i: { name: 'escape-2', scopes: ['READ'], expiresAt: new Date(Date.now() + 600_000).toISOString() } }, hourKey.secret);
    const hourEnd = (await keysOf(rotating.id)).find((k) => k.id === hourKey.key.id)!.expiresAt!;
    assert.equal(hourEnd, overlapEnd, "the rotation gave the hour key the overlap's end too");
    assert.equal(fromHour.body.data.createApiKey.key.expiresAt, overlapEnd);
    const fromNew = (await t.gql(CREATE, { i: { name: 'fresh', scopes: ['READ'] } }, newKey)).body.data.createApiKey;
    assert.deepEqual([fromNew.key.expiresAt, fromNew.expiresAtShortened], [null, false], 'the new key is endless, and so may be its keys');

    // The cached grants of the old keys carry the overlap's end: once it passes, the old keys and
    // everything they minted are refused, while the new key works.
    const escaped = fromDefault.body.data.createApiKey.secret as string;
    for (const key of [rotating.apiKey, hourKey.secret, escaped]) {
      await eventually(async () => (await t.gql('{ me { tenant { id } } }', {}, key)).status === 401, (OVERLAP_SECONDS + 10) * 1000, 250);
    }
    assert.ok(Date.now() >= Date.parse(overlapEnd));
    assert.equal((await t.gql('{ me { tenant { id } } }', {}, newKey)).status, 200);
  });

  test('GET /usage.csv and GET /usage/events need READ (403 FORBIDDEN, coded) and are charged to the request budget with RateLimit headers', async () => {
    const small = await t.createTenant('metered', 'PRO');
    // A bucket of 60 points restored at 1 a second: one CSV (52 points) fits, a second does not.
    const upd = await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { requestBurst requestRate } }`, { i: { id: small.id, requestBurst: 60, requestRate: 1 } });
    assert.deepEqual(upd.body.data.updateTenant, { requestBurst: 60, requestRate: 1 });
    const key = async (scopes: string[]) => (await t.gql(CREATE, { i: { name: scopes.join('+'), scopes } }, small.apiKey)).body.data.createApiKey.secret as string;
    const submitOnly = await key(['SUBMIT']);
    const readOnly = await key(['READ']);
    const csv = `${t.url.replace(/\/graphql$/, '')}/usage.csv?from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z`;
    const events = `${t.url.replace(/\/graphql$/, '')}/usage/events?limit=1000`;
    const get = (url: string, token: string) => fetch(url, { headers: { authorization: `Bearer ${token}` } });

    for (const url of [csv, events]) {
      const refused = await get(url, submitOnly);
      assert.equal(refused.status, 403, url);
      const body = (await refused.json()) as { errors: { message: string; extensions: { code: string } }[] };
      assert.equal(body.errors[0]!.extensions.code, 'FORBIDDEN');
      assert.match(body.errors[0]!.message, /READ scope/);
    }

    const first = await get(csv, readOnly);
    assert.equal(first.status, 200, await first.clone().text());
    assert.match(first.headers.get('content-type') ?? '', /text\/csv/);
    assert.equal(first.headers.get('ratelimit-policy'), '"budget";q=60;w=60');
    const left = Number(/r=(\d+)/.exec(first.headers.get('ratelimit') ?? '')?.[1]);
    assert.ok(left <= 60 - 52 + 2, `a download costs 52 points: ${first.headers.get('ratelimit')}`);
    await first.text();

    const second = await get(csv, readOnly);
    assert.equal(second.status, 429);
    assert.ok(Number(second.headers.get('retry-after')) >= 1, 'Retry-After');
    const throttled = (await second.json()) as { errors: { extensions: { code: string; retryable: boolean; retryAfterSeconds: number } }[] };
    assert.equal(throttled.errors[0]!.extensions.code, 'THROTTLED');
    assert.equal(throttled.errors[0]!.extensions.retryable, true);
    assert.equal(throttled.errors[0]!.extensions.retryAfterSeconds, Number(second.headers.get('retry-after')));

    // The same bucket pays for the events route (11 points for 1,000) and for GraphQL: both are refused now.
    const eventsRefused = await get(events, readOnly);
    assert.equal(eventsRefused.status, 429);
    assert.equal(((await eventsRefused.json()) as { errors: { extensions: { code: string } }[] }).errors[0]!.extensions.code, 'THROTTLED');
    // Once the bucket holds 11 points again, a page of events is served and charged.
    const served = await eventually(async () => {
      const r = await get(events, readOnly);
      if (r.status === 200) return r;
      await r.text();
      return null;
    }, 30_000, 1_000);
    assert.match(served.headers.get('content-type') ?? '', /x-ndjson/);
    assert.match(served.headers.get('ratelimit') ?? '', /^"budget";r=\d+;t=\d+$/);
    await served.text();

    // The admin token is not charged: no RateLimit headers.
    const admin = await fetch(`${csv}&tenantId=${small.id}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    assert.equal(admin.status, 200);
    assert.equal(admin.headers.get('ratelimit'), null);
    await admin.text();
  });

  test('a malformed id is BAD_USER_INPUT naming its argument on every id argument, never a 500; a caller\'s mistakes are not logged above info', async () => {
    const from = lines.length;
    const bad = async (query: string, variables: Record<string, unknown>, token: string | null | undefined, field: string) => {
      const r = await t.gql(query, variables, token);
      assert.equal(r.body.errors?.[0]?.extensions?.code, 'BAD_USER_INPUT', `${query}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.errors[0].extensions.field, field, query);
    };
    const own = tenant.apiKey;
    await bad(`query($id: ID!) { job(id: $id) { id } }`, { id: MALFORMED }, own, 'id');
    await bad(`query { job(id: "${MALFORMED}") { id } }`, {}, own, 'id');
    await bad(`mutation($id: ID!) { cancelJob(id: $id) { id } }`, { id: MALFORMED }, own, 'id');
    await bad(`mutation($id: ID!) { retryJob(id: $id) { id } }`, { id: 'nope' }, own, 'id');
    await bad(`mutation($id: ID!) { revokeApiKey(id: $id) { id } }`, { id: MALFORMED }, own, 'id');
    await bad(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: MALFORMED }, own, 'id');
    await bad(`mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, { id: MALFORMED }, own, 'id');
    await bad(`mutation($id: ID!) { updateWebhookEndpoint(input: {id: $id, enabled: true}) { id } }`, { id: MALFORMED }, own, 'input.id');
    await bad(`query($id: ID!) { webhookDeliveries(filter: {jobId: $id}) { edges { node { id } } } }`, { id: MALFORMED }, own, 'filter.jobId');
    await bad(`query($id: ID) { webhookEndpoints(tenantId: $id) { id } }`, { id: MALFORMED }, own, 'tenantId');
    await bad(`query($id: ID) { usageEvents(tenantId: $id) { edges { cursor } } }`, { id: MALFORMED }, own, 'tenantId');
    await bad(`query($id: ID) { apiKeys(tenantId: $id) { id } }`, { id: MALFORMED }, undefined, 'tenantId');
    await bad(`query($id: ID!) { tenantRow(id: $id) { tenant { id } } }`, { id: MALFORMED }, undefined, 'id');
    await bad(`mutation($id: ID!) { suspendTenant(id: $id) { id } }`, { id: MALFORMED }, undefined, 'id');
    await bad(`query($id: ID!) { tenantJobs(tenantId: $id) { edges { node { id } } } }`, { id: MALFORMED }, undefined, 'tenantId');
    await bad(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: MALFORMED } }, undefined, 'input.id');
    // The plain HTTP routes too (the admin names the tenant).
    const base = t.url.replace(/\/graphql$/, '');
    for (const path of [`/usage.csv?from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z&tenantId=${MALFORMED}`, `/usage/events?tenantId=${MALFORMED}`]) {
      const r = await fetch(`${base}${path}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
      assert.equal(r.status, 400, path);
      const body = (await r.json()) as { errors: { extensions: { code: string; field: string } }[] };
      assert.deepEqual([body.errors[0]!.extensions.code, body.errors[0]!.extensions.field], ['BAD_USER_INPUT', 'tenantId'], path);
    }

    // Over graphql-ws: a malformed id, and an unknown job, are coded errors for the operation.
    const client = t.ws(own);
    const first = (query: string, variables: Record<string, unknown>) =>
      new Promise<unknown>((resolve) => {
        const stop = client.subscribe({ query, variables }, { next: (v) => (stop(), resolve(v.errors)), error: (e) => resolve(e), complete: () => resolve('complete') });
      });
    const malformed = (await first(`subscription($id: ID!) { jobUpdated(id: $id) { id } }`, { id: MALFORMED })) as { extensions?: { code?: string } }[];
    assert.equal(malformed?.[0]?.extensions?.code, 'BAD_USER_INPUT', JSON.stringify(malformed));
    const unknown = (await first(`subscription($id: ID!) { jobUpdated(id: $id) { id } }`, { id: '00000000-0000-4000-8000-000000000000' })) as { extensions?: { code?: string } }[];
    assert.equal(unknown?.[0]?.extensions?.code, 'NOT_FOUND', JSON.stringify(unknown));

    // A forbidden field, and a variable of the wrong type: refused with their codes.
    const submitOnly = (await t.gql(CREATE, { i: { name: 'narrow', scopes: ['SUBMIT'] } }, own)).body.data.createApiKey.secret as string;
    const job = (await t.gql(`mutation { submitJob(input: {api: "dnslookup", params: {domain: "a.example"}}) { job { id } } }`, {}, own)).body.data.submitJob.job.id as string;
    const forbidden = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { params } }`, { id: job }, submitOnly);
    assert.equal(forbidden.body.errors[0].extensions.code, 'FORBIDDEN');
    const wrongType = await t.gql(`query($from: DateTime!, $to: DateTime!) { me { usageHistory(from: $from, to: $to) { start } } }`, { from: 'yesterday', to: 'today' }, own);
    assert.ok(wrongType.body.errors?.[0]?.extensions?.code, 'a coded refusal');
    assert.notEqual(wrongType.body.errors[0].extensions.code, 'INTERNAL_SERVER_ERROR');

    await new Promise((r) => setTimeout(r, 200)); // the last lines are written
    const loud = lines.slice(from).filter((l) => l.level > 30);
    assert.deepEqual(loud.map((l) => `${l.level} ${l.msg}`), [], 'no line above info for a caller\'s mistakes');
  });
});
