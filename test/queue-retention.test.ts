/**
 * Jobs never expire while they wait. A job held by a quota WAIT may wait a
 * month; pg-boss's maintenance deletes waiting rows past their queue's
 * retention. Tenant queues now keep waiting jobs 400 days, existing queues are
 * migrated, and the reconciler puts back (or fails with a code) any waiting
 * job whose pg-boss job is gone anyway.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import { BOSS_JOB_FILLFACTOR, QUEUE_POLICY_SETTING, TENANT_QUEUE_RETENTION_SECONDS, alignTenantQueues, extendTenantQueueRetention, queueName, startBoss } from '../src/queue/boss.ts';
import { LOST_JOB_CODE } from '../src/scheduler/reconcile.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const UPDATE = `mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`;
const JOB = `query($id: ID!) { job(id: $id) { state error { code } } }`;

describe('a job waiting past the queue retention', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  let boss: PgBoss;

  before(async () => {
    t = await startTestApp({ SWEEP_INTERVAL_MS: '200', RECONCILE_INTERVAL_SECONDS: '1' });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    // A second pg-boss on the same database, to run its maintenance on demand (no background supervision).
    boss = await startBoss(t.databaseUrl, { max: 2, supervise: false });
  });
  after(async () => {
    await boss.stop({ graceful: false, close: true });
    await sql.end();
    await t.stop();
  });

  test('tenant queues keep waiting jobs longer than any wait', async () => {
    const tenant = await t.createTenant('retained', 'PRO');
    const [q] = await sql`select retention_seconds from pgboss.queue where name = ${queueName(tenant.id, 'STANDARD')}`;
    assert.equal(q!.retention_seconds, TENANT_QUEUE_RETENTION_SECONDS);
    assert.ok(TENANT_QUEUE_RETENTION_SECONDS > 62 * 86_400, 'longer than a monthly quota wait plus a credits stop');
  });

  test('existing queues and their waiting jobs are migrated to the long retention', async () => {
    const tenant = await t.createTenant('old-queue', 'PRO');
    await t.gql(UPDATE, { i: { id: tenant.id, monthlyQuota: 0, quotaPolicy: 'WAIT' } });
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'old.example' } } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id;
    const queue = queueName(tenant.id, 'STANDARD');
    // Settled in WAITING_QUOTA first: the dispatcher no longer re-inserts it (in a real start the migration runs before dispatch).
    await eventually(async () => (await t.gql(JOB, { id }, tenant.apiKey)).body.data.job.state === 'WAITING_QUOTA');
    // As a queue created before this change: pg-boss's 14-day default, the job's deadline fixed at insert.
    await sql`update pgboss.queue set retention_seconds = 14 * 86400 where name = ${queue}`;
    await sql`update pgboss.job set keep_until = start_after + interval '14 days' where name = ${queue} and id = ${id}`;
    assert.ok((await extendTenantQueueRetention(sql as never)) >= 1);
    const [job] = await sql`select keep_until > now() + interval '300 days' as long from pgboss.job where name = ${queue} and id = ${id}`;
    assert.equal(job!.long, true, "the waiting job's deadline moved out too");
    assert.equal(await extendTenantQueueRetention(sql as never), 0, 'idempotent');
  });

  test("the start leaves room on every page of pg-boss's job table (its storage setting, not its schema), and a changed setting is applied again", async () => {
    const options = async () => (await sql`select reloptions from pg_class where oid = 'pgboss.job_common'::regclass`)[0]!.reloptions as string[] | null;
    assert.deepEqual(await options(), [`fillfactor=${BOSS_JOB_FILLFACTOR}`]);
    // A database whose table lost it (restored from a dump of another setup): the next start with another set of values puts it back.
    await sql`alter table pgboss.job_common reset (fillfactor)`;
    const seconds = Number((await sql`select deletion_seconds from pgboss.queue where name like 't.%' limit 1`)[0]?.deletion_seconds ?? 0) || 3600;
    await alignTenantQueues(sql as never, seconds + 1);
    assert.deepEqual(await options(), [`fillfactor=${BOSS_JOB_FILLFACTOR}`]);
    await alignTenantQueues(sql as never, seconds);
  });

  test('the queue migrations run at start once per set of values, not on every start (each scans every queue)', async () => {
    const tenant = await t.createTenant('aligned', 'PRO');
    const queue = queueName(tenant.id, 'STANDARD');
    // The app's start ran them and left its marker: a second start with the same values skips them.
    const [marker] = await sql`select value from settings where key = ${QUEUE_POLICY_SETTING}`;
    assert.ok(marker, 'the start recorded the values it applied');
    const [before] = await sql`select deletion_seconds from pgboss.queue where name = ${queue}`;
    await sql`update pgboss.queue set heartbeat_seconds = 30, retention_seconds = 14 * 86400 where name = ${queue}`;
    const seconds = Number(before!.deletion_seconds);
    assert.equal(await alignTenantQueues(sql as never, seconds), null, 'same values: skipped, no queue scanned');
    const [untouched] = await sql`select heartbeat_seconds from pgboss.queue where name = ${queue}`;
    assert.equal(untouched!.heartbeat_seconds, 30, 'skipped means nothing was rewritten');
    // Another finished-job retention (a changed JOB_RETENTION_SECONDS): all three run, and the marker follows.
    assert.ok(((await alignTenantQueues(sql as never, seconds + 60)) ?? 0) >= 1, 'the short retention was extended again');
    const [q] = await sql`select heartbeat_seconds, retention_seconds, deletion_seconds from pgboss.queue where name = ${queue}`;
    assert.deepEqual({ hb: q!.heartbeat_seconds, ret: q!.retention_seconds, del: q!.deletion_seconds }, { hb: null, ret: TENANT_QUEUE_RETENTION_SECONDS, del: seconds + 60 });
    assert.equal(await alignTenantQueues(sql as never, seconds + 60), null, 'and the next start with those values skips them');
    assert.equal(await alignTenantQueues(sql as never, seconds), 0, 'back to the configured value for the tests that follow');
  });

  test('a quota-WAIT job whose pg-boss job was deleted by maintenance is put back, and runs once quota returns', async () => {
    const tenant = await t.createTenant('waits-a-month', 'PRO');
    await t.gql(UPDATE, { i: { id: tenant.id, monthlyQuota: 0, quotaPolicy: 'WAIT' } });
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'patient.example' } } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id;
    await eventually(async () => (await t.gql(JOB, { id }, tenant.apiKey)).body.data.job.state === 'WAITING_QUOTA');

    // Forty days later (as the old default retention would have it): the job is past its pg-boss deadline
    // and pg-boss's own maintenance deletes it.
    const queue = queueName(tenant.id, 'STANDARD');
    const [original] = await sql`select created_on from pgboss.job where name = ${queue} and id = ${id}`;
    assert.ok(original, 'the waiting job has its pg-boss row');
    await sql`update jobs set created_at = now() - interval '40 days' where id = ${id}`;
    await sql`update pgboss.job set keep_until = now() - interval '1 day' where name = ${queue} and id = ${id}`;
    await boss.supervise(queue);
    // pg-boss claims each queue's maintenance per interval: if the app's own pass had just claimed it, ours
    // skipped it, so remove the row as that pass would (the loss the reconciler repairs is the same).
    await sql`delete from pgboss.job where name = ${queue} and id = ${id} and keep_until < now()`;
    // The original row is gone (the loss the reconciler repairs). The app's reconciler may already
    // have put the job back by now (the job is 40 days old, past its minimum age): a row is then there,
    // but a new one, inserted after the original.
    const [now] = await sql`select created_on from pgboss.job where name = ${queue} and id = ${id}`;
    assert.ok(!now || now.created_on > original!.created_on, 'the waiting job\'s original pg-boss row is gone');

    // The reconciler notices and puts it back under the same id; the job never left WAITING_QUOTA.
    await eventually(async () => {
      const [row] = await sql`select state, created_on from pgboss.job where name = ${queue} and id = ${id}`;
      return row && (row.state === 'created' || row.state === 'retry') && row.created_on > original!.created_on;
    }, 20_000);
    assert.equal((await t.gql(JOB, { id }, tenant.apiKey)).body.data.job.state, 'WAITING_QUOTA');

    // Quota comes back (a new period, or an admin): the job runs.
    await t.gql(UPDATE, { i: { id: tenant.id, monthlyQuota: 1000 } });
    await eventually(async () => (await t.gql(JOB, { id }, tenant.apiKey)).body.data.job.state === 'SUCCEEDED', 30_000);
  });

  test('a waiting job whose queue is gone altogether fails with QUEUE_ENTRY_LOST instead of waiting forever', async () => {
    const tenant = await t.createTenant('queue-gone', 'PRO');
    await t.gql(UPDATE, { i: { id: tenant.id, monthlyQuota: 0, quotaPolicy: 'WAIT' } });
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'orphan.example' }, priority: 'BULK' } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id;
    await sql`update jobs set created_at = now() - interval '40 days' where id = ${id}`;
    await boss.deleteQueue(queueName(tenant.id, 'BULK'));
    const job = await eventually(async () => {
      const j = (await t.gql(JOB, { id }, tenant.apiKey)).body.data.job;
      return j.state === 'FAILED' ? j : null;
    }, 20_000);
    assert.equal(job.error.code, LOST_JOB_CODE);
  });
});
