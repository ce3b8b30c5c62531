/**
 * The statements on sched_queues: one row per tenant and class: its virtual time, when it is ready, its
 * depth counter. SQL functions write it too (sluice_lease, sluice_apply_depth_delta,
 * sluice_queues_add_jobs). Running jobs are counted in jobs (jobs_running_idx holds only them),
 * not kept on the row: only visibility reads them, and a counter cost the claim and the finish a
 * write each.
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';
import { CLASSES, type JobClass } from '../../config/classes.ts';
import { oldestQueuedAgeByClass } from './classes.ts';

/**
 * Whether any queue is in the fair index, so a lease would find work now (a dispatcher starting
 * with a backlog warms its connections by use: dispatch/settler.ts). One probe of the index,
 * however many tenants are registered or dormant.
 */
export async function anyQueueReady(sql: Tx): Promise<boolean> {
  const [row] = await sql`select exists (select 1 from sched_queues sq where sluice_queue_in_fair_index(sq)) as ready`;
  return row!.ready as boolean;
}

/** A tenant's queues, one per class (in the transaction that writes its scheduler row: syncTenant). */
export async function addQueues(tx: Tx, tenantId: string): Promise<void> {
  await tx`
    insert into sched_queues (tenant_id, class)
    select ${tenantId}, c from unnest(${CLASSES as unknown as string[]}::text[]) as c
    on conflict do nothing`;
}

/**
 * Marks queues as having work ready now (or at `at`: a retry's delay). A queue that was idle, only
 * had delayed work or was held by a breaker joins at the class clock: no credit for idle time. A
 * queue marked for later is scheduled (out of the fair index until the lease's due check), and a
 * held one wakes: the new job may be for another API. A dormant tenant's queue is marked but stays
 * out of the index (tenant_dormant) until its resume or quota renewal.
 */
export async function markQueuesReady(tx: Tx, tenantId: string, classes: readonly JobClass[], at: Date | null = null): Promise<void> {
  await markManyQueuesReady(tx, classes.map((jobClass) => ({ tenantId, jobClass })), at);
}

/** markQueuesReady for the queues of many tenants in one statement (a group commit). */
export async function markManyQueuesReady(tx: Tx, queues: ReadonlyArray<{ tenantId: string; jobClass: JobClass }>, at: Date | null = null): Promise<void> {
  if (queues.length === 0) return;
  await tx`
    update sched_queues q set
      vtime = case when q.ready_at is null or q.ready_at > now() or q.held_api is not null then greatest(q.vtime, c.clock) else q.vtime end,
      ready_at = least(coalesce(q.ready_at, 'infinity'), coalesce(${at}::timestamptz, now())),
      scheduled = least(coalesce(q.ready_at, 'infinity'), coalesce(${at}::timestamptz, now())) > now(),
      held_api = null
    from sched_classes c, jsonb_to_recordset(${tx.json(queues.map((x) => ({ t: x.tenantId, c: x.jobClass })) as never)}::jsonb) as r(t uuid, c text)
    where q.tenant_id = r.t and q.class = r.c and c.class = q.class
      -- The queues' tenants by id: an index lookup each, where the join alone reads every queue.
      and q.tenant_id = any(${[...new Set(queues.map((x) => x.tenantId))]}::uuid[])
      -- A queue already ready (by now and by \`at\`) would be rewritten unchanged: skip it. Every
      -- submission group marks its queues, and a busy queue is nearly always ready already, so this
      -- saves a row version (and WAL) per queue per group. An UPDATE evaluates this on the row's
      -- latest version (after waiting for a concurrent writer), so no concurrent change is missed.
      and (q.ready_at is null or q.ready_at > least(now(), coalesce(${at}::timestamptz, now())) or q.scheduled or q.held_api is not null)`;
}

/**
 * Copies the tenant's suspension and quota block to its queues (tenant_dormant): a dormant
 * tenant's queues are out of the fair index, the lift and the reserved totals, so they cost a lease
 * nothing. Coming back (resume, quota renewal), a queue joins at the class clock: no credit for the
 * time away. Called after the tenant's row is written (held): the lock order's tenant, then its
 * queues in class order.
 */
export async function syncQueuesDormancy(tx: Tx, tenantId: string): Promise<void> {
  await tx`
    update sched_queues q set tenant_dormant = (t.suspended or t.quota_blocked),
      vtime = case when (t.suspended or t.quota_blocked) then q.vtime else greatest(q.vtime, c.clock) end
    from sched_tenants t, sched_classes c,
      (select l.class from sched_queues l where l.tenant_id = ${tenantId} order by l.class for update) l
    where q.tenant_id = ${tenantId} and q.class = l.class and t.tenant_id = q.tenant_id and c.class = q.class
      and q.tenant_dormant is distinct from (t.suspended or t.quota_blocked)`;
}

/**
 * Per class: waiting jobs (exact, from the depth counters), running jobs, and the oldest queued
 * job's age. The sums read every queue's row (O(registered tenants)): for the status page, not
 * for anything that runs every round.
 */
export async function classTotals(sql: Tx): Promise<Array<{ jobClass: JobClass; depth: number; running: number; oldestAgeSeconds: number | null }>> {
  const [rows, oldest] = await Promise.all([
    sql`
      select c.class,
        (select coalesce(sum(depth), 0) from sched_queues q where q.class = c.class)::int as depth,
        (select count(*) from jobs j where j.priority = c.class and j.state = 'RUNNING')::int as running
      from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)`,
    oldestQueuedAgeByClass(sql),
  ]);
  return rows.map((r) => ({ jobClass: r.class as JobClass, depth: r.depth as number, running: r.running as number, oldestAgeSeconds: oldest[r.class as JobClass] ?? null }));
}

/** Per class of one tenant: waiting, running, oldest waiting job's age, quota block, and the tenant's cap state. */
export async function tenantQueues(sql: Tx, tenantId: string): Promise<Array<{ jobClass: JobClass; depth: number; running: number; oldestAgeSeconds: number | null; headApi: string | null }>> {
  return (await tenantsQueues(sql, [tenantId])).get(tenantId) ?? [];
}

/** tenantQueues for many tenants in one statement (the console's tenants table). */
export async function tenantsQueues(sql: Tx, tenantIds: readonly string[]): Promise<Map<string, Awaited<ReturnType<typeof tenantQueues>>>> {
  const rows = await sql`
    select q.tenant_id, q.class, q.depth,
      (select count(*) from jobs j where j.tenant_id = q.tenant_id and j.priority = q.class and j.state = 'RUNNING')::int as running,
      h.age, h.api
    from sched_queues q
    left join lateral (
      select extract(epoch from now() - created_at) as age, api from jobs j
      where j.tenant_id = q.tenant_id and j.priority = q.class and j.state in ('QUEUED', 'WAITING_QUOTA')
      order by created_at limit 1
    ) h on true
    where q.tenant_id = any(${tenantIds as string[]}::uuid[])`;
  const order = CLASSES as readonly string[];
  const out = new Map<string, Awaited<ReturnType<typeof tenantQueues>>>();
  for (const r of rows) {
    const list = out.get(r.tenant_id as string) ?? [];
    list.push({ jobClass: r.class as JobClass, depth: r.depth as number, running: r.running as number, oldestAgeSeconds: r.age === null ? null : Number(r.age), headApi: (r.api as string | null) ?? null });
    out.set(r.tenant_id as string, list);
  }
  for (const list of out.values()) list.sort((a, b) => order.indexOf(a.jobClass) - order.indexOf(b.jobClass));
  return out;
}

/** Per tenant and class: waiting and running (only for METRICS_TENANT_LABELS). */
export async function tenantDepths(sql: Tx): Promise<Array<{ tenant: string; class: string; depth: number; running: number }>> {
  const rows = await sql`
    select q.tenant_id, q.class, q.depth, coalesce(r.running, 0)::int as running from sched_queues q
    left join (select tenant_id, priority, count(*) as running from jobs where state = 'RUNNING' group by 1, 2) r
      on r.tenant_id = q.tenant_id and r.priority = q.class
    where q.depth > 0 or r.running > 0`;
  return rows.map((r) => ({ tenant: r.tenant_id as string, class: r.class as string, depth: r.depth as number, running: r.running as number }));
}
