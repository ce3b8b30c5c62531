/**
 * Admission's SQL: the global gate (admission_totals) and the
 * counters admission reads. Constant cost in tenants and queue sizes: a
 * submission reads 3 gate rows and its tenants' 3 sched_queues rows each; the
 * O(queues) reconciliation runs only when a check would refuse.
 *
 * Lock order of a submitting transaction (documented in ARCHITECTURE.md):
 *   admission_totals (all rows, class order) → jobs and pgboss.job inserts (one
 *   statement; its depth trigger updates the tenants' sched_queues rows at the
 *   statement's end) → sched_queues (ready_at) → admission_totals (already held).
 * Only submissions take admission_totals, and they take it first, so it can
 * close no deadlock cycle with dispatch or settlement.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import type { JobClass } from '../config/classes.ts';

type Tx = Sql | postgres.TransactionSql;

export interface TenantAdmissionState {
  /** Waiting jobs, all classes (exact: sched_queues.depth), plus the room its live admission reservations hold. */
  depth: number;
  quotaBlocked: boolean;
  /** suspendTenant: submissions are refused with TENANT_SUSPENDED. */
  suspended: boolean;
  /**
   * The period asked for's billed credits + the tenant's reserved ones (quota policy FAIL refuses on
   * it); null when no period was asked for (a tenant of another policy: its ledger row is not read).
   */
  creditsUsed: number | null;
}

/**
 * Takes the gate: locks every admission_totals row in class order and returns
 * the per-class upper estimate of waiting jobs. Held until commit, so no other
 * admission, in any process, checks a bound meanwhile.
 *
 * Its own statement, before readTenants, on purpose: in READ COMMITTED a
 * statement reads one snapshot taken when it starts, so a tenant read folded
 * into the locking statement would see the depths from before its lock wait,
 * missing what the previous gate holder just committed (tried: bounds passed).
 */
export async function lockGate(tx: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await tx`select class, depth from admission_totals order by class for update`;
  return Object.fromEntries(rows.map((r) => [r.class, Number(r.depth)]));
}

/**
 * The group's tenants, in one statement whatever the group's size: waiting
 * jobs plus the room their live admission reservations hold, quota block,
 * suspension, and, for a tenant given a period, the credits used in it (quota
 * policy FAIL refuses on it; one read for the group, not one per submission).
 *
 * Read, not locked: under the gate no other admission changes them, and
 * dispatch only lowers a depth (a requeue raising it is work admitted before);
 * a reservation turns into depth atomically (its insert transaction deletes
 * it). Locking them would make the gate wait for dispatch transactions even
 * for submissions that are refused.
 */
export async function readTenants(tx: Tx, tenants: ReadonlyArray<{ id: string; periodStart: Date | null }>): Promise<Map<string, TenantAdmissionState>> {
  const byId = new Map(tenants.map((t) => [t.id, t.periodStart]));
  const ids = [...byId.keys()];
  const periods = ids.map((id) => byId.get(id)?.toISOString() ?? null);
  const rows = await tx`
    select t.tenant_id, t.quota_blocked, t.suspended,
      ((select coalesce(sum(q.depth), 0) from sched_queues q where q.tenant_id = t.tenant_id)
        -- A tenant's reservations are probed only when the table has any (read once, in the same
        -- snapshot, so exact): live reservations are rare (a large submission between its two
        -- transactions), and a probe per tenant was paid by every group of many tenants.
        + case when (select exists (select 1 from admission_reservations)) then
            (select coalesce(sum(r.jobs), 0) from admission_reservations r where r.tenant_id = t.tenant_id) else 0 end)::int as depth,
      -- Only for the tenants that asked (policy FAIL): with many tenants per group, one ledger probe
      -- per tenant was one of the per-tenant reads every group paid for nothing.
      case when x.period_start is null then null
        else (coalesce((select l.billed from tenant_ledger l where l.tenant_id = t.tenant_id and l.period_start = x.period_start), 0) + t.reserved)::bigint end as credits_used
    from unnest(${ids}::uuid[], ${periods}::timestamptz[]) as x(tenant_id, period_start)
    join sched_tenants t on t.tenant_id = x.tenant_id
    -- The group's tenants by id (an index lookup each): joined with the unnest alone, the planner
    -- guesses a few rows and hashes, reading every tenant's row: O(tenants) per group.
    where t.tenant_id = any(${ids}::uuid[])`;
  return new Map(
    rows.map((r) => [r.tenant_id as string, { depth: r.depth as number, quotaBlocked: r.quota_blocked as boolean, suspended: r.suspended as boolean, creditsUsed: r.credits_used === null ? null : Number(r.credits_used) }]),
  );
}

/**
 * Sets the gate's counts to the exact waiting jobs per class (the sum of the
 * trigger-kept sched_queues.depth counters, plus the room live admission
 * reservations hold: jobs admitted whose rows are not written yet). Called under the gate, only when
 * a check would refuse: dispatch and cancellation lower the real depth without
 * touching the gate, so its estimate only drifts upward in between.
 */
export async function reconcileGate(tx: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await tx`
    update admission_totals a set depth = coalesce(s.n, 0), reconciled_at = now()
    from (${waitingByClass(tx)}) s
    where a.class = s.class
    returning a.class, a.depth`;
  return Object.fromEntries(rows.map((r) => [r.class, Number(r.depth)]));
}

/**
 * The exact waiting jobs per class (what reconcileGate writes into the gate), read without the
 * gate: the edge's view of the global depth (jobs/service.ts). One snapshot of the trigger-kept
 * counters, which every commit that adds or removes a waiting job keeps current: a refusal on it is
 * the one the gate would give on the same snapshot. O(queues), only while the global bound refuses.
 */
export async function countWaiting(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`${waitingByClass(sql)}`;
  return Object.fromEntries(rows.map((r) => [r.class, Number(r.n)]));
}

/** Per class: the sum of sched_queues.depth plus the room live admission reservations hold. */
function waitingByClass(sql: Tx) {
  return sql`
    select c.class,
      coalesce((select sum(q.depth) from sched_queues q where q.class = c.class and q.depth > 0), 0)
        + coalesce((select sum(r.jobs) from admission_reservations r where r.class = c.class), 0) as n
    from admission_totals c`;
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

/** One class's part of an admission reservation. */
export interface ReservedRoom {
  tenantId: string;
  jobClass: JobClass;
  jobs: number;
}

/**
 * Holds room for a submission whose jobs are written after the gate is given
 * back (a large keyless submitJobs). Called under the gate, after the jobs were
 * admitted and added to the gate's counts (addAdmitted), so the global
 * estimate already holds them; the tenant bound counts the rows (openGate).
 */
export async function reserveRoom(tx: Tx, id: string, room: readonly ReservedRoom[], ttlSeconds: number): Promise<void> {
  await tx`
    insert into admission_reservations (id, class, tenant_id, jobs, expires_at)
    select ${id}::uuid, x.c, x.t, x.n, now() + make_interval(secs => ${ttlSeconds})
    from jsonb_to_recordset(${tx.json(room.map((r) => ({ c: r.jobClass, t: r.tenantId, n: r.jobs })) as never)}::jsonb) as x(c text, t uuid, n int)`;
}

/**
 * Takes a reservation for the transaction that writes its jobs: deletes its
 * rows (locked until that transaction ends, so the sweeper skips them) and
 * returns how many jobs it held; 0 when it is gone (reclaimed after expiry),
 * and then the jobs must not be written: their room was given back.
 */
export async function claimRoom(tx: Tx, id: string): Promise<number> {
  const [row] = await tx`
    with gone as (delete from admission_reservations where id = ${id} returning jobs)
    select coalesce(sum(jobs), 0)::int as jobs from gone`;
  return row!.jobs as number;
}

/**
 * Reservations whose jobs never came (the process crashed between the gate and
 * the insert, or the insert failed and could not give the room back): deleted
 * once expired. Rows an insert transaction holds are skipped (it is consuming
 * them). The gate's estimate keeps the jobs until its next reconciliation,
 * which only happens when a check would refuse.
 */
export async function reclaimExpiredRooms(sql: Tx, limit = 500): Promise<number> {
  const rows = await sql`
    delete from admission_reservations r using (
      select id, class from admission_reservations where expires_at < now()
      order by expires_at limit ${limit} for update skip locked) x
    where r.id = x.id and r.class = x.class
    returning r.id`;
  return rows.length;
}
