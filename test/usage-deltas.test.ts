/**
 * Usage deltas as one settling statement writes them: its aggregates (one per tenant, period,
 * hour, API and class) go in rows of up to 32, column by column, and every reader sees each
 * aggregate once: a tenant's usage history before and after the retention pass folds them, a late
 * settlement's correction row, and the fold itself.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { addUsageCorrection, foldDeltas, usageHistory } from '../src/usage/store.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';

let t: TestApp;
let sql: postgres.Sql;

before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
});

after(async () => {
  await sql?.end();
  await t?.stop();
});

test('one settling statement over 40 tenants writes 2 delta rows; each tenant reads its own aggregate, before and after the fold', async () => {
  const tenants = Array.from({ length: 40 }, () => randomUUID());
  const lease = randomUUID();
  const period = new Date(Date.UTC(2026, 11, 1));
  // Tenant i: i + 1 reservations of 3 credits, the last one refunded.
  for (const [i, tenant] of tenants.entries()) {
    for (let k = 0; k <= i % 3; k++) {
      await sql`insert into reservations (id, job_id, attempt, tenant_id, period_start, "window", node_id, credits, lease_id, created_at)
        values (gen_random_uuid(), gen_random_uuid(), 1, ${tenant}, ${period}, 'w', gen_random_uuid(), 3, ${lease}, now() - interval '2 seconds')`;
    }
  }
  const expected = new Map(tenants.map((tenant, i) => [tenant, { calls: (i % 3) + 1, billed: 3 * (i % 3) }]));
  const [{ n: before }] = (await sql`select count(*)::int as n from usage_deltas`) as unknown as [{ n: number }];
  // One statement settles them all: billed, except each tenant's newest, refunded.
  await sql`
    update reservations r set settled_at = clock_timestamp(), billed = case when x.k = 1 then 0 else r.credits end,
      outcome = case when x.k = 1 then 'refunded' else 'billed' end
    from (select id, row_number() over (partition by tenant_id order by id) as k from reservations where lease_id = ${lease}) x
    where r.id = x.id`;
  const rows = await sql`select cardinality(tenant_ids) as n, cardinality(latency_hists) as hists, array_ndims(latency_hists) as dims from usage_deltas order by id offset ${before}`;
  assert.deepEqual(rows.map((r) => r.n).sort((a, b) => b - a), [32, 8], 'one row per 32 aggregates');
  assert.deepEqual(rows.map((r) => [r.hists, r.dims]).sort((a, b) => b[0] - a[0]), [[32 * 11, 2], [8 * 11, 2]], 'an 11-bucket histogram per aggregate');

  const read = async (tenant: string) => {
    // Every hour of the last day (the statement and a correction may fall either side of an hour).
    const h = await usageHistory(sql, { tenantId: tenant, from: new Date(Date.now() - 86_400_000), to: new Date(Date.now() + 3_600_000), granularity: 'HOUR', groupBy: [] });
    const sum = (f: (r: (typeof h)[number]) => number) => h.reduce((s, r) => s + f(r), 0);
    return { calls: sum((r) => r.calls), billed: sum((r) => r.creditsBilled), refunded: sum((r) => r.creditsRefunded), succeeded: sum((r) => r.succeeded), failed: sum((r) => r.failed), p95: Math.max(0, ...h.map((r) => r.latencyP95Ms ?? 0)) };
  };
  const check = async (when: string) => {
    for (const [i, tenant] of tenants.entries()) {
      const e = expected.get(tenant)!;
      const got = await read(tenant);
      assert.deepEqual(
        { calls: got.calls, billed: got.billed, refunded: got.refunded, succeeded: got.succeeded, failed: got.failed },
        { calls: e.calls, billed: e.billed, refunded: 3 * e.calls - e.billed, succeeded: e.calls - 1, failed: 1 },
        `tenant ${i} ${when}`,
      );
      assert.ok(got.p95 > 0, `tenant ${i} ${when}: its latency histogram was read (${got.p95})`);
    }
  };
  await check('before the fold');

  // A late settlement's correction is a row of its own, read with the rest.
  await addUsageCorrection(sql, { tenantId: tenants[1]!, periodStart: period, api: 'unknown', jobClass: 'UNKNOWN', billedDelta: -1, succeededDelta: 0 });
  expected.get(tenants[1]!)!.billed -= 1;
  const corrected = await read(tenants[1]!);
  assert.deepEqual([corrected.calls, corrected.billed, corrected.refunded], [2, 2, 4], 'the correction moved one credit from billed to refunded, no call');
  expected.get(tenants[1]!)!.billed += 1;
  await addUsageCorrection(sql, { tenantId: tenants[1]!, periodStart: period, api: 'unknown', jobClass: 'UNKNOWN', billedDelta: 1, succeededDelta: 0 });

  // The fold takes delta rows (not aggregates) up to its limit, and each aggregate lands once.
  const waiting = (await sql`select count(*)::int as n from usage_deltas`)[0]!.n as number;
  assert.equal(await foldDeltas(sql, 1), 1);
  let folded = 1;
  for (let f = await foldDeltas(sql, 100); f > 0; f = await foldDeltas(sql, 100)) folded += f;
  assert.equal(folded, waiting);
  assert.equal((await sql`select count(*)::int as n from usage_deltas`)[0]!.n, 0);
  await check('after the fold');
  const [hourly] = await sql`select count(distinct tenant_id)::int as n, sum(credits_billed)::int as billed from usage_hourly where tenant_id = any(${tenants}::uuid[])`;
  assert.deepEqual({ ...hourly }, { n: 40, billed: [...expected.values()].reduce((s, e) => s + e.billed, 0) });
});
