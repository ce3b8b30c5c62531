/**
 * The statements on sched_tenants: the scheduler's copy of each tenant's limits, its in-flight count,
 * its quota block and its suspension. The lease and the settlement write it too, in SQL (sluice_lease,
 * sluice_release_settled).
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';
import { queueQuotaWaitingJobs } from '../../jobs/store.ts';
import type { JobClass } from '../../config/classes.ts';
import { effectiveLimits, type TenantRecord } from '../../tenants/policy.ts';
import { addQueues, markQueuesReady, syncQueuesDormancy } from './queues.ts';

/** Keeps the scheduler's copy of a tenant's limits in step with the tenant (same transaction). */
export async function syncTenant(tx: Tx, t: TenantRecord): Promise<void> {
  const l = effectiveLimits(t);
  await tx`
    insert into sched_tenants (tenant_id, weight, cap, quota, quota_policy, period_anchor, reserved_share)
    values (${t.id}, ${l.weight}, ${l.concurrencyCap}, ${l.monthlyQuota}, ${t.quotaPolicy}, ${t.periodAnchor}, ${t.reservedShare ?? 0})
    on conflict (tenant_id) do update set weight = excluded.weight, cap = excluded.cap, quota = excluded.quota,
      quota_policy = excluded.quota_policy, period_anchor = excluded.period_anchor, reserved_share = excluded.reserved_share`;
  await addQueues(tx, t.id);
}

/** Tenants with no scheduler row yet (created before the scheduler existed, or mid-creation when a process died). */
export async function unscheduledTenantIds(sql: Tx): Promise<string[]> {
  const rows = await sql`select id from tenants t where not exists (select 1 from sched_tenants s where s.tenant_id = t.id)`;
  return rows.map((r) => r.id as string);
}

export async function tenantSchedState(sql: Tx, tenantId: string): Promise<{ inFlight: number; cap: number; weight: number; quotaBlocked: boolean; suspended: boolean } | null> {
  const [r] = await sql`select in_flight, cap, weight, quota_blocked, suspended from sched_tenants where tenant_id = ${tenantId}`;
  return r ? { inFlight: r.in_flight as number, cap: r.cap as number, weight: r.weight as number, quotaBlocked: r.quota_blocked as boolean, suspended: r.suspended as boolean } : null;
}

/** Sum of the weights of tenants with waiting work in a class (for fair-share estimates). */
export async function busyWeights(sql: Tx, classes: readonly JobClass[]): Promise<number> {
  const [r] = await sql`
    select coalesce(sum(t.weight), 0)::int as w from sched_tenants t
    where exists (select 1 from sched_queues q where q.tenant_id = t.tenant_id and q.depth > 0 and q.class = any(${classes as string[]}::text[]))`;
  return r!.w as number;
}

/** Locks tenants' scheduler rows in id order (the lock order for any path touching several tenants). */
export async function lockTenants(tx: Tx, tenantIds: readonly string[]): Promise<void> {
  if (tenantIds.length === 0) return;
  await tx`select 1 from sched_tenants where tenant_id = any(${[...new Set(tenantIds)]}::uuid[]) order by tenant_id for update`;
}

/**
 * Suspended or not: dispatch skips a suspended tenant (sluice_lease's slot claim reads it), and its
 * queues leave the fair index (or come back, at the class clock) in the same transaction.
 */
export async function setTenantSuspended(tx: Tx, tenantId: string, suspended: boolean): Promise<void> {
  await tx`update sched_tenants set suspended = ${suspended} where tenant_id = ${tenantId}`;
  await syncQueuesDormancy(tx, tenantId);
}

/**
 * Quota-blocked tenants whose next job now fits (a new period, a raised quota, refunds): one
 * statement for all of them, with each one's ledger row of its current period (a read per blocked
 * tenant each round was a statement per dormant tenant per round).
 */
export async function unblockableTenants(sql: Tx): Promise<Array<{ tenantId: string; periodAnchor: Date; quota: number; cost: number }>> {
  const rows = await sql`
    select t.tenant_id, t.period_anchor, t.quota, t.quota_blocked_cost from sched_tenants t
    left join tenant_ledger l on l.tenant_id = t.tenant_id and l.period_start = sluice_quota_period(t.period_anchor, now())
    where t.quota_blocked and coalesce(l.billed, 0) + t.reserved + t.quota_blocked_cost <= t.quota`;
  return rows.map((r) => ({ tenantId: r.tenant_id as string, periodAnchor: r.period_anchor as Date, quota: Number(r.quota), cost: r.quota_blocked_cost as number }));
}

/**
 * Lifts the quota block: the tenant's waiting jobs show QUEUED again (they are stored QUEUED; the
 * flag made them show WAITING_QUOTA) and its queues with work are ready. Returns how many jobs
 * wait (the queues' depth).
 */
export async function unblockQuota(tx: Tx, tenantId: string): Promise<number> {
  const [t] = await tx`update sched_tenants set quota_blocked = false, quota_blocked_cost = 0 where tenant_id = ${tenantId} and quota_blocked returning tenant_id`;
  if (!t) return 0;
  // Jobs an older version stored WAITING_QUOTA (none once the migration ran; an index probe).
  await queueQuotaWaitingJobs(tx, tenantId);
  // Back in the fair index at the class clock (the block took them out, marks kept).
  await syncQueuesDormancy(tx, tenantId);
  const queues = await tx`select class, depth from sched_queues where tenant_id = ${tenantId} and depth > 0 order by class`;
  await markQueuesReady(tx, tenantId, queues.map((q) => q.class as JobClass));
  return queues.reduce((n, q) => n + Number(q.depth), 0);
}
