/**
 * What the operator console reads beyond the tenant and system views. The tenants table: one page of tenants, sorted and
 * filtered in Postgres so it stays fast with 10,000 of them. Sorting by depth
 * or in-flight reads the trigger-kept counters (sched_queues, sched_tenants),
 * never counts job rows. The per-row details (queues, usage) are resolved for
 * the page only.
 */
import type { Sql } from '../db/client.ts';
import type { Services } from '../graphql/context.ts';
import { readAccount } from '../scheduler/sql/account.ts';
import { readBreakers } from '../scheduler/sql/breakers.ts';
import { tenantsQueues } from '../scheduler/sql/queues.ts';
import { readWindows } from '../scheduler/sql/windows.ts';
import { effectiveLimits, quotaPeriod, type TenantRecord } from '../tenants/policy.ts';
import { classStatuses, type QueueStatus, type Usage } from './status.ts';

export const TENANT_ORDERS = ['NAME', 'CREATED_AT', 'TIER', 'DEPTH', 'IN_FLIGHT'] as const;
export type TenantOrder = (typeof TENANT_ORDERS)[number];

export interface TenantPageQuery {
  first: number;
  offset: number;
  orderBy: TenantOrder;
  descending: boolean;
  nameContains: string | null;
  tier: string | null;
}

export const MAX_TENANT_PAGE = 200;

/** Clamps a page request to what the table serves; pure. */
export function normalizePage(q: { first?: number | null; offset?: number | null }): { first: number; offset: number } {
  const first = Math.min(MAX_TENANT_PAGE, Math.max(1, Math.trunc(q.first ?? 25)));
  const offset = Math.max(0, Math.trunc(q.offset ?? 0));
  return { first, offset };
}

/** `%` and `_` typed in the filter match themselves, not any characters; pure. */
export function likePattern(text: string): string {
  return `%${text.replace(/[\\%_]/g, (c) => `\\${c}`)}%`;
}

export async function tenantPage(sql: Sql, q: TenantPageQuery): Promise<{ ids: string[]; totalCount: number }> {
  const column = {
    NAME: sql`t.name`,
    CREATED_AT: sql`t.created_at`,
    TIER: sql`t.tier`,
    DEPTH: sql`coalesce(d.depth, 0)`,
    IN_FLIGHT: sql`coalesce(s.in_flight, 0)`,
  }[q.orderBy];
  const direction = q.descending ? sql`desc` : sql`asc`;
  const rows = await sql`
    select t.id, count(*) over () as total
    from tenants t
    left join sched_tenants s on s.tenant_id = t.id
    left join (select tenant_id, sum(depth)::int as depth from sched_queues group by tenant_id) d on d.tenant_id = t.id
    where ${q.nameContains ? sql`t.name ilike ${likePattern(q.nameContains)}` : sql`true`}
      and ${q.tier ? sql`t.tier = ${q.tier}` : sql`true`}
    order by ${column} ${direction}, t.id ${direction}
    limit ${q.first} offset ${q.offset}`;
  if (rows.length === 0 && q.offset > 0) {
    // Past the end: still report how many match, so the pager can go back.
    const [c] = await sql`select count(*)::int as n from tenants t
      where ${q.nameContains ? sql`t.name ilike ${likePattern(q.nameContains)}` : sql`true`} and ${q.tier ? sql`t.tier = ${q.tier}` : sql`true`}`;
    return { ids: [], totalCount: c!.n as number };
  }
  return { ids: rows.map((r) => r.id as string), totalCount: rows.length ? Number(rows[0]!.total) : 0 };
}

export interface TenantRowStatus {
  /** Per class as in `me.queues`, without the drain estimate (three reads per busy class: too dear for a table). */
  queues: Array<Omit<QueueStatus, 'estimatedDrainSeconds'> & { estimatedDrainSeconds: null }>;
  usage: Usage;
}

/**
 * The live columns of a page of tenants in a handful of statements, whatever
 * the page size: their queues, scheduler rows and ledgers at once, the shared
 * machinery once; the wait reasons come from the same pure classStatuses as
 * `me.queues`.
 */
export async function tenantRowsStatus(services: Services, tenants: readonly TenantRecord[]): Promise<Map<string, TenantRowStatus>> {
  const { sql } = services;
  const ids = tenants.map((t) => t.id);
  const now = new Date();
  const periods = new Map(tenants.map((t) => [t.id, quotaPeriod(t.periodAnchor, now)]));
  const [queueRows, stateRows, ledgerRows, windows, account, breakers] = await Promise.all([
    tenantsQueues(sql, ids),
    sql`select tenant_id, in_flight, cap, weight, quota_blocked, suspended, reserved from sched_tenants where tenant_id = any(${ids}::uuid[])`,
    sql`
      select l.tenant_id, l.billed from tenant_ledger l
      join unnest(${ids}::uuid[], ${tenants.map((t) => periods.get(t.id)!.start.toISOString())}::timestamptz[]) as p(tenant_id, period_start)
        on p.tenant_id = l.tenant_id and p.period_start = l.period_start`,
    readWindows(sql),
    readAccount(sql),
    readBreakers(sql),
  ]);
  const out = new Map<string, TenantRowStatus>();
  for (const tenant of tenants) {
    const queues = queueRows.get(tenant.id) ?? [];
    const s = stateRows.find((r) => r.tenant_id === tenant.id);
    const state = s ? { inFlight: s.in_flight as number, cap: s.cap as number, weight: s.weight as number, quotaBlocked: s.quota_blocked as boolean, suspended: s.suspended as boolean } : null;
    const ledger = ledgerRows.find((r) => r.tenant_id === tenant.id);
    const period = periods.get(tenant.id)!;
    out.set(tenant.id, {
      queues: classStatuses(services.windows, tenant, { queues, state, windows, account, breakers }).map((q) => ({ ...q, estimatedDrainSeconds: null })),
      usage: {
        creditsUsed: Number(ledger?.billed ?? 0),
        creditsReserved: Number(s?.reserved ?? 0),
        quota: effectiveLimits(tenant).monthlyQuota,
        periodStart: period.start,
        periodEnd: period.end,
      },
    });
  }
  return out;
}
