/**
 * Usage history: owns usage_hourly and usage_deltas. A trigger on reservations appends, for every
 * statement that settles reservations and in its transaction, its aggregates per (tenant, period,
 * hour, API, class): up to 32 of them a row (src/db/schema.ts), so history equals the ledger (I10)
 * whatever code settles. The retention pass folds deltas into the hourly table; readers add both,
 * so a read never depends on the fold having run.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import { addHistograms, percentileMs } from './histogram.ts';

type Tx = Sql | postgres.TransactionSql;

export type Granularity = 'HOUR' | 'DAY' | 'MONTH';
export type UsageGroup = 'API' | 'PRIORITY';

export interface UsageQuery {
  tenantId: string;
  from: Date;
  to: Date;
  granularity: Granularity;
  groupBy: readonly UsageGroup[];
}

export interface UsageRow {
  start: Date;
  /** null when not grouped by API. */
  api: string | null;
  /** null when not grouped by priority. */
  priority: string | null;
  calls: number;
  succeeded: number;
  failed: number;
  creditsBilled: number;
  creditsRefunded: number;
  latencyP95Ms: number | null;
}

const UNIT: Record<Granularity, string> = { HOUR: 'hour', DAY: 'day', MONTH: 'month' };

/** Most rows one usageHistory answer may hold (HOUR over a year by API and class would be far more). */
export const MAX_USAGE_ROWS = 10_000;

/** Element-wise sum of the latency histograms in SQL (11 buckets, src/usage/histogram.ts). */
const HIST_SUM = Array.from({ length: 11 }, (_, i) => `sum(latency_hist[${i + 1}])`).join(', ');

/**
 * The aggregates of the delta rows in `source` (usage_deltas, or rows a statement took from it),
 * one row each in usage_hourly's columns: element i of each array column, and row i of the n × 11
 * histograms. `where` filters the delta rows before they are unnested (a tenant's reader skips
 * rows without it).
 */
function deltaItems(source: string, where = 'true'): string {
  const hist = Array.from({ length: 11 }, (_, b) => `d.latency_hists[u.i][${b + 1}]`).join(', ');
  return `(select d.id, u.tenant_id, u.period_start, u.hour, u.api, u.class, u.calls, u.succeeded, u.failed,
      u.credits_billed, u.credits_refunded, array[${hist}]::int[] as latency_hist
    from ${source} d,
      unnest(d.tenant_ids, d.period_starts, d.hours, d.apis, d.classes, d.calls, d.succeeded, d.failed, d.credits_billed, d.credits_refunded)
        with ordinality as u(tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, i)
    where ${where})`;
}

/**
 * History for one tenant: the UTC buckets from the one holding `from` up to `to` (exclusive),
 * grouped as asked. `from` is rounded down to its bucket, so a period that starts mid-hour (a
 * tenant's anniversary) still counts its first hour.
 */
export async function usageHistory(sql: Tx, q: UsageQuery): Promise<UsageRow[]> {
  const byApi = q.groupBy.includes('API');
  const byClass = q.groupBy.includes('PRIORITY');
  const rows = await sql.unsafe(
    `select date_trunc($4, hour, 'UTC') as start,
        case when $5::boolean then api end as api, case when $6::boolean then class end as class,
        sum(calls)::bigint as calls, sum(succeeded)::bigint as succeeded, sum(failed)::bigint as failed,
        sum(credits_billed)::bigint as billed, sum(credits_refunded)::bigint as refunded,
        array[${HIST_SUM}]::bigint[] as hist
      from (
        select hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist
        from usage_hourly where tenant_id = $1 and hour >= date_trunc($4, $2::timestamptz, 'UTC') and hour < $3
        union all
        select hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist
        from ${deltaItems('usage_deltas', '$1 = any(d.tenant_ids)')} x where tenant_id = $1 and hour >= date_trunc($4, $2::timestamptz, 'UTC') and hour < $3
      ) u
      group by 1, 2, 3 order by 1, 2 nulls first, 3 nulls first
      limit ${MAX_USAGE_ROWS + 1}`,
    [q.tenantId, q.from, q.to, UNIT[q.granularity], byApi, byClass],
  );
  return rows.map((r) => {
    const hist = (r.hist as Array<string | number>).map(Number);
    return {
      start: r.start as Date,
      api: (r.api as string | null) ?? null,
      priority: (r.class as string | null) ?? null,
      calls: Number(r.calls),
      succeeded: Number(r.succeeded),
      failed: Number(r.failed),
      creditsBilled: Number(r.billed),
      creditsRefunded: Number(r.refunded),
      latencyP95Ms: percentileMs(addHistograms(hist, []), 0.95),
    };
  });
}

/**
 * Folds up to `limit` delta rows into usage_hourly in one statement: the
 * deleted deltas and the added hours commit together, so a reader adding both
 * tables sees every settlement exactly once. Returns the delta rows folded.
 */
export async function foldDeltas(sql: Tx, limit: number): Promise<number> {
  const rows = await sql.unsafe(
    `with gone as (delete from usage_deltas where id in (select id from usage_deltas order by id limit $1) returning *),
      d as (select x.* from ${deltaItems('gone')} x),
      g as (
        select tenant_id, period_start, hour, api, class, sum(calls)::int as calls, sum(succeeded)::int as succeeded,
          sum(failed)::int as failed, sum(credits_billed) as credits_billed, sum(credits_refunded) as credits_refunded,
          array[${HIST_SUM}]::int[] as latency_hist
        from d group by tenant_id, period_start, hour, api, class),
      up as (
        insert into usage_hourly as h (tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist)
        select tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist from g
        on conflict (tenant_id, hour, period_start, api, class) do update set
          calls = h.calls + excluded.calls, succeeded = h.succeeded + excluded.succeeded, failed = h.failed + excluded.failed,
          credits_billed = h.credits_billed + excluded.credits_billed, credits_refunded = h.credits_refunded + excluded.credits_refunded,
          latency_hist = array(select coalesce(x, 0) + coalesce(y, 0) from unnest(h.latency_hist, excluded.latency_hist) with ordinality as t(x, y, i) order by i)
        returning 1)
      select (select count(*) from gone)::int as folded, (select count(*) from up)::int as hours`,
    [limit],
  );
  return (rows[0]?.folded as number) ?? 0;
}

/**
 * A late settlement's correction of a settled call's bill (dispatch/late-settlement.ts): one
 * delta row, no call of its own (the settlement already counted the call), so history keeps
 * equalling the ledger (I10). The reservations trigger sees only settlements.
 */
export async function addUsageCorrection(
  tx: Tx,
  c: { tenantId: string; periodStart: Date; api: string; jobClass: string; billedDelta: number; succeededDelta: number },
): Promise<void> {
  await tx`
    insert into usage_deltas (tenant_ids, period_starts, hours, apis, classes, calls, succeeded, failed, credits_billed, credits_refunded, latency_hists)
    values (array[${c.tenantId}::uuid], array[${c.periodStart}::timestamptz], array[date_trunc('hour', now(), 'UTC')], array[${c.api}::text],
      array[${c.jobClass}::text], array[0], array[${c.succeededDelta}::int], array[${-c.succeededDelta}::int], array[${c.billedDelta}::bigint],
      array[${-c.billedDelta}::bigint], array[array_fill(0, array[11])])`;
}
