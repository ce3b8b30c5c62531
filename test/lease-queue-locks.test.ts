/**
 * sluice_lease never waits for a sched_queues row (migration 0017). A
 * submission group's depth trigger updates several queue rows in its own
 * order; a lease that waited for one of them while holding others it had
 * served could close a cycle with it (40P01). Here another transaction holds
 * one tenant's queue row, as a submission's trigger does, and then updates a
 * queue row the lease serves: the lease must pass over the held queue at once
 * (its jobs stay queued for the next call) and lease the others, and neither
 * side may fail. The 0013 function waited for the held row: with the second
 * update it deadlocked (one side aborted after deadlock_timeout), and the
 * lease's lock_timeout here fails it even without one.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import { inTransaction, queueName, startBoss } from '../src/queue/boss.ts';
import { leaseJobs } from '../src/scheduler/sql/reservations.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';

const WINDOW = 'lease-locks';

let t: TestApp;
let sql: postgres.Sql;
let boss: PgBoss;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 4, onnotice: () => {} });
  boss = await startBoss(t.databaseUrl, { max: 2, supervise: false });
  await sql`insert into windows (name, rate_per_minute, burst, tokens) values (${WINDOW}, null, 0, 0) on conflict do nothing`;
});

after(async () => {
  await boss?.stop({ graceful: false, close: true });
  await sql?.end();
  await t?.stop();
});

/** One STANDARD job queued for the tenant, its queue ready at the given virtual time. */
async function queueOne(tenantId: string, vtime: number): Promise<string> {
  const id = randomUUID();
  await sql.begin(async (tx) => {
    await tx`insert into jobs (id, tenant_id, api, params, priority, state) values (${id}, ${tenantId}, 'other', '{}', 'STANDARD', 'QUEUED')`;
    await boss.insert(queueName(tenantId, 'STANDARD'), [{ id, data: { tenantId, api: 'other', params: {} } }], { db: inTransaction(tx) });
  });
  await sql`update sched_queues set vtime = ${vtime}, ready_at = now() - interval '1 second' where tenant_id = ${tenantId} and class = 'STANDARD'`;
  return id;
}

const lease = async (tx: postgres.Sql | postgres.TransactionSql) =>
  (await leaseJobs(tx, {
    window: WINDOW,
    nodeId: randomUUID(),
    pool: 10,
    max: 10,
    leaseMax: 8,
    classes: ['STANDARD'],
    leaseSeconds: 30,
    costs: {},
    hold: [],
    batch: {},
    batchMax: 1,
    batchQuantum: 1,
  })).rows;

test('a lease passes over a queue whose row another transaction holds, and never deadlocks with it', async () => {
  const y = (await t.createTenant('first-served')).id;
  const x = (await t.createTenant('held')).id;
  const z = (await t.createTenant('after-held')).id;
  // Fair order: y, then x (held), then z.
  const yJob = await queueOne(y, 0);
  const xJob = await queueOne(x, 1);
  const zJob = await queueOne(z, 2);

  // A submission group's depth trigger: it holds x's queue row ...
  const holder = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let heldNow!: () => void;
  const held = new Promise<void>((r) => (heldNow = r));
  const submission = holder.begin(async (tx) => {
    await tx`update sched_queues set depth = depth where tenant_id = ${x} and class = 'STANDARD'`;
    heldNow();
    await released;
    // ... and then updates a row the lease serves (its own order), while the lease may still run.
    await tx`update sched_queues set depth = depth where tenant_id = ${y} and class = 'STANDARD'`;
  });
  await held;

  const leased = sql.begin(async (tx) => {
    // The 0013 lease waited here for x's row; fail fast instead of hanging the suite.
    await tx`set local lock_timeout = '5s'`;
    const rows = await lease(tx);
    return rows;
  });
  // Let the submission's second update race the lease (before or after its commit).
  setTimeout(release, 200);
  const [rows] = await Promise.all([leased, submission]);
  await holder.end();

  assert.deepEqual(rows.map((r) => r.jobId).sort(), [yJob, zJob].sort(), 'the held queue sits out, the others are leased');
  const [xState] = await sql`select state from jobs where id = ${xJob}`;
  assert.equal(xState!.state, 'QUEUED');

  // The held queue is not lost: the next call takes it.
  const next = await sql.begin((tx) => lease(tx));
  assert.deepEqual(next.map((r) => r.jobId), [xJob]);
  // The deferred writes landed: served queues' virtual times advanced, tenants' slots taken.
  const qs = await sql`select tenant_id, vtime from sched_queues where class = 'STANDARD' and tenant_id in (${x}, ${y}, ${z})`;
  const vt = Object.fromEntries(qs.map((r) => [r.tenant_id as string, r.vtime as number]));
  assert.ok(vt[y]! > 0 && vt[x]! > 1 && vt[z]! > 2, JSON.stringify(vt));
  const ts = await sql`select tenant_id, in_flight from sched_tenants where tenant_id in (${x}, ${y}, ${z})`;
  assert.ok(ts.every((r) => r.in_flight === 1), JSON.stringify(ts));
});
