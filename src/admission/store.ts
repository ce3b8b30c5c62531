/**
 * Admission's SQL: the global gate (admission_totals, migration 0008) and the
 * counters admission reads. Constant cost in tenants and queue sizes: a
 * submission reads 3 gate rows and its tenants' 3 sched_queues rows each; the
 * O(queues) reconciliation runs only when a check would refuse.
 *
 * Lock order of a submitting transaction (documented in ARCHITECTURE.md):
 *   admission_totals (all rows, class order) → jobs insert (its depth trigger
 *   updates the tenants' sched_queues rows) → pgboss.job → sched_queues
 *   (ready_at) → admission_totals (already held).
 * Only submissions take admission_totals, and they take it first, so it can
 * close no deadlock cycle with dispatch or settlement.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import type { JobClass } from '../queue/boss.ts';

type Tx = Sql | postgres.TransactionSql;

/**
 * Takes the gate: locks every admission_totals row in class order and returns
 * the per-class upper estimate of waiting jobs. Held until commit, so no other
 * admission, in any process, checks a bound meanwhile.
 */
export async function lockGate(tx: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await tx`select class, depth from admission_totals order by class for update`;
  return Object.fromEntries(rows.map((r) => [r.class, Number(r.depth)]));
}

/**
 * Sets the gate's counts to the exact waiting jobs per class (the sum of the
 * trigger-kept sched_queues.depth counters). Called under the gate, only when
 * a check would refuse: dispatch and cancellation lower the real depth without
 * touching the gate, so its estimate only drifts upward in between.
 */
export async function reconcileGate(tx: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await tx`
    update admission_totals a set depth = coalesce(s.n, 0), reconciled_at = now()
    from (select c.class, (select sum(q.depth) from sched_queues q where q.class = c.class and q.depth > 0) as n
          from admission_totals c) s
    where a.class = s.class
    returning a.class, a.depth`;
  return Object.fromEntries(rows.map((r) => [r.class, Number(r.depth)]));
}

/** Adds what this transaction admitted to the gate's counts. */
export async function addAdmitted(tx: Tx, admitted: Partial<Record<JobClass, number>>): Promise<void> {
  const entries = Object.entries(admitted).filter(([, n]) => (n ?? 0) > 0);
  if (entries.length === 0) return;
  await tx`
    update admission_totals a set depth = a.depth + x.n
    from jsonb_to_recordset(${tx.json(entries.map(([c, n]) => ({ c, n })) as never)}::jsonb) as x(c text, n int)
    where a.class = x.c`;
}

export interface TenantAdmissionState {
  /** Waiting jobs, all classes (exact: sched_queues.depth). */
  depth: number;
  quotaBlocked: boolean;
  /** suspendTenant: submissions are refused with TENANT_SUSPENDED. */
  suspended: boolean;
}

/**
 * The group's tenants: waiting jobs and quota block. Read, not locked: under
 * the gate no other admission changes them, and dispatch only lowers a depth
 * (a requeue raising it is work admitted before). Locking them would make the
 * gate wait for dispatch transactions even for submissions that are refused.
 */
export async function readTenants(tx: Tx, tenantIds: readonly string[]): Promise<Map<string, TenantAdmissionState>> {
  const ids = [...new Set(tenantIds)];
  const rows = await tx`
    select t.tenant_id, t.quota_blocked, t.suspended,
      (select coalesce(sum(q.depth), 0) from sched_queues q where q.tenant_id = t.tenant_id)::int as depth
    from sched_tenants t where t.tenant_id = any(${ids}::uuid[])`;
  return new Map(rows.map((r) => [r.tenant_id as string, { depth: r.depth as number, quotaBlocked: r.quota_blocked as boolean, suspended: r.suspended as boolean }]));
}
