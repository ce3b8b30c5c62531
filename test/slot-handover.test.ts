/**
 * Slot handover (migration 0021): a lease may take over the pool slots of this node's calls that
 * have returned but are not settled yet. Against real Postgres: a slot is carried by exactly one
 * open reservation or one delta row at every step (the window's count equals the slot-carrying
 * open reservations), so the pool's bound holds; a settled, foreign or locked reservation hands
 * over nothing; and the old reservation's settlement releases no slot.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { newJobIds } from '../src/jobs/ids.ts';
import { insertJobsQueued, type NewJobRow } from '../src/jobs/store.ts';
import { slotPassesOn } from '../src/provider/classify.ts';
import { leaseJobs, markManyQueuesReady, settleGroup, type LeaseRow } from '../src/scheduler/store.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';

const WINDOW = 'handover';
const POOL = 2;
const NODE = randomUUID();

let t: TestApp;
let sql: postgres.Sql;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 3, transform: { undefined: null }, onnotice: () => {} });
});

after(async () => {
  await sql?.end();
  await t?.stop();
});

function lease(handover: string[], node = NODE): Promise<LeaseRow[]> {
  return leaseJobs(sql, {
    window: WINDOW, nodeId: node, pool: POOL, max: 256, leaseMax: 8, classes: ['INTERACTIVE', 'STANDARD', 'BULK'], leaseSeconds: 30,
    costs: { dnslookup: 1 }, hold: [], batch: {}, batchMax: 1, batchQuantum: 1, handover,
  });
}

function settle(rows: readonly LeaseRow[]) {
  return settleGroup(sql, rows.map((r) => ({
    id: r.reservationId, tenantId: r.tenantId, billed: 1, outcome: 'billed',
    finish: { id: r.jobId, attempt: r.attempt, state: 'SUCCEEDED' as const, queue: r.queue, result: { data: { ok: true }, errorCode: null, errorMessage: null, httpStatus: 200, creditsBilled: 1, attempts: r.attempt } },
  })));
}

/** The window's slots in use (its row plus unfolded deltas) and the open reservations carrying one. */
async function slots(): Promise<{ counted: number; carried: number }> {
  const [r] = await sql`
    select (select in_flight from windows where name = ${WINDOW}) + coalesce((select sum(n) from window_slot_deltas where "window" = ${WINDOW}), 0) as counted,
      (select count(*) from reservations where "window" = ${WINDOW} and settled_at is null and window_slot) as carried`;
  return { counted: Number(r!.counted), carried: Number(r!.carried) };
}

async function assertSlotsCarried(step: string): Promise<number> {
  const s = await slots();
  assert.equal(s.counted, s.carried, `${step}: the window counts ${s.counted} slots, open reservations carry ${s.carried}`);
  assert.ok(s.counted <= POOL, `${step}: ${s.counted} slots in use, pool ${POOL}`);
  return s.counted;
}

test('slotPassesOn: only a call whose job simply completes or fails hands its slot on', () => {
  assert.equal(slotPassesOn('complete'), true);
  assert.equal(slotPassesOn('fail'), true);
  assert.equal(slotPassesOn('retry'), false);
  assert.equal(slotPassesOn('put_back'), false);
});

test('a lease takes over the slots of returned calls; every slot stays carried by one reservation', async () => {
  const tenant = (await t.createTenant('handover', 'ENTERPRISE')).id;
  await sql`insert into windows (name, rate_per_minute, burst, tokens) values (${WINDOW}, null, 0, 0) on conflict do nothing`;
  const ids = newJobIds(6);
  const jobs: NewJobRow[] = ids.map((id, i) => ({ id, tenantId: tenant, state: 'QUEUED' as const, api: 'dnslookup', params: { domain: `h${i}.example` }, priority: 'STANDARD' as const, idempotencyKey: null }));
  await sql.begin(async (tx) => {
    await insertJobsQueued(tx, jobs);
    await markManyQueuesReady(tx, [{ tenantId: tenant, jobClass: 'STANDARD' }]);
  });

  const first = await lease([]);
  assert.equal(first.length, POOL, 'the first lease fills the pool');
  assert.equal(await assertSlotsCarried('after the first lease'), POOL);
  assert.equal((await lease([])).length, 0, 'a full pool leases nothing without a handover');

  // Another node's reservation, or this node's passed to another node's lease: nothing to take over.
  assert.equal((await lease([first[0]!.reservationId], randomUUID())).length, 0, "another node cannot take this node's slot");

  // A reservation a settlement holds is skipped, not waited for.
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  let locked!: () => void;
  const isLocked = new Promise<void>((r) => (locked = r));
  const holder = sql.begin(async (tx) => {
    await tx`select 1 from reservations where id = ${first[0]!.reservationId} for update`;
    locked();
    await held;
  });
  await isLocked;
  assert.equal((await lease([first[0]!.reservationId])).length, 0, 'a locked reservation hands over nothing');
  release();
  await holder;

  // The first call returned: its slot goes to the next job at once.
  const second = await lease([first[0]!.reservationId]);
  assert.equal(second.length, 1, 'one slot handed over, one job leased');
  assert.equal(second[0]!.windowSlot, true, 'the new reservation carries the slot');
  const [old] = await sql`select window_slot from reservations where id = ${first[0]!.reservationId}`;
  assert.equal(old!.window_slot, false, 'the old reservation no longer carries it');
  assert.equal(await assertSlotsCarried('after the handover'), POOL);

  // Passed again (its settlement has not landed yet): it carries nothing any more.
  assert.equal((await lease([first[0]!.reservationId])).length, 0, 'a slot is handed over once');

  // The old reservation settles without giving back a slot it no longer carries.
  assert.equal((await settle([first[0]!])).size, 1);
  assert.equal(await assertSlotsCarried("after the old reservation's settlement"), POOL);

  // A settled reservation hands over nothing; an open one still does.
  const third = await lease([first[0]!.reservationId, first[1]!.reservationId]);
  assert.equal(third.length, 1, "only the open reservation's slot");
  assert.equal(await assertSlotsCarried('after the second handover'), POOL);

  // Everything settles: every slot comes back, none twice.
  assert.equal((await settle([first[1]!, ...second, ...third])).size, 3);
  assert.equal(await assertSlotsCarried('after every settlement'), 0);
  const rest = await lease([]);
  assert.equal(rest.length, POOL, 'the pool is whole again');
  await settle(rest);
  assert.equal(await assertSlotsCarried('at the end'), 0);
  const [left] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant} and state = 'QUEUED'`;
  assert.equal(left!.n, 0, 'every job was leased');
});
