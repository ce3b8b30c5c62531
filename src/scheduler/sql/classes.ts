/**
 * The statements on sched_classes: each class's clock (the fair order's virtual time) and when it was
 * last served; and the classes' waits the starvation guard reads. sluice_lease advances the clocks.
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';
import { CLASSES, type JobClass } from '../../config/classes.ts';

/**
 * Jobs a quota-blocked tenant's backlog may put ahead of the oldest servable one before a class's
 * oldest-job probe stops looking past them. A blocked tenant's jobs are stored QUEUED (they show
 * WAITING_QUOTA), so the probes skip them by their tenant's flag; when more than this many lead,
 * the probe counts them as it counts a suspended tenant's (the unfiltered oldest). Without
 * blocked jobs in front, a probe reads one index entry, as before.
 */
const BLOCKED_SKIP_MAX = 1000;

/** The oldest created_at of the class's QUEUED jobs matching `ready`, a quota-blocked tenant's skipped (BLOCKED_SKIP_MAX). */
function oldestQueued(sql: Tx, cls: string, ready: boolean) {
  const due = ready ? sql`and run_after <= now()` : sql``;
  return sql`coalesce(
      (select o.created_at from (
          select created_at, tenant_id from jobs where priority = ${sql.unsafe(cls)} and state = 'QUEUED' ${due}
          order by created_at limit ${BLOCKED_SKIP_MAX}) o
        where not exists (select 1 from sched_tenants t where t.tenant_id = o.tenant_id and t.quota_blocked)
        order by o.created_at limit 1),
      (select created_at from jobs where priority = ${sql.unsafe(cls)} and state = 'QUEUED' ${due} order by created_at limit 1))`;
}

export async function ensureClasses(sql: Tx): Promise<void> {
  await sql`insert into sched_classes (class) select c from unnest(${CLASSES as unknown as string[]}::text[]) as c on conflict do nothing`;
}

/**
 * How long each class has waited, for the starvation guard: the age of its
 * oldest ready job (a quota-blocked tenant's not counted: oldestQueued), but no more than the time since the class was last
 * served. A long backlog is old for as long as it drains; judged by age alone
 * it would stay "starving" and outrank the classes above it the whole time,
 * instead of getting one turn per maximum wait.
 */
export async function oldestWaitByClass(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`
    select c.class, extract(epoch from now() - greatest(o.created_at, coalesce(k.served_at, '-infinity'))) * 1000 as wait_ms
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)
    left join sched_classes k on k.class = c.class
    cross join lateral (select ${oldestQueued(sql, 'c.class', true)} as created_at) o
    where o.created_at is not null`;
  return Object.fromEntries(rows.map((r) => [r.class, Math.max(0, Number(r.wait_ms))]));
}

/**
 * Per class: the oldest queued job's age in seconds (null: none queued; a quota-blocked tenant's
 * jobs, which show WAITING_QUOTA, not counted: oldestQueued). One index probe per class
 * (jobs_queued_age_idx), whatever the number of tenants: the sweeper's alerts read it every round.
 */
export async function oldestQueuedAgeByClass(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`
    select c.class, extract(epoch from now() - ${oldestQueued(sql, 'c.class', false)}) as oldest
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)`;
  return Object.fromEntries(rows.filter((r) => r.oldest !== null).map((r) => [r.class, Number(r.oldest)]));
}
