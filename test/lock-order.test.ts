/**
 * One lock order for every multi-row writer, contention as a result, counters that raise.
 *
 * - A settlement requeuing two tenants' jobs and a submission group inserting jobs for both, run
 *   against each other many times on a real Postgres, never deadlock (40P01) and both commit: the
 *   settlement requeues in queue key order (lock-order.ts requeueOrder) and the depth trigger locks
 *   its queue rows in key order. The same pair with the settlement in outcome order (B before A)
 *   does deadlock: the scenario is a real one, and the test can fail.
 * - Leases of one window from several connections never fail a statement: a second lease while
 *   one is under way returns status 'busy' (no error, no rolled-back transaction), and a lease
 *   whose window was paused while it ran returns 'changed' having written nothing.
 * - A release of what was never taken raises instead of being clamped at zero.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { newJobIds } from '../src/jobs/ids.ts';
import { insertJobsQueued, requeueJob } from '../src/jobs/store.ts';
import { reactionOrder, requeueOrder } from '../src/scheduler/lock-order.ts';
import { markManyQueuesReady, markQueuesReady } from '../src/scheduler/sql/queues.ts';
import { leaseJobs, settleReservations, type LeaseRequest } from '../src/scheduler/sql/reservations.ts';
import { pauseWindow } from '../src/scheduler/sql/windows.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';
import { queueJobs, unlimitedWindow } from './helpers/lease.ts';

const WINDOW = 'lock-order';

let t: TestApp;
let sql: postgres.Sql;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 6, onnotice: () => {} });
  await unlimitedWindow(sql, WINDOW);
});

after(async () => {
  await sql?.end();
  await t?.stop();
});

const request = (window: string, pool = 50): LeaseRequest => ({
  window, nodeId: randomUUID(), pool, max: 256, leaseMax: 8, classes: ['INTERACTIVE', 'STANDARD', 'BULK'], leaseSeconds: 30,
  costs: { dnslookup: 1 }, hold: [], batch: {}, batchMax: 1, batchQuantum: 1,
});

/** Only this test's queues are ready: a lease may serve any tenant's, earlier tests' included. */
const noOtherQueueReady = () => sql`update sched_queues set ready_at = null where ready_at is not null`;

/** A window of the test's own and a tenant with `n` waiting jobs, the only ready queue. */
async function soleTenant(window: string, name: string, n: number): Promise<string> {
  await unlimitedWindow(sql, window);
  const tenant = (await t.createTenant(name)).id;
  await noOtherQueueReady();
  await queueJobs(sql, [tenant], n, name);
  return tenant;
}

/** Resolves once some backend of the test database waits for a row lock (bounded: 10 s). */
async function someoneWaitsForALock(): Promise<void> {
  for (let i = 0; i < 1000; i++) {
    const [r] = await sql`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`;
    if (r!.n > 0) return;
    await new Promise((res) => setTimeout(res, 10));
  }
  throw new Error('no backend ever waited for a lock');
}

const code = (r: PromiseSettledResult<unknown>) => (r.status === 'rejected' ? ((r.reason as { code?: string }).code ?? String(r.reason)) : 'ok');

/**
 * One round of the pair: tenant b's and tenant a's RUNNING jobs (outcomes in that order) requeued
 * by a settlement in `order`, while a submission group inserts one job for each (b first). The
 * submission starts once the settlement holds its first queue row; the settlement takes its second
 * once the submission waits for a lock. Returns each side's outcome ('ok' or its SQLSTATE).
 */
async function pair(a: string, b: string, order: 'key' | 'outcome'): Promise<[string, string]> {
  const [ja, jb] = [randomUUID(), randomUUID()];
  await sql`insert into jobs (id, tenant_id, api, params, priority, state, attempts) values
    (${ja}, ${a}, 'dnslookup', '{}', 'STANDARD', 'RUNNING', 1), (${jb}, ${b}, 'dnslookup', '{}', 'STANDARD', 'RUNNING', 1)`;
  const outcomes = [{ tenantId: b, jobClass: 'STANDARD' as const, id: jb }, { tenantId: a, jobClass: 'STANDARD' as const, id: ja }];
  const idx = order === 'key' ? requeueOrder(outcomes) : [0, 1];
  let holding!: () => void;
  const firstHeld = new Promise<void>((r) => (holding = r));
  const settlement = sql.begin(async (tx) => {
    for (const [k, i] of idx.entries()) {
      const o = outcomes[i]!;
      assert.ok(await requeueJob(tx, o.id, 1, true, 0, { data: null, errorCode: 'HTTP_503', errorMessage: 'retry', httpStatus: 503 }));
      await markQueuesReady(tx, o.tenantId, [o.jobClass]);
      if (k === 0) {
        holding();
        await someoneWaitsForALock();
      }
    }
  });
  const submission = firstHeld.then(() =>
    sql.begin(async (tx) => {
      const ids = newJobIds(2);
      await insertJobsQueued(tx, [b, a].map((tenantId, k) => ({ id: ids[k]!, tenantId, state: 'QUEUED' as const, api: 'dnslookup', params: { k }, priority: 'STANDARD' as const, idempotencyKey: null })));
      await markManyQueuesReady(tx, [b, a].map((tenantId) => ({ tenantId, jobClass: 'STANDARD' as const })));
    }),
  );
  const [s, g] = await Promise.allSettled([settlement, submission]);
  return [code(s), code(g)];
}

test('the pure orders: requeues by (tenant, class, job), reactions by window name with the account last', () => {
  const items = [
    { tenantId: 'b', jobClass: 'BULK', id: '2' },
    { tenantId: 'a', jobClass: 'STANDARD', id: '1' },
    { tenantId: 'a', jobClass: 'BULK', id: '9' },
    { tenantId: 'a', jobClass: 'BULK', id: '3' },
  ];
  assert.deepEqual(requeueOrder(items), [3, 2, 1, 0]);
  assert.deepEqual(
    reactionOrder([{ window: 'w2', account: false }, { window: 'w1', account: true }, { window: 'w1', account: false }, { window: 'w2', account: false }]),
    [2, 0, 3, 1],
  );
});

test('a settlement requeuing A then B and a submission group writing B then A never deadlock (40 rounds); outcome order does', async () => {
  const [a, b] = [(await t.createTenant('lock-a')).id, (await t.createTenant('lock-b')).id].sort() as [string, string];
  for (let round = 0; round < 40; round++) {
    assert.deepEqual(await pair(a, b, 'key'), ['ok', 'ok'], `round ${round}: both commit`);
  }
  // The control: the settlement in outcome order (B, then A) closes a cycle with the submission,
  // which holds A (key order) and waits for B. Postgres breaks it by aborting one side.
  const control = await pair(a, b, 'outcome');
  assert.ok(control.includes('40P01'), `outcome order deadlocks: ${control.join(', ')}`);
  // The depth counters are exact after all of it: every committed QUEUED job counted once.
  const rows = await sql`
    select q.tenant_id, q.depth, (select count(*)::int from jobs j where j.tenant_id = q.tenant_id and j.priority = q.class and j.state in ('QUEUED', 'WAITING_QUOTA')) as n
    from sched_queues q where q.tenant_id in (${a}, ${b})`;
  for (const r of rows) assert.equal(r.depth, r.n, `tenant ${r.tenant_id}: depth counter`);
});

test('leases of one window from several connections: a busy window is a result, never a failed statement', async () => {
  const window = 'lock-order-busy';
  await unlimitedWindow(sql, window);
  // Within the tenants' caps (32 each) and the pool: every job can be leased.
  const tenants = await Promise.all([0, 1, 2, 3].map(async (i) => (await t.createTenant(`busy-${i}`, 'ENTERPRISE')).id));
  await noOtherQueueReady();
  await queueJobs(sql, tenants, 30, 'busy');
  const [stat] = await sql`select xact_rollback::int as n from pg_stat_database where datname = current_database()`;
  const callers = postgres(t.databaseUrl, { max: 4, onnotice: () => {}, connection: { application_name: 'lease-contention' } });
  const statuses = new Map<string, number>();
  let leased = 0;
  try {
    // One lease under way, held: every other call returns 'busy' at once.
    const holder = await callers.reserve();
    await holder`begin`;
    await holder`select pg_advisory_xact_lock(hashtext('sluice_lease'), hashtext(${window}))`;
    const whileHeld = await Promise.all([0, 1, 2].map(() => leaseJobs(callers, request(window))));
    assert.deepEqual(whileHeld.map((r) => [r.status, r.rows.length]), [['busy', 0], ['busy', 0], ['busy', 0]]);
    await holder`commit`;
    holder.release();
    // Four callers at once until every job is leased: no call fails, each job is leased once.
    const seen = new Set<string>();
    await Promise.all([0, 1, 2, 3].map(async () => {
      for (let i = 0; i < 100 && leased < 120; i++) {
        const r = await leaseJobs(callers, request(window, 1000));
        statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
        for (const row of r.rows) {
          assert.ok(!seen.has(row.jobId), 'a job is leased once');
          seen.add(row.jobId);
        }
        leased += r.rows.length;
      }
    }));
  } finally {
    await callers.end();
  }
  assert.equal(leased, 120, `every job leased (${JSON.stringify([...statuses])})`);
  // No statement failed, so no transaction rolled back: read once the callers' backends are gone
  // (a backend reports its counts when it exits).
  for (let i = 0; i < 500; i++) {
    const [r] = await sql`select count(*)::int as n from pg_stat_activity where application_name = 'lease-contention'`;
    if (r!.n === 0) break;
    await new Promise((res) => setTimeout(res, 10));
  }
  await new Promise((res) => setTimeout(res, 200));
  const [after] = await sql`select xact_rollback::int as n from pg_stat_database where datname = current_database()`;
  assert.equal(after!.n - stat!.n, 0, 'no transaction rolled back');
});

test("a lease whose window is paused while it runs returns 'changed' and writes nothing", async () => {
  const window = 'lock-order-changed';
  const tenant = await soleTenant(window, 'changed', 3);
  // The lease waits for its first tenant's row (held here) after reading the window; the window is
  // paused meanwhile, so its take at the end finds the window changed.
  const holder = await sql.reserve();
  await holder`begin`;
  await holder`select 1 from sched_tenants where tenant_id = ${tenant} for update`;
  const lease = leaseJobs(sql, request(window));
  await someoneWaitsForALock();
  await pauseWindow(sql, window, 30, 'RATE_LIMITED');
  await holder`commit`;
  holder.release();
  const r = await lease;
  assert.deepEqual([r.status, r.rows.length], ['changed', 0]);
  const [state] = await sql`
    select (select count(*)::int from jobs where tenant_id = ${tenant} and state = 'QUEUED') as queued,
      (select count(*)::int from reservations where tenant_id = ${tenant}) as reservations,
      (select in_flight from sched_tenants where tenant_id = ${tenant}) as in_flight,
      (select reserved::int from sched_tenants where tenant_id = ${tenant}) as reserved,
      (select count(*)::int from pgboss.job where data->>'tenantId' = ${tenant} and state = 'created') as boss_waiting,
      (select in_flight from windows where name = ${window}) as window_in_flight`;
  assert.deepEqual({ ...state }, { queued: 3, reservations: 0, in_flight: 0, reserved: 0, boss_waiting: 3, window_in_flight: 0 });
});

test('a release of what was never taken raises instead of being clamped at zero', async () => {
  const window = 'lock-order-counters';
  const tenant = await soleTenant(window, 'counters', 1);
  const { status, rows } = await leaseJobs(sql, request(window));
  assert.deepEqual([status, rows.length], ['leased', 1]);
  // A double release elsewhere already gave the tenant's slot back: settling now would take the
  // count below zero, which used to be clamped to 0 and hidden.
  await sql`update sched_tenants set in_flight = 0 where tenant_id = ${tenant}`;
  await assert.rejects(settleReservations(sql, [{ id: rows[0]!.reservationId, billed: 1, outcome: 'billed' }]), (e: { code?: string }) => e.code === '23514');
  const [open] = await sql`select count(*)::int as n from reservations where id = ${rows[0]!.reservationId} and settled_at is null`;
  assert.equal(open!.n, 1, 'the failed settlement changed nothing');
  await sql`update sched_tenants set in_flight = 1 where tenant_id = ${tenant}`;
  assert.deepEqual([...(await settleReservations(sql, [{ id: rows[0]!.reservationId, billed: 1, outcome: 'billed' }]))], [rows[0]!.reservationId]);
  // The window: its slot came back once (the settlement's delta); a second delta is a double release,
  // which the next lease refuses to fold.
  await sql`insert into window_slot_deltas ("window", n) values (${window}, -1)`;
  await assert.rejects(leaseJobs(sql, request(window)), (e: { code?: string }) => e.code === '23514');
});
