/**
 * Tenant lifecycle: a suspended tenant's submissions are refused
 * (TENANT_SUSPENDED, 403), its queued jobs wait with reason SUSPENDED and run
 * when it is resumed; deleteTenant revokes its keys, closes its open
 * subscriptions (4401), cancels its waiting jobs without billing them, drops
 * its pg-boss queues and rows, and keeps its usage history.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const jobsOf = (n: number, prefix: string) => ({ i: { jobs: Array.from({ length: n }, (_, k) => ({ api: 'dnslookup', params: { domain: `${prefix}${k}.example.com` }, priority: 'STANDARD' })) } });

describe('tenant lifecycle', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  before(async () => {
    // A slow pace (about one call a second) so jobs are still queued when the tenant is suspended.
    t = await startTestApp({ APIVERVE_RATE_PER_MINUTE: '60', PACER_BURST: '1' });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  const counts = async (tenantId: string) => {
    const [r] = await sql`
      select count(*) filter (where state = 'RUNNING')::int as running,
        count(*) filter (where state in ('SUCCEEDED', 'FAILED'))::int as finished,
        count(*) filter (where state = 'QUEUED')::int as queued
      from jobs where tenant_id = ${tenantId}`;
    return r as unknown as { running: number; finished: number; queued: number };
  };

  test('suspend holds queued jobs (SUSPENDED) and refuses submissions; resume runs them', async () => {
    const a = await t.createTenant('suspended-co');
    const submitted = await t.gql(SUBMIT_MANY, jobsOf(8, 'a'), a.apiKey);
    assert.equal(submitted.body.data.submitJobs.jobs.length, 8);
    const s = await t.gql(`mutation($id: ID!) { suspendTenant(id: $id) { id suspendedAt } }`, { id: a.id });
    assert.ok(s.body.data.suspendTenant.suspendedAt);

    const refused = await t.gql(SUBMIT_MANY, jobsOf(1, 'late'), a.apiKey);
    assert.equal(refused.status, 403);
    assert.equal(refused.body.errors[0].extensions.code, 'TENANT_SUSPENDED');
    assert.equal(refused.body.data, null);

    // Calls already in flight finish; nothing new starts.
    await eventually(async () => (await counts(a.id)).running === 0);
    const held = await counts(a.id);
    assert.ok(held.queued > 0, `some jobs should still be queued: ${JSON.stringify(held)}`);
    const me = await t.gql(`{ me { queues { priority depth running waitReason } } }`, {}, a.apiKey);
    const standard = me.body.data.me.queues.find((q: { priority: string }) => q.priority === 'STANDARD');
    assert.equal(standard.depth, held.queued);
    assert.equal(standard.waitReason, 'SUSPENDED');
    // A bounded look: during two seconds (two paced calls' worth) nothing of this tenant is dispatched.
    await new Promise((r) => setTimeout(r, 2_000));
    assert.deepEqual(await counts(a.id), held);

    const r = await t.gql(`mutation($id: ID!) { resumeTenant(id: $id) { suspendedAt } }`, { id: a.id });
    assert.equal(r.body.data.resumeTenant.suspendedAt, null);
    await eventually(async () => (await counts(a.id)).finished === 8, 60_000);
    // What the tenant reads agrees with the rows: nothing running or waiting once all eight ended.
    const end = await counts(a.id);
    const after = (await t.gql(`{ me { queues { priority depth running } } }`, {}, a.apiKey)).body.data.me.queues;
    assert.deepEqual(after.find((q: { priority: string }) => q.priority === 'STANDARD'), { priority: 'STANDARD', depth: end.queued, running: end.running });
    const again = await t.gql(SUBMIT_MANY, jobsOf(1, 'back'), a.apiKey);
    assert.equal(again.status, 200);
  });

  test('delete: keys refused, subscriptions closed, waiting jobs cancelled unbilled, queues and rows gone, history kept', async () => {
    const b = await t.createTenant('deleted-co');
    let closeCode: number | null = null;
    const completed: string[] = [];
    const client = createClient({
      url: t.url.replace(/^http/, 'ws'),
      webSocketImpl: WebSocket,
      connectionParams: { authorization: `Bearer ${b.apiKey}` },
      retryAttempts: 0,
      lazy: true,
      on: { closed: (e) => (closeCode = (e as { code: number }).code) },
    });
    client.subscribe<{ jobsCompleted: { id: string; state: string } }>(
      { query: 'subscription { jobsCompleted { id state } }' },
      { next: (v) => completed.push(v.data!.jobsCompleted.state), error: () => {}, complete: () => {} },
    );
    await t.gql(SUBMIT_MANY, jobsOf(10, 'b'), b.apiKey);
    await eventually(async () => (await counts(b.id)).finished >= 1, 60_000);
    // Freeze it to read what was billed: suspended, and the calls in flight settled.
    await t.gql(`mutation($id: ID!) { suspendTenant(id: $id) { id } }`, { id: b.id });
    await eventually(async () => (await counts(b.id)).running === 0);
    const before = await counts(b.id);
    const usage = (await t.gql(`{ me { usage { creditsUsed periodStart periodEnd } } }`, {}, b.apiKey)).body.data.me.usage;
    assert.ok(usage.creditsUsed > 0);

    const d = await t.gql(`mutation($id: ID!) { deleteTenant(id: $id) { id cancelledJobs } }`, { id: b.id });
    assert.equal(d.status, 200, JSON.stringify(d.body));
    assert.equal(d.body.data.deleteTenant.cancelledJobs, before.queued);
    assert.ok(before.queued > 0);

    // Its open subscription is closed, and its key is refused.
    await eventually(async () => closeCode !== null);
    assert.equal(closeCode, 4401);
    const refused = await t.gql('{ me { tenant { id } } }', {}, b.apiKey);
    assert.equal(refused.status, 401);
    await client.dispose();

    // Rows and pg-boss queues are gone.
    const [gone] = await sql`
      select (select count(*) from tenants where id = ${b.id})::int as tenants,
        (select count(*) from jobs where tenant_id = ${b.id})::int as jobs,
        (select count(*) from sched_tenants where tenant_id = ${b.id})::int as sched,
        (select count(*) from tenant_ledger where tenant_id = ${b.id})::int as ledger,
        (select count(*) from pgboss.queue where name like ${`t.${b.id}.%`})::int as queues,
        (select count(*) from pgboss.job where name like ${`t.${b.id}.%`})::int as boss_jobs`;
    assert.deepEqual({ ...gone }, { tenants: 0, jobs: 0, sched: 0, ledger: 0, queues: 0, boss_jobs: 0 });

    // History is kept for the operator and equals what was billed: the cancelled jobs added nothing.
    const h = await t.gql(
      `query($id: ID!, $from: DateTime!, $to: DateTime!) { tenantUsageHistory(tenantId: $id, from: $from, to: $to, granularity: MONTH) { calls succeeded creditsBilled } }`,
      { id: b.id, from: usage.periodStart, to: usage.periodEnd },
    );
    const rows = h.body.data.tenantUsageHistory as Array<{ calls: number; succeeded: number; creditsBilled: number }>;
    assert.equal(rows.reduce((s, r) => s + r.creditsBilled, 0), usage.creditsUsed);
    assert.equal(rows.reduce((s, r) => s + r.succeeded, 0), before.finished);
  });
});
