/**
 * The request deadline (REQUEST_TIMEOUT_MS): a request the database cannot
 * serve in time gets a coded 503 with Retry-After instead of hanging, and a
 * submission that was answered with that error is never stored, even when the
 * database frees up a moment later.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;

describe('the request deadline', () => {
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', REQUEST_TIMEOUT_MS: '1000' });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  test('a submission stuck behind the database gets 503 DATABASE_UNAVAILABLE and is not stored when the database frees up', async () => {
    const tenant = await t.createTenant('stuck', 'PRO');
    // Another session holds the admission gate (admission_totals, which every submission locks first): the submission waits on it.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let locked = false;
    const holder = sql.begin(async (tx) => {
      await tx`select 1 from admission_totals for update`;
      locked = true;
      await held;
    });
    await eventually(async () => locked, 10_000, 10);

    // Whatever fails below, the gate is given back, so the app can stop.
    try {
      const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'late.example' }, idempotencyKey: 'late-1' } }, tenant.apiKey);
      assert.equal(r.status, 503, JSON.stringify(r.body));
      assert.equal(r.body.errors[0].extensions.code, 'DATABASE_UNAVAILABLE');
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
    } finally {
      // The database frees up: the abandoned submission reaches its commit and must roll back.
      release();
      await holder;
    }
    await new Promise((res) => setTimeout(res, 500)); // let the abandoned transaction finish (no wall-clock assertion)
    await eventually(async () => {
      const [busy] = await sql`select count(*)::int as n from pg_stat_activity where datname = current_database() and state = 'idle in transaction'`;
      return busy!.n === 0;
    }, 10_000, 50);
    const [stored] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant.id}`;
    assert.equal(stored!.n, 0, 'the submission answered with an error was not stored');

    // The retry with the same idempotency key is accepted, once.
    const again = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'late.example' }, idempotencyKey: 'late-1' } }, tenant.apiKey);
    assert.equal(again.status, 200, JSON.stringify(again.body));
    const [after1] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant.id}`;
    assert.equal(after1!.n, 1);
  });
});
