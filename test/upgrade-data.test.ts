/**
 * Upgrades that move state between tables lose none of it: a database migrated to the release
 * before them, holding what a running system holds, then migrated to this build.
 * - The open calls' credits leave the ledger's period rows (`tenant_ledger.reserved`) for the
 *   tenant's row (`sched_tenants.reserved`), summed over the periods; billed credits stay.
 * - Usage deltas not folded yet (one aggregate a row) are folded into `usage_hourly`, added to
 *   hours already there, before the table takes its new shape (many aggregates a row).
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { drizzle } from 'drizzle-orm/postgres-js';
import { migrate } from 'drizzle-orm/postgres-js/migrator';
import { MIGRATIONS_DIR } from '../src/db/functions.ts';
import { runMigrations } from '../src/db/migrate.ts';
import { createTestDatabase } from './helpers/db.ts';

/** The last migration of the release before the moves. */
const BEFORE = '0076_running_jobs_index';

let db: Awaited<ReturnType<typeof createTestDatabase>>;
let sql: postgres.Sql;
let oldMigrations: string;

before(async () => {
  db = await createTestDatabase();
  sql = postgres(db.url, { max: 1, onnotice: () => {} });
  // The migrations folder as that release shipped it: the journal up to BEFORE.
  oldMigrations = mkdtempSync(path.join(tmpdir(), 'sluice-migrations-'));
  cpSync(MIGRATIONS_DIR, oldMigrations, { recursive: true });
  const journalFile = path.join(oldMigrations, 'meta', '_journal.json');
  const journal = JSON.parse(readFileSync(journalFile, 'utf8')) as { entries: Array<{ tag: string }> };
  const last = journal.entries.findIndex((e) => e.tag === BEFORE);
  assert.ok(last >= 0, `${BEFORE} is in the journal`);
  journal.entries = journal.entries.slice(0, last + 1);
  writeFileSync(journalFile, JSON.stringify(journal));
});

after(async () => {
  await sql?.end();
  await db?.drop();
  if (oldMigrations) rmSync(oldMigrations, { recursive: true, force: true });
});

test('reserved credits and unfolded usage deltas survive the upgrade, every credit and call where it belongs', async () => {
  await migrate(drizzle(sql), { migrationsFolder: oldMigrations });
  const [a, b] = [randomUUID(), randomUUID()];
  // Two periods of an anchor on the 15th, and an hour of the second (as text: typed by the columns).
  const may = new Date('2026-11-15T00:00:00Z').toISOString();
  const june = new Date('2026-12-15T00:00:00Z').toISOString();
  const hour = '2026-12-08T02:00:00.000Z';
  for (const t of [a, b]) {
    await sql`insert into tenants (id, name, tier) values (${t}, ${`upgrade-${t.slice(0, 8)}`}, 'PRO')`;
    await sql`insert into sched_tenants (tenant_id, weight, cap, quota, quota_policy, period_anchor, in_flight) values (${t}, 1, 10, 1000, 'WAIT', ${may}, 2)`;
  }
  // Tenant a: calls open in two periods (one reserved across the period's turn); b: nothing open.
  await sql`insert into tenant_ledger (tenant_id, period_start, billed, reserved, refunded) values
    (${a}, ${may}, 10, 5, 1), (${a}, ${june}, 0, 3, 0), (${b}, ${june}, 7, 0, 2)`;
  const hist = (k: number) => Array.from({ length: 11 }, (_, i) => (i === k ? 1 : 0));
  await sql`insert into usage_hourly (tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist)
    values (${a}, ${june}, ${hour}, 'dnslookup', 'STANDARD', 4, 4, 0, 4, 0, ${hist(2).map((x) => x * 4)})`;
  for (const [t, calls, billed, k] of [[a, 1, 1, 2], [a, 2, 1, 3], [a, 1, 0, 3], [b, 3, 3, 0]] as const) {
    await sql`insert into usage_deltas (tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist)
      values (${t}, ${june}, ${hour}, 'dnslookup', 'STANDARD', ${calls}, ${billed}, ${calls - billed}, ${billed}, ${calls - billed}, ${hist(k).map((x) => x * calls)})`;
  }

  await runMigrations(db.url);

  const tenants = await sql`select tenant_id, reserved::int, in_flight from sched_tenants order by tenant_id`;
  assert.deepEqual(
    Object.fromEntries(tenants.map((r) => [r.tenant_id as string, [r.reserved, r.in_flight]])),
    { [a]: [8, 2], [b]: [0, 2] },
    'each tenant holds the credits its periods had reserved',
  );
  const ledger = await sql`
    select tenant_id, to_char(period_start at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') as period, billed::int, refunded::int from tenant_ledger`;
  assert.deepEqual(
    Object.fromEntries(ledger.map((r) => [`${r.tenant_id}/${r.period}`, [r.billed, r.refunded]])),
    { [`${a}/${may}`]: [10, 1], [`${a}/${june}`]: [0, 0], [`${b}/${june}`]: [7, 2] },
    'billed and refunded credits are unchanged',
  );
  const [{ n: reservedColumns }] = (await sql`select count(*)::int as n from information_schema.columns where table_name = 'tenant_ledger' and column_name = 'reserved'`) as unknown as [{ n: number }];
  assert.equal(reservedColumns, 0);

  const hours = await sql`select tenant_id, calls, succeeded, failed, credits_billed::int as billed, credits_refunded::int as refunded, latency_hist from usage_hourly`;
  assert.deepEqual(
    Object.fromEntries(hours.map((r) => [r.tenant_id as string, [r.calls, r.succeeded, r.failed, r.billed, r.refunded, r.latency_hist]])),
    {
      [a]: [8, 6, 2, 6, 2, [0, 0, 5, 3, 0, 0, 0, 0, 0, 0, 0]],
      [b]: [3, 3, 0, 3, 0, [3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]],
    },
    'the waiting deltas were added to the hours (a: its hour had 4 calls already)',
  );
  assert.equal((await sql`select count(*)::int as n from usage_deltas`)[0]!.n, 0);
});
