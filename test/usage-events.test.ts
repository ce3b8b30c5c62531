/**
 * Usage events over real HTTP: one CloudEvents 1.0 event per settled charge,
 * paged in GraphQL and as NDJSON at GET /usage/events, with stable ids and
 * cursors; their sums equal the ledger and usageHistory, a late settlement's
 * correction included; the admin reads every tenant's, a tenant its own.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { ADMIN_TOKEN, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { correctLedger } from '../src/scheduler/sql/ledger.ts';
import { reconcileReservation } from '../src/scheduler/sql/reservations.ts';
import { addUsageCorrection } from '../src/usage/store.ts';
import { decodeUsageCursor, encodeUsageCursor, toCloudEvent } from '../src/usage/events.ts';
import { SluiceError } from '../src/errors.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;
const EVENTS = `query($first: Int, $after: String) { usageEvents(first: $first, after: $after) { edges { cursor node { id type subject credits jobId api cloudEvent } } pageInfo { hasNextPage endCursor } } }`;

interface Cloud {
  specversion: string;
  type: string;
  source: string;
  id: string;
  time: string;
  subject: string;
  datacontenttype: string;
  data: { api: string; credits: number; jobId: string; tenantId: string };
  sluicecursor?: string;
}

describe('usage events (CloudEvents)', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  let a: { id: string; apiKey: string };
  let b: { id: string; apiKey: string };
  const jobsOf: Record<string, string[]> = {};

  const ndjson = async (query: string, token: string | null = ADMIN_TOKEN) => {
    const res = await fetch(`${t.url.replace(/\/graphql$/, '')}/usage/events${query}`, { headers: token ? { authorization: `Bearer ${token}` } : {} });
    const text = await res.text();
    const lines = res.status === 200 ? text.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Cloud) : [];
    return { status: res.status, headers: res.headers, lines, body: res.status === 200 ? null : JSON.parse(text) };
  };
  /** Every GraphQL page of the caller's events, two at a time. */
  const allPages = async (token: string) => {
    const events: { cursor: string; node: { id: string; credits: number; cloudEvent: Cloud } }[] = [];
    let after: string | null = null;
    for (;;) {
      const r: { body: any } = await t.gql(EVENTS, { first: 2, after }, token);
      assert.ok(r.body.data, JSON.stringify(r.body));
      events.push(...r.body.data.usageEvents.edges);
      if (!r.body.data.usageEvents.pageInfo.hasNextPage) return events;
      after = r.body.data.usageEvents.pageInfo.endCursor;
    }
  };
  const ledgerBilled = async (tenantId: string) => Number((await sql`select coalesce(sum(billed), 0)::bigint as b from tenant_ledger where tenant_id = ${tenantId}`)[0]!.b);
  const historyBilled = async (token: string) => {
    const r = await t.gql(`query($f: DateTime!, $t: DateTime!) { me { usageHistory(from: $f, to: $t, granularity: MONTH) { creditsBilled } } }`, { f: new Date(Date.now() - 40 * 86_400_000).toISOString(), t: new Date(Date.now() + 86_400_000).toISOString() }, token);
    return (r.body.data.me.usageHistory as { creditsBilled: number }[]).reduce((s, x) => s + x.creditsBilled, 0);
  };

  before(async () => {
    t = await startTestApp();
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    a = await t.createTenant('metered-a', 'PRO');
    b = await t.createTenant('metered-b', 'PRO');
    for (const [tenant, n] of [[a, 5], [b, 3]] as const) {
      const r = await t.gql(SUBMIT_MANY, { i: { jobs: Array.from({ length: n }, (_, i) => ({ api: 'emailvalidator', params: { email: `u${i}@${tenant.id.slice(0, 8)}.example` } })) } }, tenant.apiKey);
      jobsOf[tenant.id] = r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id);
    }
    // Every job finished and every charge below the horizon: the events' sum reaches the ledger's.
    for (const tenant of [a, b]) {
      await eventually(async () => {
        const r = await t.gql(`{ jobs(first: 50) { edges { node { state } } } }`, {}, tenant.apiKey);
        return r.body.data.jobs.edges.every((e: { node: { state: string } }) => ['SUCCEEDED', 'FAILED'].includes(e.node.state));
      }, 60_000, 200);
      const billed = await ledgerBilled(tenant.id);
      assert.ok(billed > 0, 'the jobs were billed');
      await eventually(async () => (await allPages(tenant.apiKey)).reduce((s, e) => s + e.node.credits, 0) === billed, 30_000, 200);
    }
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  test('GraphQL pages: CloudEvents 1.0, one per charge, subject the tenant, summing to the ledger and usageHistory; the same ids when read again', async () => {
    const events = await allPages(a.apiKey);
    assert.ok(events.length >= 5, `one event per billed call: ${events.length}`);
    const ids = events.map((e) => e.node.id);
    assert.equal(new Set(ids).size, ids.length, 'ids are unique');
    for (const { node } of events) {
      const ce = node.cloudEvent;
      assert.equal(ce.specversion, '1.0');
      assert.equal(ce.type, 'com.sluice.usage.charged');
      assert.equal(ce.source, '/sluice/usage');
      assert.equal(ce.subject, a.id);
      assert.equal(ce.id, node.id);
      assert.ok(!Number.isNaN(Date.parse(ce.time)));
      assert.equal(ce.data.api, 'emailvalidator');
      assert.ok(jobsOf[a.id]!.includes(ce.data.jobId), 'a job of the tenant');
      assert.ok(ce.data.credits > 0);
    }
    const sum = events.reduce((s, e) => s + e.node.credits, 0);
    assert.equal(sum, await ledgerBilled(a.id), 'events sum to the ledger');
    assert.equal(sum, await historyBilled(a.apiKey), 'and to usageHistory');
    const again = await allPages(a.apiKey);
    assert.deepEqual(again.map((e) => e.node.cloudEvent), events.map((e) => e.node.cloudEvent), 'read again: the same events, ids and all');
  });

  test('NDJSON: the admin reads every tenant, a tenant its own; the next cursor continues where the last line ended', async () => {
    const all = await ndjson('?limit=10000');
    assert.equal(all.status, 200);
    assert.match(all.headers.get('content-type')!, /application\/x-ndjson/);
    const subjects = new Set(all.lines.map((l) => l.subject));
    assert.deepEqual([...subjects].sort(), [a.id, b.id].sort());
    for (const tenant of [a, b]) {
      const sum = all.lines.filter((l) => l.subject === tenant.id).reduce((s, l) => s + l.data.credits, 0);
      assert.equal(sum, await ledgerBilled(tenant.id));
    }
    const next = all.headers.get('sluice-next-cursor')!;
    assert.equal(next, all.lines.at(-1)!.sluicecursor, 'the next cursor is the last line\'s');
    assert.match(all.headers.get('link')!, /rel="next"/);
    const none = await ndjson(`?after=${next}`);
    assert.equal(none.lines.length, 0, 'nothing new after the last line');
    assert.equal(none.headers.get('sluice-next-cursor'), next, 'an empty page keeps the cursor');

    // Paging by 3 with each page's header: the same events in the same order.
    const paged: Cloud[] = [];
    let cursor = '';
    for (;;) {
      const page = await ndjson(`?limit=3${cursor ? `&after=${cursor}` : ''}`);
      paged.push(...page.lines);
      if (page.lines.length < 3) break;
      cursor = page.headers.get('sluice-next-cursor')!;
    }
    assert.deepEqual(paged.map((l) => l.id), all.lines.map((l) => l.id));

    const mine = await ndjson('', b.apiKey);
    assert.ok(mine.lines.length > 0 && mine.lines.every((l) => l.subject === b.id), 'a tenant reads only its own');
    const one = await ndjson(`?tenantId=${a.id}`);
    assert.ok(one.lines.every((l) => l.subject === a.id), 'the admin can name one tenant');
  });

  test('a late settlement\'s correction is one more event: the charge is unchanged, the sums still equal the ledger', async () => {
    const before = await ndjson('?limit=10000');
    const charge = before.lines.find((l) => l.subject === a.id)!;
    // What a late settlement does (src/dispatch/late-settlement.ts) to a charge its lease expiry had billed: one credit back.
    await sql.begin(async (tx) => {
      const [r] = await tx`select period_start, billed from reservations where id = ${charge.id} for update`;
      await reconcileReservation(tx, charge.id, Number(r!.billed) - 1);
      await correctLedger(tx, a.id, r!.period_start as Date, -1);
      await addUsageCorrection(tx, { tenantId: a.id, periodStart: r!.period_start as Date, api: 'emailvalidator', jobClass: 'STANDARD', billedDelta: -1, succeededDelta: 0 });
    });
    const fresh = await eventually(async () => {
      const page = await ndjson(`?after=${before.headers.get('sluice-next-cursor')}`);
      return page.lines.length > 0 ? page : null;
    }, 20_000, 100);
    assert.equal(fresh.lines.length, 1);
    const correction = fresh.lines[0]!;
    assert.equal(correction.id, `${charge.id}:corrected`);
    assert.equal(correction.type, 'com.sluice.usage.corrected');
    assert.equal(correction.data.credits, -1);
    assert.equal(correction.subject, a.id);
    const reread = await ndjson('?limit=10000');
    assert.deepEqual(reread.lines.find((l) => l.id === charge.id), charge, 'the charge reads as it was first served');
    const sum = reread.lines.filter((l) => l.subject === a.id).reduce((s, l) => s + l.data.credits, 0);
    assert.equal(sum, await ledgerBilled(a.id));
    assert.equal(sum, await historyBilled(a.apiKey));
  });

  test('bad input and the wrong caller are refused with codes', async () => {
    assert.equal((await ndjson('', null)).status, 401);
    const bad = await ndjson('?after=not-a-cursor');
    assert.equal(bad.status, 400);
    assert.equal(bad.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    assert.equal((await ndjson('?limit=0')).body.errors[0].extensions.code, 'BAD_USER_INPUT');
    const other = await ndjson(`?tenantId=${b.id}`, a.apiKey);
    assert.equal(other.status, 403);
    assert.equal(other.body.errors[0].extensions.code, 'FORBIDDEN');
    const submitOnly = (await t.gql(`mutation($i: CreateApiKeyInput!) { createApiKey(input: $i) { secret } }`, { i: { name: 'ci', scopes: ['SUBMIT'] } }, a.apiKey)).body.data.createApiKey.secret;
    assert.equal((await ndjson('', submitOnly)).status, 403, 'usage events need READ');
    const gqlBad = await t.gql(EVENTS, { first: 2, after: 'garbage' }, a.apiKey);
    assert.equal(gqlBad.body.errors[0].extensions.code, 'BAD_USER_INPUT');
    // Past the page size: refused before execution by the cost limit, or by the resolver.
    const tooMany = await t.gql(EVENTS, { first: 100_000 }, a.apiKey);
    assert.ok(['QUERY_TOO_COSTLY', 'BAD_USER_INPUT'].includes(tooMany.body.errors[0].extensions.code), JSON.stringify(tooMany.body));
    const negative = await t.gql(EVENTS, { first: -1 }, a.apiKey);
    assert.equal(negative.body.errors[0].extensions.code, 'BAD_USER_INPUT');
  });

  test('cursors and events are pure functions of the row', () => {
    const row = { kind: 'charged' as const, reservationId: '0b8f7c8e-1111-4222-8333-444455556666', tenantId: 't', jobId: 'j', attempt: 1, positionMicros: '1796000000123456', time: new Date('2026-12-04T00:00:00Z'), credits: 3, api: 'x', priority: 'BULK', window: 'main', periodStart: new Date('2026-12-01T00:00:00Z') };
    assert.deepEqual(decodeUsageCursor(encodeUsageCursor(row)), { positionMicros: '1796000000123456', id: row.reservationId });
    assert.equal(toCloudEvent({ ...row, kind: 'corrected' }).id, `${row.reservationId}:corrected`);
    assert.throws(() => decodeUsageCursor(Buffer.from(JSON.stringify(['1', 'x; drop table'])).toString('base64url')), (e) => e instanceof SluiceError && e.code === 'BAD_USER_INPUT');
  });
});
