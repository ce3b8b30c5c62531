/**
 * The hot path's set-based statements find their rows by key (migration 0020): a submission, a
 * lease, a settlement and visibility's running counts, run on a connection with auto_explain reporting every
 * nested statement's plan, never scan a whole hot table. Without 0020 the planner, guessing 100
 * rows for each jsonb list, hashed the list against a sequential scan of `jobs`, `sched_tenants`,
 * `sched_queues` or `tenant_ledger`: a lease's and a settlement's cost grew with every tenant and
 * job stored (10,000 tenants: 0.3 ms a queue in the depth trigger alone).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { anyQueueReady, classTotals, tenantsQueues } from '../src/scheduler/sql/queues.ts';
import { settleGroup, warmSettleGroup } from '../src/scheduler/sql/reservations.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';
import { leaseOnce, queueJobs, unlimitedWindow } from './helpers/lease.ts';

const WINDOW = 'index-lookups';
const HOT = /Seq Scan on (jobs|sched_tenants|sched_queues|tenant_ledger|reservations|lease_sends|tenants)\s/;

let t: TestApp;
let plans: string[] = [];
let sql: postgres.Sql;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  // One connection: auto_explain is loaded into it, and every plan comes back as a NOTICE.
  sql = postgres(t.databaseUrl, { max: 1, transform: { undefined: null }, onnotice: (n) => plans.push(String(n.message)) });
  await sql`load 'auto_explain'`;
  await sql`select set_config('auto_explain.log_min_duration', '0', false), set_config('auto_explain.log_nested_statements', 'on', false),
    set_config('auto_explain.log_level', 'notice', false)`;
});

after(async () => {
  await sql?.end();
  await t?.stop();
});

function scans(from: string[]): string[] {
  return from.filter((p) => HOT.test(p)).map((p) => p.split('\n').slice(0, 12).join('\n'));
}

test('submission, lease, settlement and the running counts look their rows up by key', async () => {
  const tenants: string[] = [];
  for (let i = 0; i < 6; i++) tenants.push((await t.createTenant(`lookup-${i}`, 'ENTERPRISE')).id);
  await unlimitedWindow(sql, WINDOW);
  const total = tenants.length * 3;

  plans = [];
  assert.equal(await queueJobs(sql, tenants, 3, 'd'), total);
  const submitPlans = plans;

  plans = [];
  const leased = await leaseOnce(sql, WINDOW);
  assert.equal(leased.length, total, 'the lease took every job');
  const leasePlans = plans;
  // The commit took the claimed jobs out of their queues' depth itself; visibility counts them as
  // running from jobs' own rows, through the index that holds only running jobs.
  plans = [];
  const [after] = await sql`select (select coalesce(sum(depth), 0) from sched_queues)::int as depth`;
  assert.deepEqual(after, { depth: 0 });
  plans = [];
  const byTenant = await tenantsQueues(sql, tenants);
  const byClass = await classTotals(sql);
  const countPlans = plans;
  assert.deepEqual(tenants.map((id) => byTenant.get(id)?.find((q) => q.jobClass === 'STANDARD')?.running), tenants.map(() => 3));
  assert.equal(byClass.find((c) => c.jobClass === 'STANDARD')?.running, total);
  // The queue rows these status reads walk are theirs to scan (classTotals sums every queue by
  // design); jobs, never: the running count reads the index that holds only running jobs.
  assert.match(countPlans.join('\n'), /jobs_running_idx/, 'the running counts read the index of running jobs');
  assert.deepEqual(countPlans.filter((p) => /Seq Scan on jobs\s/.test(p)), [], 'a running count scanned jobs');

  plans = [];
  const { settled, events } = await settleGroup(sql, leased.map((r) => ({
    id: r.reservationId, tenantId: r.tenantId, billed: 1, outcome: 'billed',
    finish: { id: r.jobId, attempt: r.attempt, state: 'SUCCEEDED' as const, queue: r.queue, result: { data: { ok: true }, errorCode: null, errorMessage: null, httpStatus: 200, creditsBilled: 1, attempts: r.attempt } },
  })));
  assert.equal(settled.size, leased.length, 'the group settled every reservation');
  // It hands back what it sent: one final-state payload per job, with its row.
  assert.deepEqual(events.map((e) => (JSON.parse(e) as { jobId: string; state: string; job?: { state: string } })).map((e) => [e.jobId, e.state, e.job?.state]).sort(), leased.map((r) => [r.jobId, 'SUCCEEDED', 'SUCCEEDED']).sort());
  const settlePlans = plans;

  const [done] = await sql`select count(*)::int as n from jobs where state = 'SUCCEEDED'`;
  assert.equal(done!.n, total);

  // The plans were reported (a check that cannot see them would pass vacuously), and the rows
  // were found through an index: the claim's jobs, the settlement's jobs and tenants, the depth.
  for (const [name, got] of [['submission', submitPlans], ['lease', leasePlans], ['settlement', settlePlans]] as const) {
    assert.ok(got.length > 0, `auto_explain reported no plan for the ${name}`);
    assert.deepEqual(scans(got), [], `the ${name} scanned a whole hot table`);
  }
  const all = [...leasePlans, ...settlePlans].join('\n');
  assert.match(all, /Index Scan using jobs_pkey on jobs/);
  assert.match(all, /Index (Only )?Scan using sched_tenants_pkey on sched_tenants/);
  assert.match(all, /Index Scan using sched_queues_tenant_id_class_pk on sched_queues/);
  // The depth counters are updated, and so locked, in key order: no plan of that update may hash
  // (a hash join would meet the rows in the delta's order; docs/ARCHITECTURE.md "Lock order").
  const depth = [...submitPlans, ...leasePlans, ...settlePlans].filter((p) => p.includes('UPDATE sched_queues q SET depth'));
  assert.ok(submitPlans.some((p) => p.includes('UPDATE sched_queues q SET depth')), 'auto_explain reported the depth update of the submission');
  for (const p of depth) assert.doesNotMatch(p, /Hash Join|Hash Semi Join|HashAggregate/, p);
  // The lease's claim leaves its queues' depth to the commit, which writes it with the virtual
  // time on rows the lease holds already (one write a queue).
  assert.ok(!leasePlans.some((p) => p.includes('UPDATE sched_queues q SET depth')), 'the claim\'s depth trigger updated the queues');
  assert.ok(leasePlans.some((p) => p.includes('UPDATE sched_queues sq SET vtime = x.v, depth')), 'auto_explain reported the commit\'s queue write');
  assert.equal((await classTotals(sql)).find((c) => c.jobClass === 'STANDARD')?.running, 0, 'the settlement took every running job back out');
});

test('the settlement warm-up runs every statement of the settlement on empty sets, and writes nothing', async () => {
  const counts = async () => (await sql`select (select count(*) from window_slot_deltas)::int as slots, (select count(*) from usage_deltas)::int as usage,
    (select count(*) from reservations where settled_at is null)::int as open`)[0];
  const before = await counts();
  plans = [];
  await warmSettleGroup(sql, 1);
  const all = plans.join('\n');
  // Each step of sluice_settle_group and what it calls was planned and run on this connection,
  // the last ones included (the tenants' rows, the ledger, the window's slots): the steps an early
  // return on nothing to settle used to skip, so a first real settlement planned them.
  for (const statement of [/FOR UPDATE/, /UPDATE jobs j SET state/, /UPDATE jobs j SET credits_billed/, /UPDATE pgboss\.job j SET completed_on/, /UPDATE reservations r SET settled_at/, /INSERT INTO usage_deltas/, /pg_notify\('sluice_job_events'/, /FROM sched_tenants t/, /UPDATE tenant_ledger l/, /INSERT INTO window_slot_deltas/]) {
    assert.match(all, statement);
  }
  assert.deepEqual(scans(plans), [], 'the warm-up scanned a whole hot table');
  assert.deepEqual(await counts(), before, 'the warm-up changed nothing');
});

test("the warm-up's skip check sees a queue ready to lease, not a dormant one, and finds it in the fair index", async () => {
  // What an idle start looks like: no queue in the fair index (this app has no dispatcher: nothing moves them).
  await sql`update sched_queues set ready_at = null`;
  assert.equal(await anyQueueReady(sql), false, 'an idle database has no queue ready');
  const tenant = (await t.createTenant('warm-skip', 'ENTERPRISE')).id;
  await queueJobs(sql, [tenant], 2, 'w');
  assert.equal(await anyQueueReady(sql), true, 'a backlog is a queue ready to lease');
  // Suspended (as setTenantSuspended leaves its queues): work waits, but no lease would take it.
  await sql`update sched_queues set tenant_dormant = true where tenant_id = ${tenant}`;
  assert.equal(await anyQueueReady(sql), false, 'a dormant queue does not skip the warm-up');
  // The probe is the fair index's, so it costs one index probe however many queues there are
  // (its own plan, as auto_explain reports it; seq scans off: this table is a few rows here).
  plans = [];
  await sql.begin(async (tx) => {
    await tx`set local enable_seqscan = off`;
    await anyQueueReady(tx);
  });
  assert.match(plans.join('\n'), /sched_queues_fair_idx/);
});
