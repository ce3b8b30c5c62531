-- sluice_reservations_usage: statement-level trigger (AFTER UPDATE on reservations): every
-- settlement, by any statement (the dispatcher's group, the sweeper's expiry), appends its usage
-- aggregates (one per tenant, period, hour, API and class) to usage_deltas in the settling
-- transaction: one row per 32 aggregates, column by column (src/db/schema.ts), so a settlement
-- group of many tenants writes one row, not one per tenant. Latency is the reservation's life
-- (lease to settlement), the closest measure a reservation row carries.
CREATE OR REPLACE FUNCTION sluice_reservations_usage()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  WITH s AS (
    SELECT n.tenant_id, n.period_start, date_trunc('hour', n.settled_at, 'UTC') AS hour,
      coalesce(j.api, 'unknown') AS api, coalesce(j.priority, 'UNKNOWN') AS class, n.outcome,
      coalesce(n.billed, 0)::bigint AS billed, n.credits::bigint AS credits,
      sluice_latency_bucket(extract(epoch FROM n.settled_at - n.created_at) * 1000) AS b
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    LEFT JOIN jobs j ON j.id = n.job_id
    WHERE o.settled_at IS NULL AND n.settled_at IS NOT NULL),
  g AS (
    SELECT tenant_id, period_start, hour, api, class, count(*)::int AS calls, count(*) FILTER (WHERE outcome = 'billed')::int AS succeeded,
      count(*) FILTER (WHERE outcome IS DISTINCT FROM 'billed')::int AS failed, sum(billed)::bigint AS billed, sum(credits - billed)::bigint AS refunded,
      ARRAY[count(*) FILTER (WHERE b = 1), count(*) FILTER (WHERE b = 2), count(*) FILTER (WHERE b = 3), count(*) FILTER (WHERE b = 4), count(*) FILTER (WHERE b = 5), count(*) FILTER (WHERE b = 6), count(*) FILTER (WHERE b = 7), count(*) FILTER (WHERE b = 8), count(*) FILTER (WHERE b = 9), count(*) FILTER (WHERE b = 10), count(*) FILTER (WHERE b = 11)]::int[] AS hist,
      row_number() OVER () AS k
    FROM s GROUP BY tenant_id, period_start, hour, api, class)
  INSERT INTO usage_deltas (tenant_ids, period_starts, hours, apis, classes, calls, succeeded, failed, credits_billed, credits_refunded, latency_hists)
  SELECT array_agg(tenant_id ORDER BY k), array_agg(period_start ORDER BY k), array_agg(hour ORDER BY k), array_agg(api ORDER BY k),
    array_agg(class ORDER BY k), array_agg(calls ORDER BY k), array_agg(succeeded ORDER BY k), array_agg(failed ORDER BY k),
    array_agg(billed ORDER BY k), array_agg(refunded ORDER BY k), array_agg(hist ORDER BY k)
  FROM g GROUP BY (k - 1) / 32;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER reservations_usage AFTER UPDATE ON reservations REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_reservations_usage();
