/**
 * Migration 0022: a lease ends by lifting the ready queues that lag the class clock by more than 8
 * to the clock, so no queue is later served alone to catch up on service it could not have had
 * (its tenant at its cap, or marked ready at a clock the lease then moved). Against real Postgres,
 * one sluice_lease call at a time: the lagging queue is lifted, one within the slack keeps its
 * place, and a lagging queue whose row another transaction holds is left alone, not waited for.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startTestApp, type TestApp } from './helpers/app.ts';
import { leaseOnce, queueJobs, unlimitedWindow } from './helpers/lease.ts';

const WINDOW = 'lagging';

let t: TestApp;
let sql: postgres.Sql;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 3, transform: { undefined: null }, onnotice: () => {} });
  await unlimitedWindow(sql, WINDOW);
});

after(async () => {
  await sql?.end();
  await t?.stop();
});

/** A tenant with `n` STANDARD jobs waiting, its queue at virtual time `vtime`; capped (cannot be served) or not. */
async function tenantWithJobs(name: string, n: number, vtime: number, capped: boolean): Promise<string> {
  const id = (await t.createTenant(name, 'ENTERPRISE')).id;
  assert.equal(await queueJobs(sql, [id], n, name), n);
  await sql`update sched_queues set vtime = ${vtime} where tenant_id = ${id} and class = 'STANDARD'`;
  if (capped) await sql`update sched_tenants set in_flight = cap where tenant_id = ${id}`;
  return id;
}

const vtimeOf = async (tenantId: string) => Number((await sql`select vtime from sched_queues where tenant_id = ${tenantId} and class = 'STANDARD'`)[0]!.vtime);
const clock = async () => Number((await sql`select clock from sched_classes where class = 'STANDARD'`)[0]!.clock);

test('a lease lifts the queues lagging its new clock by more than 8, keeps the others, and never waits for one', async () => {
  await sql`update sched_classes set clock = 100 where class = 'STANDARD'`;
  const served = await tenantWithJobs('lag-served', 3, 100, false);
  const behind = await tenantWithJobs('lag-behind', 5, 50, true);
  const near = await tenantWithJobs('lag-near', 5, 96, true);
  const held = await tenantWithJobs('lag-held', 5, 20, true);

  // Another transaction holds the held queue's row through the lease.
  let release!: () => void;
  const until = new Promise<void>((r) => (release = r));
  let locked!: () => void;
  const isLocked = new Promise<void>((r) => (locked = r));
  const holder = sql.begin(async (tx) => {
    await tx`select 1 from sched_queues where tenant_id = ${held} and class = 'STANDARD' for update`;
    locked();
    await until;
  });
  await isLocked;
  const rows = await leaseOnce(sql, WINDOW);
  release();
  await holder;

  assert.deepEqual([...new Set(rows.map((r) => r.tenantId))], [served], 'only the tenant below its cap was served');
  assert.equal(rows.length, 3);
  const [w] = await sql`select weight from sched_tenants where tenant_id = ${served}`;
  const now = await clock();
  assert.equal(now, 100 + 2 / Number(w!.weight), "the clock: the start tag of the served turn's last job");
  assert.equal(await vtimeOf(behind), now, 'lagging by ~50: lifted to the clock');
  assert.equal(await vtimeOf(near), 96, 'lagging by ~4-6 (within the slack): keeps its place');
  assert.equal(await vtimeOf(held), 20, 'its row was held: left alone, the lease did not wait');
  assert.equal(await vtimeOf(served), 100 + 3 / Number(w!.weight), 'the served queue advanced by its jobs over its weight');
});
