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

export async function ensureClasses(sql: Tx): Promise<void> {
  await sql`insert into sched_classes (class) select c from unnest(${CLASSES as unknown as string[]}::text[]) as c on conflict do nothing`;
}

/**
 * How long each class has waited, for the starvation guard: the age of its
 * oldest ready job, but no more than the time since the class was last
 * served. A long backlog is old for as long as it drains; judged by age alone
 * it would stay "starving" and outrank the classes above it the whole time,
 * instead of getting one turn per maximum wait.
 */
export async function oldestWaitByClass(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`
    select c.class, extract(epoch from now() - greatest(o.created_at, coalesce(k.served_at, '-infinity'))) * 1000 as wait_ms
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)
    left join sched_classes k on k.class = c.class
    cross join lateral (
      select created_at from jobs where priority = c.class and state = 'QUEUED' and run_after <= now()
      order by created_at limit 1
    ) o`;
  return Object.fromEntries(rows.map((r) => [r.class, Math.max(0, Number(r.wait_ms))]));
}

/**
 * Per class: the oldest queued job's age in seconds (null: none queued). One index probe per class
 * (jobs_queued_age_idx), whatever the number of tenants: the sweeper's alerts read it every round.
 */
export async function oldestQueuedAgeByClass(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`
    select c.class, (select extract(epoch from now() - min(created_at)) from (
        select created_at from jobs where priority = c.class and state = 'QUEUED' order by created_at limit 1) o) as oldest
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)`;
  return Object.fromEntries(rows.filter((r) => r.oldest !== null).map((r) => [r.class, Number(r.oldest)]));
}
