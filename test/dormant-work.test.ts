/**
 * Dormant work is free (I16): queues that cannot be served now (their tenant suspended or
 * quota-blocked, every job due later, every due job for an API whose breaker is open) are out of
 * the fair index, so a lease reads and writes the same few rows of sched_queues beside thousands
 * of them as beside none; and each comes back by the event that changes it. Costs are read from
 * Postgres's own counters (index tuples read, rows updated) around one sluice_lease call.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import { inTransaction, queueName, startBoss } from '../src/queue/boss.ts';
import { CLASSES, type JobClass } from '../src/config/classes.ts';
import { leaseJobs } from '../src/scheduler/sql/reservations.ts';
import { markQueuesReady } from '../src/scheduler/sql/queues.ts';
import { setTenantSuspended } from '../src/scheduler/sql/tenants.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';

const WINDOW = 'dormant';
const DORMANT = 4000;

let t: TestApp;
let sql: postgres.Sql;
let boss: PgBoss;
let active: string[] = [];

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  boss = await startBoss(t.databaseUrl, { max: 2, supervise: false });
  for (let i = 0; i < 2; i++) active.push((await t.createTenant(`active-${i}`, 'ENTERPRISE')).id);
  active = active.sort();
  await sql`insert into windows (name, rate_per_minute, burst, tokens) values (${WINDOW}, null, 0, 0) on conflict do nothing`;
});

after(async () => {
  await boss?.stop({ graceful: false, close: true });
  await sql?.end();
  await t?.stop();
});

async function addJobs(tenantId: string, jobClass: JobClass, n: number, api = 'exchangerate', startAfter: Date | null = null): Promise<void> {
  const jobs = Array.from({ length: n }, (_, i) => ({ id: randomUUID(), api, params: { x: i } }));
  await sql.begin(async (tx) => {
    await tx`
      insert into jobs (id, tenant_id, api, params, priority, state, run_after)
      select x.id, ${tenantId}, x.api, x.params, ${jobClass}, 'QUEUED', coalesce(${startAfter}::timestamptz, now())
      from jsonb_to_recordset(${tx.json(jobs as never)}::jsonb) as x(id uuid, api text, params jsonb)`;
    await boss.insert(queueName(tenantId, jobClass), jobs.map((j) => ({ id: j.id, data: { tenantId, api: j.api, params: j.params }, startAfter: startAfter ?? undefined })), { db: inTransaction(tx) });
    await markQueuesReady(tx, tenantId, [jobClass], startAfter);
  });
}

/** Tenants with scheduler rows only (the lease never reads the dormant ones' jobs). */
async function bulkTenants(n: number): Promise<string[]> {
  const ids = Array.from({ length: n }, () => randomUUID());
  await sql.begin(async (tx) => {
    await tx`
      insert into tenants (id, name, tier, weight, concurrency_cap, monthly_quota, queue_bound)
      select x, 'dormant-' || x, 'PRO', 1, 10, 1000, 1000 from unnest(${ids}::uuid[]) as x`;
    await tx`
      insert into sched_tenants (tenant_id, weight, cap, quota, quota_policy, period_anchor)
      select t.id, 1, 10, 1000, t.quota_policy, t.period_anchor from tenants t where t.id = any(${ids}::uuid[])`;
    await tx`insert into sched_queues (tenant_id, class) select t, c from unnest(${ids}::uuid[]) as t cross join unnest(${CLASSES as unknown as string[]}::text[]) as c`;
  });
  return ids;
}

/** Index tuples read and rows updated in sched_queues by one lease call on its own connection. */
async function leaseCost(hold: string[] = []): Promise<{ jobs: number; tuplesRead: number; rowsUpdated: number }> {
  const conn = await sql.reserve();
  try {
    const stats = async () => {
      await conn`select pg_stat_force_next_flush()`;
      await conn`select pg_stat_clear_snapshot()`;
      const [r] = await conn`
        select (select coalesce(sum(idx_tup_read), 0) from pg_stat_user_indexes where relname = 'sched_queues')::int as read,
          (select n_tup_upd from pg_stat_user_tables where relname = 'sched_queues')::int as upd`;
      return { read: r!.read as number, upd: r!.upd as number };
    };
    const before = await stats();
    const { rows } = await leaseJobs(conn as unknown as postgres.Sql, {
      window: WINDOW, nodeId: randomUUID(), pool: 50, max: 256, leaseMax: 8, classes: ['STANDARD'], leaseSeconds: 30,
      costs: { exchangerate: 1 }, hold, batch: {}, batchMax: 1, batchQuantum: 8,
    });
    const afterStats = await stats();
    return { jobs: rows.length, tuplesRead: afterStats.read - before.read, rowsUpdated: afterStats.upd - before.upd };
  } finally {
    conn.release();
  }
}

async function resetActive(): Promise<void> {
  await sql`update sched_tenants set in_flight = 0 where tenant_id = any(${active}::uuid[])`;
  await sql`update windows set in_flight = 0 where name = ${WINDOW}`;
  await sql`delete from window_slot_deltas`;
  for (const id of active) await addJobs(id, 'STANDARD', 4);
}

test('a lease beside thousands of dormant queues reads and writes what it does beside none', async () => {
  await resetActive();
  const alone = await leaseCost();
  assert.equal(alone.jobs, 8);

  // Dormant tenants, each kind as its event leaves it: suspended with a backlog (ready, tenant
  // dormant), quota-blocked (ready, tenant dormant), every job due tomorrow (scheduled), every due
  // job for a held API (held). Their virtual times lag the clock far behind: the lift must not
  // rewrite them either.
  const ids = await bulkTenants(DORMANT);
  const quarter = DORMANT / 4;
  const [suspended, blocked, scheduled, held] = [0, 1, 2, 3].map((k) => ids.slice(k * quarter, (k + 1) * quarter));
  await sql`update sched_tenants set suspended = true where tenant_id = any(${suspended!}::uuid[])`;
  await sql`update sched_tenants set quota_blocked = true where tenant_id = any(${blocked!}::uuid[])`;
  await sql`
    update sched_queues set vtime = 0, depth = 5, ready_at = now() - interval '1 minute', tenant_dormant = true
    where class = 'STANDARD' and tenant_id = any(${[...suspended!, ...blocked!]}::uuid[])`;
  await sql`update sched_queues set vtime = 0, depth = 1, ready_at = now() + interval '1 day', scheduled = true where class = 'STANDARD' and tenant_id = any(${scheduled!}::uuid[])`;
  await sql`update sched_queues set vtime = 0, depth = 1, ready_at = now() - interval '1 minute', held_api = 'dnslookup' where class = 'STANDARD' and tenant_id = any(${held!}::uuid[])`;
  await sql`update sched_classes set clock = greatest(clock, 100) where class = 'STANDARD'`;
  await sql`analyze sched_queues`;

  await resetActive();
  const beside = await leaseCost(['dnslookup']);
  console.log(`one lease alone: ${JSON.stringify(alone)}; beside ${DORMANT} dormant queues: ${JSON.stringify(beside)}`);
  assert.equal(beside.jobs, 8);
  // Before dormant queues left the index, the walk read through every one of them (4,000) and
  // the lift rewrote the 4,000 lagging ones.
  assert.ok(beside.tuplesRead <= alone.tuplesRead + 20, `index tuples read: ${beside.tuplesRead} beside ${DORMANT} dormant queues, ${alone.tuplesRead} alone`);
  assert.ok(beside.rowsUpdated <= alone.rowsUpdated + 5, `rows updated: ${beside.rowsUpdated} beside ${DORMANT} dormant queues, ${alone.rowsUpdated} alone`);
  const [lagging] = await sql`select count(*)::int as n from sched_queues where class = 'STANDARD' and vtime = 0 and tenant_id = any(${ids}::uuid[])`;
  assert.equal(lagging!.n, DORMANT, 'the lift left dormant queues alone');

  // And each comes back by its event: a resume, a lease that does not hold the API.
  await sql.begin((tx) => setTenantSuspended(tx, suspended![0]!, false));
  const [back] = await sql`select tenant_dormant, vtime from sched_queues where tenant_id = ${suspended![0]!} and class = 'STANDARD'`;
  assert.equal(back!.tenant_dormant, false);
  assert.ok((back!.vtime as number) >= 100, 'back at the class clock, no credit for the time away');
  // At most 256 a call (a call's cost stays bounded), so the 1,000 take four calls.
  const heldLeft: number[] = [];
  for (let i = 0; i < 4; i++) {
    await resetActive();
    await leaseCost([]);
    heldLeft.push(((await sql`select count(*)::int as n from sched_queues where held_api is not null`)[0]!.n as number));
  }
  assert.deepEqual(heldLeft, [quarter - 256, quarter - 512, quarter - 768, 0], 'queues held for an API the lease does not hold woke');
});

test('a queue whose jobs are all due later is visited once, then waits for its time out of the walk', async () => {
  await sql`update sched_queues set held_api = null, scheduled = false, ready_at = null, depth = 0 where tenant_id <> all(${active}::uuid[])`;
  const tenantId = (await t.createTenant('tomorrow', 'ENTERPRISE')).id;
  const tomorrow = new Date(Date.now() + 86_400_000);
  await addJobs(tenantId, 'STANDARD', 1, 'exchangerate', tomorrow);
  await resetActive();
  await leaseCost();
  const [q] = await sql`select scheduled, ready_at from sched_queues where tenant_id = ${tenantId} and class = 'STANDARD'`;
  assert.equal(q!.scheduled, true, 'scheduled: out of the fair index');
  assert.ok(Math.abs((q!.ready_at as Date).getTime() - tomorrow.getTime()) < 1000, 'ready when its job is due');
  // Due now (the clock moved on): the next lease's due check brings it back, the one after serves it.
  await sql`update sched_queues set ready_at = now() - interval '1 second' where tenant_id = ${tenantId} and class = 'STANDARD'`;
  await sql`update pgboss.job set start_after = now() - interval '1 second' where name = ${queueName(tenantId, 'STANDARD')}`;
  await resetActive();
  await leaseCost();
  const [woke] = await sql`select scheduled from sched_queues where tenant_id = ${tenantId} and class = 'STANDARD'`;
  assert.equal(woke!.scheduled, false);
  await resetActive();
  const served = await leaseCost();
  assert.ok(served.jobs >= 1);
  const [running] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenantId} and state = 'RUNNING'`;
  assert.equal(running!.n, 1);
});
