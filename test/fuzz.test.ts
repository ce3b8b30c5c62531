/**
 * A fast-check fuzz of the HTTP front door: 1,500 generated requests against a
 * real server (anonymous, tenant and admin; GET and POST; odd content types and
 * Accept headers; malformed JSON; NUL bytes and lone surrogates in every string
 * argument; out-of-range cursors and numbers; deep and unbalanced documents;
 * oversized params). Every answer must be below 500, every error must carry
 * `extensions.code`, and no answer may contain a stack, a file path or SQL.
 * The counts by status and code are printed for the record.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ADMIN_TOKEN, startTestApp, type TestApp } from './helpers/app.ts';

interface FuzzRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: string;
}

const NASTY_STRINGS = ['\u0000', 'a\u0000b', '\ud800', 'x\udc00y', '\uffff', '', ' ', '"', '\\', "'; drop table jobs; --", '${x}', '💥', 'a'.repeat(3000), '%00', '\n'];

const nastyString = fc.oneof(fc.constantFrom(...NASTY_STRINGS), fc.string({ maxLength: 40 }), fc.string({ unit: 'binary', maxLength: 20 }), fc.string({ unit: 'grapheme', maxLength: 10 }));
const nastyNumber = fc.oneof(fc.integer(), fc.constantFrom(0, -1, 2 ** 31, 2 ** 53, -(2 ** 63), 1e308, 1.5), fc.double());
const jsonish: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  value: fc.oneof({ depthSize: 'small', withCrossShrink: true }, nastyString, nastyNumber, fc.boolean(), fc.constant(null), fc.array(tie('value'), { maxLength: 4 }), fc.dictionary(nastyString, tie('value'), { maxKeys: 4 })),
})).value;

const bigCursor = (micros: string, id: string) => Buffer.from(JSON.stringify([micros, id])).toString('base64url');

/** Operations with variables, each given generated (often hostile) values. */
function operations(tenantId: string): fc.Arbitrary<{ query: string; variables: unknown }> {
  const id = fc.oneof(fc.uuid(), nastyString, fc.constant(tenantId));
  const params = fc.oneof(
    jsonish,
    fc.dictionary(nastyString, nastyString, { maxKeys: 6 }),
    fc.constant(Object.fromEntries(Array.from({ length: 400 }, (_, i) => [`k${i}`, i]))),
    fc.constant({ domain: 'x'.repeat(2000), other: 'y'.repeat(2000), more: 'z'.repeat(2000), again: 'w'.repeat(2000), last: 'v'.repeat(2000), five: 'u'.repeat(2000), six: 't'.repeat(2000), seven: 's'.repeat(2000), eight: 'r'.repeat(2000) }),
    fc.record({ domain: nastyString }),
  );
  const job = fc.record({ api: fc.oneof(fc.constantFrom('dnslookup', 'exchangerate', 'emailvalidator'), nastyString), params, priority: fc.oneof(fc.constantFrom('BULK', 'STANDARD', 'INTERACTIVE'), nastyString, fc.constant(null)), idempotencyKey: fc.oneof(nastyString, fc.constant(null)) }, { requiredKeys: ['api'] });
  const cursor = fc.oneof(nastyString, fc.constant(bigCursor('99999999999999999999', '00000000-0000-0000-0000-000000000000')), fc.constant(bigCursor('9223372036854775808', '00000000-0000-0000-0000-000000000000')), fc.constant(bigCursor('1', 'not-a-uuid')), fc.constant(bigCursor('1', '\u0000')));
  return fc.oneof(
    fc.record({ query: fc.constant('mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }'), variables: fc.oneof(fc.record({ i: job }), fc.record({ i: jsonish }), jsonish) }),
    fc.record({ query: fc.constant('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }'), variables: fc.record({ i: fc.oneof(fc.record({ jobs: fc.array(job, { maxLength: 3 }) }), jsonish) }) }),
    fc.record({ query: fc.constant('query($f: Int, $a: String, $s: JobFilter) { jobs(first: $f, after: $a, filter: $s) { totalCount edges { cursor } } }'), variables: fc.record({ f: fc.oneof(nastyNumber, nastyString), a: cursor, s: fc.oneof(fc.record({ api: nastyString }), jsonish) }) }),
    fc.record({ query: fc.constant('query($id: ID!) { job(id: $id) { id state } }'), variables: fc.record({ id: fc.oneof(id, fc.constant(null)) }) }),
    fc.record({ query: fc.constant('mutation($id: ID!) { cancelJob(id: $id) { id } }'), variables: fc.oneof(fc.record({ id }), fc.constant({})) }),
    fc.record({ query: fc.constant('mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } } }'), variables: fc.record({ i: fc.oneof(fc.record({ name: nastyString, tier: fc.oneof(fc.constantFrom('FREE', 'PRO'), nastyString) }), jsonish) }) }),
    fc.record({ query: fc.constant('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }'), variables: fc.record({ i: fc.record({ id: fc.uuid(), name: nastyString, weight: nastyNumber, monthlyQuota: nastyNumber }) }) }),
    fc.record({ query: fc.constant('mutation($w: String) { resumeDispatch(window: $w) { alerts { key } } }'), variables: fc.record({ w: nastyString }) }),
    fc.record({ query: fc.constant('{ me { usage { quota } queues { depth } } apis { name } }'), variables: fc.constant({}) }),
    fc.record({ query: fc.constant('{ system { windows { name } } tenants { id } }'), variables: fc.constant({}) }),
    // Literals in the document instead of variables.
    fc.record({ query: nastyString.map((s) => `mutation { submitJob(input: { api: "dnslookup", params: { domain: ${JSON.stringify(s)} }, idempotencyKey: ${JSON.stringify(s)} }) { job { id } } }`), variables: fc.constant({}) }),
    fc.record({ query: nastyString.map((s) => `{ jobs(first: 1, filter: { api: ${JSON.stringify(s)} }) { totalCount } }`), variables: fc.constant({}) }),
  );
}

const documents = fc.oneof(
  nastyString,
  fc.integer({ min: 1, max: 4000 }).map((n) => '{a:'.repeat(n)),
  fc.integer({ min: 1, max: 3000 }).map((n) => '{'.repeat(n) + '}'.repeat(n)),
  fc.integer({ min: 1, max: 2000 }).map((n) => `{ jobs(filter: ${'['.repeat(n)}) { totalCount } }`),
  fc.integer({ min: 1, max: 200 }).map((n) => `{ ${'me { tenant { '.repeat(n)} id ${'} } '.repeat(n)} }`),
  fc.constant('query { __typename }'),
  fc.constant('subscription { jobsCompleted { id } }'),
);

function requests(t: TestApp, keys: { tenant: string; tenantId: string }): fc.Arbitrary<FuzzRequest> {
  const auth = fc.constantFrom<Record<string, string>>({}, { authorization: `Bearer ${keys.tenant}` }, { authorization: `Bearer ${ADMIN_TOKEN}` }, { authorization: 'Bearer slc_nope' }, { authorization: 'Basic abc' }, { authorization: 'Bearer \u00ff' });
  const accept = fc.constantFrom<Record<string, string>>({}, { accept: 'application/json' }, { accept: 'application/graphql-response+json' }, { accept: 'text/html' }, { accept: 'image/png' }, { accept: 'text/event-stream' }, { accept: '*/*' });
  const contentType = fc.constantFrom('application/json', 'application/json; charset=utf-8', 'text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data', 'application/xml', 'application/graphql', '');
  const body = fc.oneof(
    { weight: 6, arbitrary: operations(keys.tenantId).map((op) => JSON.stringify(op)) },
    documents.map((q) => JSON.stringify({ query: q })),
    fc.record({ query: fc.oneof(documents, nastyString, fc.constant(null)), variables: jsonish, extensions: jsonish, operationName: fc.oneof(nastyString, fc.constant(null)) }).map((x) => JSON.stringify(x)),
    nastyString,
    fc.constantFrom('{', '[]', 'null', '"query"', '{"query": 1}', '{"query": "{ __typename }", "variables": "x"}', '{"query": "{ __typename }", "variables": [1]}'),
  );
  // Mostly well-formed JSON POSTs, so most requests reach validation and the resolvers; the rest probe the edges.
  const weighted = <T,>(usual: T, odd: fc.Arbitrary<T>) => fc.oneof({ weight: 3, arbitrary: fc.constant(usual) }, { weight: 1, arbitrary: odd });
  const post = fc
    .record({
      method: weighted('POST', fc.constantFrom('PUT', 'PATCH', 'DELETE')),
      path: weighted('/graphql', fc.constantFrom('/graphql/', '/nope')),
      auth,
      accept: weighted<Record<string, string>>({}, accept),
      contentType: weighted('application/json', contentType),
      body,
    })
    .map(
    ({ method, path, auth, accept, contentType, body }): FuzzRequest => ({
      method,
      path,
      headers: { ...auth, ...accept, ...(contentType ? { 'content-type': contentType } : {}), 'x-graphql-yoga-csrf': '1' },
      body,
    }),
  );
  const getParams = fc.record(
    {
      query: fc.oneof(documents, operations(keys.tenantId).map((o) => o.query), nastyString),
      variables: fc.oneof(nastyString, jsonish.map((v) => JSON.stringify(v)), fc.constantFrom('{', '{"a":', '[1,2]', '"x"', '1')),
      extensions: fc.oneof(nastyString, jsonish.map((v) => JSON.stringify(v)), fc.constantFrom('{', '{"persistedQuery":', 'null')),
      operationName: nastyString,
    },
    { requiredKeys: [] },
  );
  const get = fc.record({ auth, accept, params: getParams, csrf: fc.boolean() }).map(({ auth, accept, params, csrf }): FuzzRequest => {
    const search = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      // URLSearchParams would replace lone surrogates; keep them by percent-encoding the UTF-16 code units ourselves.
      search.set(k, v as string);
    }
    return { method: 'GET', path: `/graphql?${search.toString()}`, headers: { ...auth, ...accept, ...(csrf ? { 'x-graphql-yoga-csrf': '1' } : {}) } };
  });
  // Well-typed operations sent with the right credential, hostile values in typed positions: these reach the resolvers and the database.
  const job = fc.record({ api: fc.oneof(fc.constant('dnslookup'), nastyString), params: fc.oneof(fc.record({ domain: nastyString }), fc.dictionary(nastyString, nastyString, { maxKeys: 3 }), fc.constant(Object.fromEntries(Array.from({ length: 400 }, (_, i) => [`k${i}`, i])))), idempotencyKey: nastyString });
  const cursorArb = fc.oneof(nastyString, fc.constantFrom(bigCursor('99999999999999999999', '00000000-0000-0000-0000-000000000000'), bigCursor('9223372036854775808', '00000000-0000-0000-0000-000000000000'), bigCursor('1', 'nope'), bigCursor('-1', '00000000-0000-0000-0000-000000000000')));
  const typed = fc.oneof(
    fc.record({ key: fc.constant(keys.tenant), query: fc.constant('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }'), variables: fc.record({ i: fc.record({ jobs: fc.array(job, { minLength: 1, maxLength: 3 }) }) }) }),
    fc.record({ key: fc.constant(keys.tenant), query: fc.constant('query($a: String, $api: String) { jobs(first: 5, after: $a, filter: { api: $api }) { totalCount } }'), variables: fc.record({ a: cursorArb, api: nastyString }) }),
    fc.record({ key: fc.constant(ADMIN_TOKEN), query: fc.constant('mutation($n: String!) { createTenant(input: { name: $n, tier: FREE }) { tenant { id } } }'), variables: fc.record({ n: nastyString }) }),
    fc.record({ key: fc.constant(ADMIN_TOKEN), query: fc.constant('mutation($w: String) { resumeDispatch(window: $w) { alerts { key } } }'), variables: fc.record({ w: nastyString }) }),
    fc.record({ key: fc.constant(keys.tenant), query: nastyString.map((s) => `mutation { submitJob(input: { api: "dnslookup", params: { domain: ${JSON.stringify(s)} } }) { job { id } } }`), variables: fc.constant({}) }),
  ).map((x): FuzzRequest => ({ method: 'POST', path: '/graphql', headers: { 'content-type': 'application/json', authorization: `Bearer ${x.key}` }, body: JSON.stringify({ query: x.query, variables: x.variables }) }));
  return fc.oneof({ weight: 4, arbitrary: post }, { weight: 2, arbitrary: get }, { weight: 4, arbitrary: typed });
}

/** What must never reach a client: stack frames, file paths, SQL or Postgres error text. */
const LEAKS = [/\bat [\w.<>]+ \(/, /\.ts:\d+/, /node_modules/, /\/work\//, /\bselect\b.*\bfrom\b/i, /\binsert into\b/i, /\bupdate \w+ set\b/i, /syntax error at or near/i, /invalid byte sequence/i, /unsupported Unicode escape/i, /relation "/i, /violates .* constraint/i, /"stack"/];

describe('fuzzing the front door', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };

  before(async () => {
    // Every generated wrong key is a failed authentication from 127.0.0.1: the per-address budget
    // (tested in transport.test.ts) would answer the rest 429, and the fuzz is about what comes after it.
    t = await startTestApp({ SLUICE_ROLE: 'api', NODE_ENV: 'production', AUTH_FAILURES_PER_MINUTE: '1000000' });
    tenant = await t.createTenant('fuzzed', 'PRO');
  });
  after(() => t.stop());

  test('1,500 generated requests: no 5xx, every error coded, nothing leaked', async () => {
    const samples = fc.sample(requests(t, { tenant: tenant.apiKey, tenantId: tenant.id }), { numRuns: 1500, seed: 20261202 });
    const base = new URL(t.url).origin;
    const byStatus: Record<string, number> = {};
    const byCode: Record<string, number> = {};
    const failures: string[] = [];
    // The GraphiQL page is one static document (rendered once per process), so a request cannot put
    // anything of its own into it; its bundled editor code mentions node_modules, "stack" and SQL-like
    // words, so it is compared whole instead of scanned for leaks.
    const graphiql = await (await fetch(`${base}/graphql`, { headers: { accept: 'text/html' } })).text();
    assert.match(graphiql, /<title>Sluice<\/title>/);
    let next = 0;
    const worker = async () => {
      while (next < samples.length) {
        const r = samples[next++]!;
        const res = await fetch(base + r.path, { method: r.method, headers: r.headers, ...(r.body !== undefined && r.method !== 'GET' ? { body: r.body } : {}) });
        const text = await res.text();
        byStatus[res.status] = (byStatus[res.status] ?? 0) + 1;
        const where = `${r.method} ${r.path.slice(0, 120)} ${JSON.stringify(r.headers)} ${(r.body ?? '').slice(0, 160)} -> ${res.status} ${text.slice(0, 300)}`;
        if (res.status >= 500) failures.push(`5xx: ${where}`);
        const html = (res.headers.get('content-type') ?? '').includes('text/html');
        if (html) {
          if (res.status !== 200) failures.push(`HTML error page: ${where}`);
          else if (text !== graphiql) failures.push(`an HTML page other than GraphiQL: ${where}`);
          continue;
        }
        for (const leak of LEAKS) if (leak.test(text)) failures.push(`leak ${leak}: ${where}`);
        if (res.status === 404 && r.path.startsWith('/nope')) {
          byCode['(404 outside /graphql)'] = (byCode['(404 outside /graphql)'] ?? 0) + 1;
          continue;
        }
        let body: any;
        try {
          body = JSON.parse(text.startsWith('data:') || text.startsWith(':') || text.startsWith('event:') ? (text.match(/^data: (.*)$/m)?.[1] ?? '{}') : text);
        } catch {
          failures.push(`not JSON: ${where}`);
          continue;
        }
        const errors: any[] = Array.isArray(body?.errors) ? body.errors : [];
        if (res.status >= 400 && errors.length === 0) failures.push(`error status without errors: ${where}`);
        for (const e of errors) {
          const code = e?.extensions?.code;
          if (typeof code !== 'string') failures.push(`uncoded error: ${where}`);
          byCode[code ?? '(none)'] = (byCode[code ?? '(none)'] ?? 0) + 1;
          if (process.env.FUZZ_DEBUG && (byCode[code] ?? 0) <= 4) console.log(code, res.status, r.method, String(e?.message).slice(0, 150));
        }
        if (errors.length === 0) byCode['(no error)'] = (byCode['(no error)'] ?? 0) + 1;
      }
    };
    await Promise.all(Array.from({ length: 6 }, worker));
    console.log(JSON.stringify({ fuzz: { requests: samples.length, byStatus, byCode } }));
    assert.ok(samples.length >= 1000);
    // One example of each kind of bad answer (kind and status), so a failure shows every distinct problem.
    const kinds = new Map<string, string>();
    for (const f of failures) kinds.set(`${f.split(':')[0]} ${f.match(/-> (\d+)/)?.[1]}`, f);
    assert.deepEqual([...kinds.values()].slice(0, 20), [], `${failures.length} bad answers`);
    // The server is still healthy after all that.
    const ok = await t.gql('{ me { tenant { id } } }', {}, tenant.apiKey);
    assert.equal(ok.body.data.me.tenant.id, tenant.id);
  });
});
