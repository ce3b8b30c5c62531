/**
 * Limits that hold: the query cost counts `first`/`last` passed as
 * variables; open subscriptions are capped per tenant and per process; a
 * subscriber that does not keep up is closed (4408) instead of buffering
 * without bound.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { parse, print } from 'graphql';
import postgres from 'postgres';
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { inlinePageSizes } from '../src/http/hardening.ts';
import { subscriptionRefusal } from '../src/events/subscriptions.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

describe('cost of page sizes given as variables', () => {
  test('inlinePageSizes puts the variable (or its default) where the cost rule reads literals', () => {
    const doc = parse('query($n: Int, $m: Int = 7) { jobs(first: $n) { totalCount } b: jobs(last: $m) { totalCount } c: jobs(first: 3) { totalCount } }');
    const out = print(inlinePageSizes(doc, { n: 500 }));
    assert.match(out, /jobs\(first: 500\)/);
    assert.match(out, /jobs\(last: 7\)/);
    assert.match(out, /jobs\(first: 3\)/);
    // A variable that is not an integer stays as it is (graphql-js refuses it later).
    assert.match(print(inlinePageSizes(doc, { n: 'x' })), /jobs\(first: \$n\)/);
  });

  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api' });
    tenant = await t.createTenant('coster');
  });
  after(() => t.stop());

  const aliases = (n: number) =>
    `query($n: Int!) { ${Array.from({ length: n }, (_, i) => `a${i}: jobs(first: $n) { edges { node { id estimatedStartAt } } }`).join(' ')} }`;

  test('30 aliases of jobs(first: $n) cost as much as the literal would', async () => {
    const literal = await t.gql(aliases(30).replace('($n: Int!)', '').replaceAll('$n', '500'), {}, tenant.apiKey);
    assert.equal(literal.status, 400);
    assert.equal(literal.body.errors[0].extensions.code, 'QUERY_TOO_COSTLY');
    const viaVariable = await t.gql(aliases(30), { n: 500 }, tenant.apiKey);
    assert.equal(viaVariable.status, 400, JSON.stringify(viaVariable.body));
    assert.equal(viaVariable.body.errors[0].extensions.code, 'QUERY_TOO_COSTLY');
    assert.equal(viaVariable.body.data, undefined);
    // The same document with a small page is cheap and runs.
    const small = await t.gql(aliases(30), { n: 1 }, tenant.apiKey);
    assert.equal(small.status, 200, JSON.stringify(small.body));
    assert.deepEqual(small.body.data.a0.edges, []);
  });
});

describe('subscription caps and slow consumers', () => {
  test('the refusal rule: process cap first, then the tenant cap; admins only count toward the process', () => {
    const caps = { perTenant: 2, perProcess: 3 };
    assert.equal(subscriptionRefusal({ tenant: 1, process: 2 }, caps, true), null);
    assert.equal(subscriptionRefusal({ tenant: 2, process: 2 }, caps, true)?.extensions.scope, 'TENANT');
    assert.equal(subscriptionRefusal({ tenant: 0, process: 3 }, caps, true)?.extensions.scope, 'PROCESS');
    assert.equal(subscriptionRefusal({ tenant: 0, process: 2 }, caps, false), null);
  });

  let t: TestApp;
  let a: { id: string; apiKey: string };
  let b: { id: string; apiKey: string };
  before(async () => {
    t = await startTestApp({ MAX_SUBSCRIPTIONS_PER_TENANT: '2', MAX_SUBSCRIPTIONS_PER_PROCESS: '3', SUBSCRIPTION_BUFFER_MAX: '5' });
    a = await t.createTenant('subs-a');
    b = await t.createTenant('subs-b');
  });
  after(() => t.stop());

  /** Starts a subscription; resolves 'open' once it is registered server side (first next) or with the error code. */
  function open(client: Client, query: string): { result: Promise<string>; dispose: () => void } {
    let dispose = () => {};
    const result = new Promise<string>((resolve) => {
      dispose = client.subscribe(
        { query },
        {
          next: () => resolve('open'),
          error: (err) => resolve(Array.isArray(err) ? String(err[0]?.extensions?.code) : 'socket-error'),
          complete: () => resolve('complete'),
        },
      );
    });
    return { result, dispose };
  }

  test('a subscriber that falls SUBSCRIPTION_BUFFER_MAX events behind is closed with 4408', async () => {
    // One finished job of tenant a, so jobsCompleted events resolve to a row.
    const sub = await t.gql(`mutation { submitJob(input: {api: "dnslookup", params: {domain: "example.com"}}) { job { id } } }`, {}, a.apiKey);
    const jobId = sub.body.data.submitJob.job.id;
    await eventually(async () => (await t.gql(`query($id: ID!) { job(id: $id) { state } }`, { id: jobId }, a.apiKey)).body.data.job.state === 'SUCCEEDED');

    let closeCode: number | null = null;
    const client = createClient({
      url: t.url.replace(/^http/, 'ws'),
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${a.apiKey}` },
      retryAttempts: 0,
      lazy: true,
      on: { closed: (e) => (closeCode = (e as { code: number }).code) },
    });
    client.subscribe({ query: 'subscription { jobsCompleted { id } }' }, { next: () => {}, error: () => {}, complete: () => {} });
    // Bursts of 500 events for this tenant, far more than the subscriber's buffer of 5, until the
    // server gives up on it (the first burst may come before the subscription is registered).
    const sql = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
    try {
      await eventually(async () => {
        // Distinct payloads: Postgres delivers identical notifications of one transaction once.
        await sql`select pg_notify('sluice_job_events', json_build_object('jobId', ${jobId}::text, 'tenantId', ${a.id}::text, 'state', 'SUCCEEDED', 'seq', i)::text)
                  from generate_series(1, 500) i`;
        await new Promise((r) => setTimeout(r, 200));
        return closeCode !== null;
      }, 30_000);
    } finally {
      await sql.end();
    }
    assert.equal(closeCode, 4408);
    await client.dispose();
    // The server is fine, and the tenant can subscribe again.
    const ok = await t.gql('{ me { tenant { id } } }', {}, a.apiKey);
    assert.equal(ok.body.data.me.tenant.id, a.id);
  });
  test('a tenant holds at most MAX_SUBSCRIPTIONS_PER_TENANT, a process MAX_SUBSCRIPTIONS_PER_PROCESS', async () => {
    // tenantUsage pushes its first value at once, so "open" means the server counted it.
    const usage = 'subscription { tenantUsage { usage { quota } } }';
    const ca = t.ws(a.apiKey);
    const s1 = open(ca, usage);
    const s2 = open(ca, usage);
    assert.equal(await s1.result, 'open');
    assert.equal(await s2.result, 'open');
    const s3 = open(ca, usage);
    assert.equal(await s3.result, 'TOO_MANY_SUBSCRIPTIONS');
    // Another tenant still has room, until the process is full (3).
    const cb = t.ws(b.apiKey);
    const b1 = open(cb, usage);
    assert.equal(await b1.result, 'open');
    const b2 = open(cb, usage);
    assert.equal(await b2.result, 'TOO_MANY_SUBSCRIPTIONS');
    // Completing one frees its place.
    s1.dispose();
    await eventually(async () => {
      const again = open(cb, usage);
      const r = await again.result;
      if (r !== 'open') return false;
      again.dispose();
      return true;
    });
    s2.dispose();
    b1.dispose();
  });

});
