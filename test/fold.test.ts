/**
 * The RUNNING fold (drizzle/functions/sluice_fold_running.sql) never waits for a queue row: a lease or a
 * submission group may hold several sched_queues rows at once in its own order, and a fold that
 * waited for one of them while holding others deadlocked with it (seen with 2 and 4 worker
 * processes in bench dispatch). A held row's deltas stay for the next round, and readers count
 * them meanwhile.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startTestApp, type TestApp } from './helpers/app.ts';

let t: TestApp;
let sql: postgres.Sql;
const ids: string[] = [];

before(async () => {
  // API role: no sweeper of its own folds behind the test's back.
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 4, onnotice: () => {} });
  for (const name of ['fold-a', 'fold-b']) ids.push((await t.createTenant(name)).id);
});

after(async () => {
  await sql?.end();
  await t?.stop();
});

const running = async (tenantId: string) =>
  (await sql`select running from sched_queues where tenant_id = ${tenantId} and class = 'STANDARD'`)[0]!.running as number;

test('a fold skips a queue row another transaction holds, folds the rest, and folds the held one later', async () => {
  const [a, b] = ids as [string, string];
  await sql`insert into sched_running_deltas (tenant_id, class, n) values (${a}, 'STANDARD', 2), (${a}, 'STANDARD', 1), (${b}, 'STANDARD', 3)`;
  const holder = await sql.reserve();
  try {
    await holder`begin`;
    await holder`select 1 from sched_queues where tenant_id = ${a} and class = 'STANDARD' for update`;
    // If the fold waited for the held row it would hit this lock_timeout and fail the test.
    const folded = await sql.begin(async (tx) => {
      await tx`set local lock_timeout = '3s'`;
      return (await tx`select sluice_fold_running() as n`)[0]!.n as number;
    });
    assert.equal(folded, 1, 'only the free queue folded (one delta)');
    assert.equal(await running(b), 3);
    assert.equal(await running(a), 0, 'the held queue is untouched');
    const [left] = await sql`select coalesce(sum(n), 0)::int as n from sched_running_deltas where tenant_id = ${a}`;
    assert.equal(left!.n, 3, "the held queue's deltas wait for the next round");
    await holder`commit`;
  } finally {
    holder.release();
  }
  const [again] = await sql`select sluice_fold_running() as n`;
  assert.equal(again!.n, 2, 'the next round folds the two deltas it left');
  assert.equal(await running(a), 3);
  const [none] = await sql`select count(*)::int as n from sched_running_deltas`;
  assert.equal(none!.n, 0);
});

test('a fold steps aside while a lease runs on any window (its queue rows would be passed over), and folds when forced', async () => {
  const [a] = ids as [string, string];
  const before = await running(a);
  await sql`insert into sched_running_deltas (tenant_id, class, n) values (${a}, 'STANDARD', 4)`;
  const [w] = await sql`select name from windows order by name limit 1`;
  const lease = await sql.reserve();
  try {
    // What sluice_lease holds while it runs: its window's try-lock.
    await lease`begin`;
    const [got] = await lease`select pg_try_advisory_xact_lock(hashtext('sluice_lease'), hashtext(${w!.name})) as ok`;
    assert.equal(got!.ok, true);
    const [aside] = await sql`select sluice_fold_running() as n`;
    assert.equal(aside!.n, -1, 'stepped aside');
    assert.equal(await running(a), before, 'nothing folded');
    const [forced] = await sql`select sluice_fold_running(true) as n`;
    assert.equal(forced!.n, 1, 'forced: folds with the lease running');
    assert.equal(await running(a), before + 4);
    await lease`commit`;
  } finally {
    lease.release();
  }
  // The lease ended: an unforced fold runs again (nothing left to fold).
  const [free] = await sql`select sluice_fold_running() as n`;
  assert.equal(free!.n, 0);
});
