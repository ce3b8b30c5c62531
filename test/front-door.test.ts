/**
 * Front-door hardening against a real server: query limits (depth, cost,
 * aliases, tokens), CSRF prevention, masked unexpected errors and the body
 * limit, each refusal with its HTTP status and code, and normal traffic
 * (GraphiQL, introspection, big bulk submissions in variables, graphql-ws)
 * still passing every limit.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { getIntrospectionQuery } from 'graphql';
import postgres from 'postgres';
import { loadEnv } from '../src/config/env.ts';
import type { Services } from '../src/graphql/context.ts';
import { DEFAULT_QUERY_LIMITS, queryLimitsFromEnv } from '../src/http/hardening.ts';
import { createLogger } from '../src/log.ts';
import { createGraphQL } from '../src/server.ts';
import { collect, startTestApp, type TestApp } from './helpers/app.ts';

const JOB_FIELDS = 'api attempts createdAt creditsBilled finishedAt httpStatus id idempotencyKey params priority result startedAt state error { code message }';
const FULL_PAGE = `jobs(first: 500) { totalCount pageInfo { hasNextPage endCursor } edges { cursor node { ${JOB_FIELDS} } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;

/** `{ __type(name: "Job") { fields { type { ofType { … { name } } } } } }`: valid, public, and as deep as asked. */
function deepIntrospection(ofTypes: number): string {
  return `{ __type(name: "Job") { fields { type { ${'ofType { '.repeat(ofTypes)}name${' }'.repeat(ofTypes)} } } } }`;
}

async function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}

function assertRefused(r: { status: number; body: any }, status: number, code: string): any {
  assert.equal(r.status, status, JSON.stringify(r.body).slice(0, 300));
  assert.equal(r.body.errors?.[0]?.extensions?.code, code, JSON.stringify(r.body).slice(0, 300));
  assert.equal(r.body.data, undefined, 'refused before execution: no data at all');
  return r.body.errors[0];
}

describe('front door (API role)', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api' });
    tenant = await t.createTenant('front-door', 'PRO');
  });
  after(() => t.stop());

  test('normal traffic passes every limit: GraphiQL, its introspection, a full page, 10,000 jobs in variables, graphql-ws', async () => {
    const page = await fetch(t.url, { headers: { accept: 'text/html' } });
    assert.equal(page.status, 200);
    assert.match(await page.text(), /<html/i);

    // GraphiQL's introspection, with every option it may ask for, with a key (INTROSPECTION=keys outside development).
    const query = getIntrospectionQuery({ descriptions: true, specifiedByUrl: true, directiveIsRepeatable: true, schemaDescription: true, inputValueDeprecation: true, oneOf: true });
    const intro = await post(t.url, { query, operationName: 'IntrospectionQuery' }, { authorization: `Bearer ${tenant.apiKey}` });
    assert.equal(intro.status, 200);
    assert.ok(intro.body.data.__schema.types.length > 20);

    // The largest page `jobs` serves, with every field (cost about 41,000 of 50,000).
    const full = await t.gql(`{ ${FULL_PAGE} }`, {}, tenant.apiKey);
    assert.equal(full.status, 200, JSON.stringify(full.body.errors));
    assert.equal(full.body.data.jobs.totalCount, 0);

    // Tokens count the document, not the variables.
    const jobs = Array.from({ length: 10_000 }, (_, i) => ({ api: 'dnslookup', params: { domain: `fd${i}.example` }, priority: 'BULK' }));
    const bulk = await t.gql(SUBMIT_MANY, { i: { jobs } }, tenant.apiKey);
    assert.equal(bulk.status, 200, JSON.stringify(bulk.body.errors));
    assert.equal(bulk.body.data.submitJobs.jobs.length, 10_000);

    // graphql-ws goes through the same plugins and still works.
    const events = await collect<any>(t.ws(tenant.apiKey), `{ me { tenant { id } } }`, {}, (e) => e.length === 1, 10_000);
    assert.equal(events[0].me.tenant.id, tenant.id);
  });

  test('too deep: 400 QUERY_TOO_DEEP, whatever the Accept header', async () => {
    for (const accept of ['application/json', 'application/graphql-response+json']) {
      const r = await post(t.url, { query: deepIntrospection(11) }, { accept, authorization: `Bearer ${tenant.apiKey}` });
      const err = assertRefused(r, 400, 'QUERY_TOO_DEEP');
      assert.equal(err.extensions.limit, DEFAULT_QUERY_LIMITS.maxDepth);
      assert.match(err.message, /depth limit of 12 exceeded, found 15/);
    }
    const ok = await post(t.url, { query: deepIntrospection(7) }, { authorization: `Bearer ${tenant.apiKey}` }); // depth 11
    assert.equal(ok.status, 200);
    assert.equal(ok.body.data.__type.fields.length > 0, true);
  });

  test('too costly: 400 QUERY_TOO_COSTLY (two full pages in one request), even before auth', async () => {
    const two = `{ a: ${FULL_PAGE} b: ${FULL_PAGE} }`;
    assertRefused(await t.gql(two, {}, tenant.apiKey), 400, 'QUERY_TOO_COSTLY');
    const anonymous = assertRefused(await t.gql(two, {}, null), 400, 'QUERY_TOO_COSTLY');
    assert.match(anonymous.message, /Cost limit of 50000 exceeded/);
  });

  test('too many aliases: 400 TOO_MANY_ALIASES', async () => {
    const aliases = (n: number) => `{ ${Array.from({ length: n }, (_, i) => `t${i}: __type(name: "Job") { name }`).join(' ')} }`;
    const err = assertRefused(await t.gql(aliases(31), {}, null), 400, 'TOO_MANY_ALIASES');
    assert.equal(err.extensions.limit, 30);
    const ok = await t.gql(aliases(30), {}, tenant.apiKey);
    assert.equal(ok.status, 200);
    assert.equal(ok.body.data.t29.name, 'Job');
  });

  test('too many tokens: 400 TOO_MANY_TOKENS for bulk input written into the document, over HTTP and graphql-ws', async () => {
    const inline = Array.from({ length: 500 }, (_, i) => `{ api: "dnslookup", params: { domain: "t${i}.example" } }`).join(' ');
    const doc = `mutation { submitJobs(input: { jobs: [${inline}] }) { jobs { id } } }`; // 11 tokens a job: 5,500 in all
    const before = (await t.gql(`{ jobs { totalCount } }`, {}, tenant.apiKey)).body.data.jobs.totalCount;
    for (let i = 0; i < 2; i++) {
      // Twice: the second answer comes from Yoga's parse cache and must be the same refusal.
      const err = assertRefused(await t.gql(doc, {}, tenant.apiKey), 400, 'TOO_MANY_TOKENS');
      assert.equal(err.extensions.limit, 5_000);
      assert.match(err.message, /Token limit of 5000 exceeded/);
    }
    assert.equal((await t.gql(`{ jobs { totalCount } }`, {}, tenant.apiKey)).body.data.jobs.totalCount, before, 'nothing was submitted');

    const sub = `subscription { jobsCompleted { ${Array.from({ length: 5_001 }, () => 'id').join(' ')} } }`;
    await assert.rejects(collect(t.ws(tenant.apiKey), sub, {}, () => true, 10_000), (err: any) => err.errors?.[0]?.extensions?.code === 'TOO_MANY_TOKENS');
    await assert.rejects(
      collect(t.ws(tenant.apiKey), `subscription { jobsCompleted { ${'... on Job { '.repeat(12)}id${' }'.repeat(12)} } }`, {}, () => true, 10_000),
      (err: any) => err.errors?.some((e: any) => e.extensions?.code === 'QUERY_TOO_DEEP'),
    );
  });

  test('CSRF: a GET or a form/text POST without a non-simple header gets 403 CSRF_PREVENTED; JSON POSTs and headed GETs pass', async () => {
    const q = encodeURIComponent('{ __typename }');
    const bare = await fetch(`${t.url}?query=${q}`, { headers: { accept: 'application/json' } });
    assertRefused({ status: bare.status, body: await bare.json() }, 403, 'CSRF_PREVENTED');
    for (const contentType of ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x']) {
      const r = await fetch(t.url, { method: 'POST', headers: { 'content-type': contentType }, body: JSON.stringify({ query: '{ __typename }' }) });
      assertRefused({ status: r.status, body: await r.json() }, 403, 'CSRF_PREVENTED');
    }
    const headed = await fetch(`${t.url}?query=${q}`, { headers: { 'x-graphql-yoga-csrf': '1' } });
    assert.equal(headed.status, 200);
    assert.equal(((await headed.json()) as any).data.__typename, 'Query');
    const authed = await fetch(`${t.url}?query=${encodeURIComponent('{ me { tenant { id } } }')}`, { headers: { authorization: `Bearer ${tenant.apiKey}` } });
    assert.equal(authed.status, 200);
    assert.equal(((await authed.json()) as any).data.me.tenant.id, tenant.id);
    const json = await post(t.url, { query: '{ __typename }' }); // no CSRF header: JSON needs a preflight anyway
    assert.equal(json.status, 200);
  });

  test('an unexpected error (a table gone from under the API) is masked: "Unexpected error.", INTERNAL_SERVER_ERROR, no stack, no SQL', async () => {
    // A real failure caused from outside: me.usage reads tenant_ledger, which this API-only process
    // does not otherwise touch; rename it in the test's own database, then put it back.
    const db = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
    try {
      await db.unsafe('alter table tenant_ledger rename to tenant_ledger_gone');
      const r = await t.gql(`{ me { usage { creditsUsed } } }`, {}, tenant.apiKey);
      const err = r.body.errors?.[0];
      assert.equal(err?.message, 'Unexpected error.', JSON.stringify(r.body));
      assert.equal(err.extensions.code, 'INTERNAL_SERVER_ERROR');
      assert.deepEqual(Object.keys(err.extensions).sort(), ['code'], 'no stack, originalError or anything else');
      assert.deepEqual(err.path, ['me', 'usage']);
      assert.doesNotMatch(JSON.stringify(r.body), /tenant_ledger|relation|stack|at .*\.ts/);
      assert.equal(r.status, 200, 'a resolver error is a GraphQL result, not an HTTP failure');
    } finally {
      await db.unsafe('alter table if exists tenant_ledger_gone rename to tenant_ledger');
      await db.end();
    }
    const healed = await t.gql(`{ me { usage { creditsUsed } } }`, {}, tenant.apiKey);
    assert.equal(healed.body.data.me.usage.creditsUsed, 0);
  });

  test('a body over MAX_BODY_BYTES gets 413 BODY_TOO_LARGE', async () => {
    const r = await fetch(t.url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${tenant.apiKey}` },
      body: ' '.repeat(16 * 1024 * 1024 + 1),
    });
    assertRefused({ status: r.status, body: await r.json() }, 413, 'BODY_TOO_LARGE');
  });

  test('/metrics answers in the Prometheus text format, with GraphQL request counts', async () => {
    await t.gql(`{ tenants { id } }`);
    const r = await fetch(new URL('/metrics', t.url));
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type') ?? '', /text\/plain/);
    const text = await r.text();
    assert.match(text, /^sluice_graphql_requests_total\{operation="query",transport="http"\} \d+/m);
    assert.match(text, /^# TYPE sluice_queue_depth gauge$/m);
  });
});

describe('query limits come from the environment', () => {
  test('the env defaults are the documented defaults', () => {
    assert.deepEqual(queryLimitsFromEnv(loadEnv({})), DEFAULT_QUERY_LIMITS);
  });

  test('MAX_QUERY_DEPTH and MAX_TOKENS change what a real Yoga instance refuses', async () => {
    const env = loadEnv({ MAX_QUERY_DEPTH: '3', MAX_TOKENS: '100', MAX_ALIASES: '1', MAX_QUERY_COST: '10' });
    // These documents are refused (or answered from introspection) before any resolver: no service is ever used.
    const yoga = createGraphQL({ services: {} as Services, maxBodyBytes: 1 << 20, log: createLogger('silent'), development: false, limits: queryLimitsFromEnv(env), introspection: 'public' });
    const ask = async (query: string) => {
      const res = await yoga.fetch('http://localhost/graphql', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ query }) });
      return { status: res.status, body: (await res.json()) as any };
    };
    assert.equal((await ask(`{ __type(name: "Job") { fields { name } } }`)).status, 200);
    assertRefused(await ask(`{ __type(name: "Job") { fields { type { name } } } }`), 400, 'QUERY_TOO_DEEP');
    assertRefused(await ask(`{ ${'__typename '.repeat(101)}}`), 400, 'TOO_MANY_TOKENS');
    assertRefused(await ask(`{ a: __type(name: "Job") { name } b: __type(name: "Job") { name } }`), 400, 'TOO_MANY_ALIASES');
    assertRefused(await ask(`{ __type(name: "Job") { name kind description fields { name description } } }`), 400, 'QUERY_TOO_COSTLY');
  });
});
