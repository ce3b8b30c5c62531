/**
 * `npm run bench -- console`: how fast the console's reads answer with 10,000
 * tenants. A fresh database, a Sluice API process (SLUICE_ROLE=api, demo
 * simulator; no dispatcher), then --tenants (10,000) tenants in bulk SQL with
 * their scheduler rows (random depths per class, so sorting by depth has work
 * to do). Each query is sent over HTTP --repeats times (first answer dropped
 * as warm-up): tenantTable pages of 25 rows sorted by every order, the first
 * and the last page, a name filter; and `system` (what systemStatus pushes).
 */
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { CLASSES } from '../src/config/classes.ts';
import type { FlagReader } from './lib/args.ts';
import { gql } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, median, percentile, round, type Check } from './lib/stats.ts';

export const description = 'console reads with 10,000 tenants: tenantTable pages (every order, first/last page, filter) and system, over HTTP';

const TABLE = `query($first: Int, $offset: Int, $orderBy: TenantOrder, $descending: Boolean, $nameContains: String) {
  tenantTable(first: $first, offset: $offset, orderBy: $orderBy, descending: $descending, nameContains: $nameContains) {
    totalCount rows { tenant { id name tier weight concurrencyCap monthlyQuota queueBound quotaPolicy }
      queues { priority depth running waitReason } usage { creditsUsed creditsReserved quota } }
  }
}`;
const SYSTEM = `{ system { account { creditsRemaining } windows { name tokens busy poolSize callsPerSecond }
  classes { priority depth oldestAgeSeconds agePromiseSeconds } alerts { key } breakers { api state } estimatedDrainSeconds } }`;

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const tenants = flags.number('tenants', 10_000);
  const repeats = flags.number('repeats', 7);
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const db = await freshDatabase(pg.adminUrl, 'console');
  const sql = postgres(db.url, { max: 1, onnotice: () => {} });
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  try {
    sluice = await startSluiceFor({ DATABASE_URL: db.url, SLUICE_ROLE: 'api', ...extraEnv }, mode);
    const url = sluice.url!;
    progress(`inserting ${tenants} tenants`);
    const ids = Array.from({ length: tenants }, () => randomUUID());
    await sql.begin(async (tx) => {
      await tx`insert into tenants (id, name, tier) select id, 'tenant-' || lpad(n::text, 5, '0'), (array['FREE','PRO','ENTERPRISE'])[1 + n % 3]
        from unnest(${ids}::uuid[]) with ordinality as x(id, n)`;
      await tx`insert into sched_tenants (tenant_id, weight, cap, quota, quota_policy, period_anchor)
        select id, 2, 8, 100000, 'WAIT', now() from unnest(${ids}::uuid[]) as id`;
      await tx`insert into sched_queues (tenant_id, class, depth)
        select t, c, (random() * 50)::int from unnest(${ids}::uuid[]) as t cross join unnest(${CLASSES as unknown as string[]}::text[]) as c`;
    });

    const cases: Array<[string, string, Record<string, unknown>]> = [
      ['table NAME first page', TABLE, { first: 25, offset: 0, orderBy: 'NAME' }],
      ['table NAME last page', TABLE, { first: 25, offset: tenants - 25, orderBy: 'NAME' }],
      ['table CREATED_AT desc', TABLE, { first: 25, offset: 0, orderBy: 'CREATED_AT', descending: true }],
      ['table TIER', TABLE, { first: 25, offset: 0, orderBy: 'TIER' }],
      ['table DEPTH desc', TABLE, { first: 25, offset: 0, orderBy: 'DEPTH', descending: true }],
      ['table IN_FLIGHT desc', TABLE, { first: 25, offset: 0, orderBy: 'IN_FLIGHT', descending: true }],
      ['table name filter', TABLE, { first: 25, offset: 0, orderBy: 'NAME', nameContains: '777' }],
      ['system', SYSTEM, {}],
    ];
    const results: Record<string, { medianMs: number; p95Ms: number; samples: number }> = {};
    const cpu = cpuMeter();
    for (const [name, query, variables] of cases) {
      const times: number[] = [];
      for (let i = 0; i <= repeats; i++) {
        const t0 = performance.now();
        const data = await gql(url, ADMIN_TOKEN, query, variables);
        const ms = performance.now() - t0;
        if (i === 0 && query === TABLE && (data as { tenantTable: { rows: unknown[] } }).tenantTable.rows.length === 0) throw new Error(`${name}: no rows`);
        if (i > 0) times.push(ms);
      }
      results[name] = { medianMs: round(median(times), 1), p95Ms: round(percentile(times, 95), 1), samples: times.length };
      progress(`${name}: median ${results[name]!.medianMs} ms`);
    }
    const busy = cpu.end();
    const worstTable = Math.max(...Object.entries(results).filter(([k]) => k.startsWith('table')).map(([, v]) => v.medianMs));
    const targets: Record<string, Check> = {
      tenantTablePageMedianMs: check(worstTable, 'slowest tenantTable page (25 rows) median < 500 ms with 10,000 tenants', worstTable < 500),
      systemMedianMs: check(results.system!.medianMs, 'system median < 200 ms', results.system!.medianMs < 200),
    };
    return {
      summary: { tenants, repeats, results, cpuBusyShare: busy },
      targets,
      setup: { mode, tenantsInsertedBy: 'bulk SQL: tenants, sched_tenants, sched_queues with random depths 0-50 (no pg-boss queues: the table reads none)', queries: 'over HTTP as the admin, one at a time' },
    };
  } finally {
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sluice) await sluice.stop().catch(() => null);
    await db.drop();
  }
}
