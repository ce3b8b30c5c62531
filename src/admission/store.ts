/**
 * Admission's SQL: the global gate (admission_totals, migration 0008) and the
 * counters admission reads. Constant cost in tenants and queue sizes: a
 * submission reads 3 gate rows and its tenants' 3 sched_queues rows each; the
 * O(queues) reconciliation runs only when a check would refuse.
 *
 * Lock order of a submitting transaction (documented in ARCHITECTURE.md):
 *   admission_totals (all rows, class order) → sched_queues of the group's
 *   tenants (tenant, class order) → jobs / pgboss.job inserts.
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
}

/**
 * The group's tenants: waiting jobs and quota block, locking their queue rows
 * in (tenant, class) order so the inserts' depth trigger finds them held.
 */
export async function lockTenantQueues(tx: Tx, tenantIds: readonly string[]): Promise<Map<string, TenantAdmissionState>> {
  const ids = [...new Set(tenantIds)].sort();
  const rows = await tx`
    with locked as (
      select tenant_id, depth from sched_queues
      where tenant_id = any(${ids}::uuid[])
      order by tenant_id, class
      for no key update
    )
    select l.tenant_id, sum(l.depth)::int as depth, coalesce(bool_or(t.quota_blocked), false) as quota_blocked
    from locked l left join sched_tenants t on t.tenant_id = l.tenant_id
    group by l.tenant_id`;
  return new Map(rows.map((r) => [r.tenant_id as string, { depth: r.depth as number, quotaBlocked: r.quota_blocked as boolean }]));
}
