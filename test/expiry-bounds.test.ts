/**
 * Every loop of the expiry path has a way out, on a real Postgres:
 *  - a job whose sent attempts keep being lost (its worker dies or never settles) fails with
 *    ATTEMPT_LOST once past its attempt limit, billed by the timeout rule for each sent attempt;
 *  - one expired reservation whose settlement always fails (a drifted counter) is isolated and
 *    recorded, and the others of its batch are settled;
 *  - the reconciler's walk over waiting jobs is an index range, not a sort of the backlog;
 *  - a lease's sent mark and its expiry cannot both win, whichever comes first.
 * Attempts are leased straight from sluice_lease on a window of the test's own (no dispatcher),
 * and the sweeper is the real one, driven round by round.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import { DEFAULT_CATALOG } from '../src/config/apis.ts';
import { leaseCosts } from '../src/scheduler/lease.ts';
import { createLogger } from '../src/log.ts';
import { startBoss } from '../src/queue/boss.ts';
import { Sweeper } from '../src/scheduler/sweeper.ts';
import { leaseJobs, markSent, failedExpiries, lockExpiredReservations } from '../src/scheduler/sql/reservations.ts';
import { recentAttemptLost } from '../src/jobs/store.ts';
import { waitingBatch } from '../src/scheduler/reconcile.ts';
import { desiredAlerts } from '../src/alerts/rules.ts';
import { lostAttemptFates } from '../src/scheduler/ledger.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';
import { unlimitedWindow } from './helpers/lease.ts';
import { assertLedgerBalances } from './helpers/invariants.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }`;
const JOB = `query($id: ID!) { job(id: $id) { state attempts creditsBilled error { code message } } }`;
const RETRY_LIMIT = 2;

describe('lost attempts and expiry isolation (pure)', () => {
  test('a sent attempt past the limit fails its job; unsent ones and earlier ones go back', () => {
    const rows = [
      { id: 'a', attempt: 1, sent: true },
      { id: 'b', attempt: 3, sent: true },
      { id: 'c', attempt: 3, sent: false },
      { id: 'd', attempt: 2, sent: true },
    ];
    const { release, fail } = lostAttemptFates(rows, 2);
    assert.deepEqual(fail.map((r) => r.id), ['b']);
    assert.deepEqual(release.map((r) => r.id), ['a', 'c', 'd']);
  });

  test('the alerts name a failed expiry and jobs lost past their limit', () => {
    const alerts = desiredAlerts({
      oldestAgeSeconds: {},
      agePromiseSeconds: {},
      accountStop: null,
      windowsStopped: [],
      openBreakers: [],
      failedExpiries: { count: 1, ids: ['r1'] },
      attemptLost: { count: 2, jobIds: ['j1', 'j2'] },
    });
    assert.deepEqual(alerts.map((a) => a.key), ['EXPIRY_FAILED', 'ATTEMPT_LOST']);
    assert.match(alerts[0]!.message, /r1/);
    assert.match(alerts[1]!.message, /j1, j2/);
  });
});

describe('the expiry path on a real Postgres', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  let boss: PgBoss;
  let sweeper: Sweeper;

  before(async () => {
    // The API role runs no dispatcher and no sweeper: the test leases and sweeps itself.
    t = await startTestApp({ SLUICE_ROLE: 'api' });
    sql = postgres(t.databaseUrl, { max: 3, onnotice: () => {} });
    boss = await startBoss(t.databaseUrl, { max: 2, supervise: false });
    await unlimitedWindow(sql, 'expiry-test');
    sweeper = new Sweeper({
      sql, boss, nodeId: randomUUID(), role: 'worker', intervalMs: 60_000, nodeTimeoutSeconds: 1, leaseSeconds: 1,
      timeoutBilling: 'billed', retryLimit: RETRY_LIMIT, log: createLogger('silent'),
    });
  });
  after(async () => {
    await boss.stop({ graceful: false, close: true });
    await sql.end();
    await t.stop();
  });

  /** Leases every ready job on the test's window; `sent` marks them sent as a node does before calling. */
  async function lease(sent: boolean) {
    const { rows } = await leaseJobs(sql, {
      window: 'expiry-test', nodeId: randomUUID(), pool: 50, max: 50, leaseMax: 50, classes: ['INTERACTIVE', 'STANDARD', 'BULK'], leaseSeconds: 60,
      costs: leaseCosts(DEFAULT_CATALOG), hold: [], batch: {}, batchMax: 1, batchQuantum: 1,
    });
    if (sent && rows.length > 0) await markSent(sql, rows.map((r) => r.reservationId));
    return rows;
  }

  /** Their node died: the attempt leases run out. */
  async function expireAll() {
    await sql`update reservations set lease_expires_at = now() - interval '1 second' where settled_at is null`;
  }

  test('a job whose sent attempts keep being lost fails with ATTEMPT_LOST past its limit, billed for each', async () => {
    const tenant = await t.createTenant('keeps-killing', 'PRO');
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'crash.example' } } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    const id = r.body.data.submitJob.job.id as string;
    // Attempts 1..RETRY_LIMIT go back to the queue; attempt RETRY_LIMIT+1 is the last allowed.
    for (let attempt = 1; attempt <= RETRY_LIMIT + 1; attempt++) {
      // Put-back jobs are ready at once (run_after = now()).
      const rows = await lease(true);
      assert.deepEqual(rows.map((x) => [x.jobId, x.attempt]), [[id, attempt]], `attempt ${attempt} leased`);
      await expireAll();
      const swept = await sweeper.sweepOnce();
      assert.equal(swept.released, 1);
      const job = (await t.gql(JOB, { id }, tenant.apiKey)).body.data.job;
      if (attempt <= RETRY_LIMIT) assert.equal(job.state, 'QUEUED', `attempt ${attempt} lost: back in its queue`);
      else {
        assert.equal(job.state, 'FAILED', 'past its limit: FAILED, not queued again');
        assert.equal(job.error.code, 'ATTEMPT_LOST');
        assert.equal(job.attempts, RETRY_LIMIT + 1);
        assert.equal(job.creditsBilled, RETRY_LIMIT + 1, 'each sent attempt billed by the timeout rule (dnslookup costs 1)');
      }
    }
    assert.deepEqual(await lease(true), [], 'nothing left to lease: the loop ended');
    const [pg] = await sql`select state from pgboss.job where id = ${id}`;
    assert.equal(pg!.state, 'completed', "its pg-boss job is acked with the final state");
    const lost = await recentAttemptLost(sql, 3600);
    assert.deepEqual(lost, { count: 1, jobIds: [id] });
    await assertLedgerBalances(sql);
  });

  test('an attempt never sent goes back however often it is lost', async () => {
    const tenant = await t.createTenant('never-sent', 'PRO');
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'unsent.example' } } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id as string;
    for (let i = 0; i < RETRY_LIMIT + 2; i++) {
      assert.equal((await lease(false)).length, 1);
      await expireAll();
      await sweeper.sweepOnce();
    }
    const job = (await t.gql(JOB, { id }, tenant.apiKey)).body.data.job;
    assert.equal(job.state, 'QUEUED');
    assert.equal(job.creditsBilled, 0, 'never sent: refunded each time');
    const c = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { state } }`, { id }, tenant.apiKey);
    assert.equal(c.body.data?.cancelJob.state, 'CANCELLED', JSON.stringify(c.body.errors));
  });

  test('one expired reservation that cannot be settled is recorded and skipped; the rest of its batch settles', async () => {
    const good = await t.createTenant('good-tenant', 'PRO');
    const bad = await t.createTenant('drifted-tenant', 'PRO');
    for (const [tenant, n] of [[good, 5], [bad, 1]] as const) {
      for (let i = 0; i < n; i++) {
        const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: `iso${i}.example` } } }, tenant.apiKey);
        assert.ok(r.body.data, JSON.stringify(r.body.errors));
      }
    }
    // The fair lease serves tenants turn by turn: lease until everything ready is out.
    const rows = [];
    for (let batch = await lease(true); batch.length > 0; batch = await lease(true)) rows.push(...batch);
    assert.equal(rows.length, 6);
    await expireAll();
    // A drifted counter: the bad tenant's in-flight count says 0 while it holds a slot, so
    // releasing the slot breaks its CHECK (in_flight >= 0) every time.
    await sql`update sched_tenants set in_flight = 0 where tenant_id = ${bad.id}`;
    const swept = await sweeper.sweepOnce();
    assert.equal(swept.released, 5, "the good tenant's five are settled despite the bad row in their batch");
    const [open] = await sql`select count(*)::int as n from reservations where settled_at is null and tenant_id = ${good.id}`;
    assert.equal(open!.n, 0);
    const badRow = rows.find((x) => x.tenantId === bad.id)!;
    const [rec] = await sql`select expiry_error, expiry_failed_at is not null as failed from reservations where id = ${badRow.reservationId}`;
    assert.equal(rec!.failed, true, 'the bad row is recorded');
    assert.match(rec!.expiry_error as string, /in_flight/, `its reason is kept: ${rec!.expiry_error}`);
    assert.deepEqual(await failedExpiries(sql), { count: 1, ids: [badRow.reservationId] });
    // The next round skips it (no second failure) and settles nothing more.
    const again = await sweeper.sweepOnce();
    assert.equal(again.released, 0);
    // Once the counter is repaired and the retry delay has passed, it settles like the others.
    await sql`update sched_tenants set in_flight = 1 where tenant_id = ${bad.id}`;
    await sql`update reservations set expiry_failed_at = now() - interval '1 hour' where id = ${badRow.reservationId}`;
    assert.equal((await sweeper.sweepOnce()).released, 1);
    assert.deepEqual(await failedExpiries(sql), { count: 0, ids: [] });
  });

  /** Resolves once a statement containing `marker` waits for a lock (the other side's insert of the lease's row). */
  async function blockedOn(marker: string) {
    for (let i = 0; i < 500; i++) {
      const [w] = await sql`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and query like ${'%' + marker + '%'}`;
      if (w!.n > 0) return;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.fail(`no statement with ${marker} waited for a lock`);
  }

  test("a lease's sent mark and its expiry cannot both win: whichever inserts the lease's row first decides", async () => {
    const tenant = await t.createTenant('mark-or-expiry', 'PRO');
    const submit = async (n: number) => {
      for (let i = 0; i < n; i++) assert.ok((await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: `race${i}.example` } } }, tenant.apiKey)).body.data);
    };
    // The expiry first: its claim holds the lease's row while the mark tries; the mark then fences
    // nothing (no call is sent), and the expiry refunds the lease as never sent.
    // (The lease takes every ready job, earlier tests' put-back ones too: all are one lease.)
    await submit(2);
    const first = await lease(false);
    assert.ok(first.filter((r) => r.tenantId === tenant.id).length === 2);
    const ids = first.map((r) => r.reservationId);
    await expireAll();
    let marking: Promise<Set<string>> | undefined;
    const claimed = await sql.begin(async (tx) => {
      const locked = await lockExpiredReservations(tx, ids);
      marking = markSent(sql, ids, [], 60);
      await blockedOn('sluice_mark_sent');
      return locked;
    });
    assert.deepEqual(claimed.map((r) => r.sent), ids.map(() => false), 'the expiry claimed the lease as never sent');
    assert.deepEqual([...(await marking!)], [], 'the mark after the claim fences nothing: no call of the lease is sent');
    assert.equal((await sweeper.sweepOnce()).released, ids.length);
    const refunded = await sql`select outcome, billed from reservations where id = any(${ids}::uuid[])`;
    assert.deepEqual(refunded.map((r) => [r.outcome, r.billed]), ids.map(() => ['never_sent', 0]));

    // The mark first: the expiry's claim waits for it, then reads the lease's row again and finds
    // it marked, with the mark's longer lease: it takes nothing.
    const second = await lease(false);
    assert.equal(second.filter((r) => r.tenantId === tenant.id).length, 2, 'the refunded jobs were put back');
    const ids2 = second.map((r) => r.reservationId);
    await expireAll();
    let expiring: Promise<unknown[]> | undefined;
    const fenced = await sql.begin(async (tx) => {
      const [{ n }] = await tx`select count(*)::int as n from sluice_mark_sent(${ids2}::uuid[], '{}'::uuid[], 60)` as unknown as [{ n: number }];
      expiring = sql.begin((tx2) => lockExpiredReservations(tx2, ids2));
      await blockedOn('insert into lease_sends');
      return n;
    });
    assert.equal(fenced, ids2.length, 'the mark fenced them all');
    assert.deepEqual(await expiring!, [], "the expiry, after the mark's commit, finds the lease alive");
    assert.equal((await sweeper.sweepOnce()).released, 0, 'nothing of a marked lease expires before its mark says');
    // Once the mark's lease runs out too, the lease is billed as sent (the timeout rule).
    await sql`update lease_sends set lease_expires_at = now() - interval '1 second' where lease_id in (select lease_id from reservations where id = any(${ids2}::uuid[]))`;
    assert.equal((await sweeper.sweepOnce()).released, ids2.length);
    const billed = await sql`select outcome from reservations where id = any(${ids2}::uuid[])`;
    assert.deepEqual(billed.map((r) => r.outcome), ids2.map(() => 'node_lost'));
    await assertLedgerBalances(sql);
  });

  test("the reconciler's walk over 100,000 waiting jobs is an index range in its order, not a sort", async () => {
    // Written straight into jobs (triggers off for the load: this is about the read's plan).
    await sql.begin(async (tx) => {
      await tx`set local session_replication_role = replica`;
      await tx`
        insert into jobs (id, tenant_id, state, api, params, priority, created_at, updated_at, run_after)
        select gen_random_uuid(), gen_random_uuid(), case when g % 5 = 0 then 'WAITING_QUOTA' else 'QUEUED' end, 'dnslookup', '{}'::jsonb,
          'STANDARD', now() - interval '1 hour' + g * interval '1 millisecond', now(), now()
        from generate_series(1, 100000) g`;
    });
    await sql`analyze jobs`;
    const [first] = await sql`select (extract(epoch from created_at) * 1000000)::bigint::text as micros, id from jobs order by created_at, id offset 5000 limit 1`;
    for (const cursor of [null, { micros: first!.micros as string, id: first!.id as string }]) {
      const [row] = await sql.begin((tx) => waitingBatch(tx, cursor, true));
      const plan = JSON.stringify(row!['QUERY PLAN']);
      assert.match(plan, /"Index Name":"jobs_waiting_created_idx"/, `the walk reads its index (${cursor ? 'after a cursor' : 'from the start'}): ${plan.slice(0, 2000)}`);
      assert.doesNotMatch(plan, /"Node Type":"Seq Scan","Parent Relationship":"[^"]*","[^}]*"Relation Name":"jobs"/, 'no sequential scan of jobs');
      const sorts = [...plan.matchAll(/"Node Type":"Sort"[^}]*?"Plan Rows":(\d+)/g)].map((m) => Number(m[1]));
      assert.ok(sorts.every((n) => n <= 1000), `no sort of the backlog (sorts of ${sorts.join(', ')} rows)`);
    }
  });
});
