/**
 * The reads behind the live fairness figures (visibility/status.ts, scheduler/sfq-lag.ts): the
 * jobs leased recently per tenant and lease instant, and which of those tenants have work waiting
 * now. Read-only; bounded by `maxRows` (the newest reservations, by their created_at index).
 */
import type { Sql } from '../../db/client.ts';
import { reservedWeight } from '../lease.ts';

export interface RecentService {
  /** Lease instants (ms since the epoch, to the millisecond), tenants and jobs leased. */
  served: Array<{ at: number; tenantId: string; n: number }>;
  /**
   * The tenants served, their weights and whether jobs wait for them now. A reserved tenant's weight
   * is the one the lease gives it while it is backlogged (lease.ts reservedWeight, over the tenants
   * read here that have work waiting), so its larger share is not read as lag.
   */
  tenants: Array<{ tenantId: string; weight: number; waiting: boolean }>;
  /** The span read: from the oldest row read to the database's now (ms since the epoch). */
  from: number;
  now: number;
}

export async function recentService(sql: Sql, seconds: number, maxRows: number): Promise<RecentService> {
  const rows = await sql`
    with r as (
      select r.tenant_id, r.created_at from reservations r
      where r.created_at > clock_timestamp() - make_interval(secs => ${seconds})
      order by r.created_at desc limit ${maxRows})
    select r.tenant_id::text as tenant_id, floor(extract(epoch from r.created_at) * 1000)::float8 as at, count(*)::int as n
    from r group by 1, 2`;
  const [clock] = await sql`select extract(epoch from clock_timestamp()) * 1000 as now`;
  const ids = [...new Set(rows.map((r) => r.tenant_id as string))];
  const tenants =
    ids.length === 0
      ? []
      : await sql`
          select st.tenant_id::text as tenant_id, st.weight, st.reserved_share,
            exists (select 1 from sched_queues q where q.tenant_id = st.tenant_id and q.ready_at is not null and q.depth > 0) as waiting
          from sched_tenants st where st.tenant_id = any (${ids}::uuid[])`;
  const served = rows.map((r) => ({ at: Number(r.at), tenantId: r.tenant_id as string, n: r.n as number }));
  const waiting = tenants.filter((t) => t.waiting);
  const reservedSum = waiting.reduce((s, t) => s + Number(t.reserved_share), 0);
  const backloggedWeight = waiting.reduce((s, t) => s + Number(t.weight), 0);
  return {
    served,
    tenants: tenants.map((t) => ({
      tenantId: t.tenant_id as string,
      weight: t.waiting ? reservedWeight(Number(t.weight), Number(t.reserved_share), reservedSum, backloggedWeight) : Number(t.weight),
      waiting: t.waiting as boolean,
    })),
    from: served.reduce((m, e) => Math.min(m, e.at), Number(clock!.now)),
    now: Number(clock!.now),
  };
}
