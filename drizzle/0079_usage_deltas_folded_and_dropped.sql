-- The deltas not folded yet go into usage_hourly first (the retention pass's fold, all at once),
-- so dropping the table loses nothing; the new table (next migration) carries many aggregates a row.
INSERT INTO "usage_hourly" AS h (tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist)
  SELECT tenant_id, period_start, hour, api, class, sum(calls)::int, sum(succeeded)::int, sum(failed)::int, sum(credits_billed), sum(credits_refunded),
    array[sum(latency_hist[1]), sum(latency_hist[2]), sum(latency_hist[3]), sum(latency_hist[4]), sum(latency_hist[5]), sum(latency_hist[6]), sum(latency_hist[7]), sum(latency_hist[8]), sum(latency_hist[9]), sum(latency_hist[10]), sum(latency_hist[11])]::int[]
  FROM "usage_deltas" GROUP BY tenant_id, period_start, hour, api, class
  ON CONFLICT (tenant_id, hour, period_start, api, class) DO UPDATE SET
    calls = h.calls + excluded.calls, succeeded = h.succeeded + excluded.succeeded, failed = h.failed + excluded.failed,
    credits_billed = h.credits_billed + excluded.credits_billed, credits_refunded = h.credits_refunded + excluded.credits_refunded,
    latency_hist = array(select coalesce(x, 0) + coalesce(y, 0) from unnest(h.latency_hist, excluded.latency_hist) with ordinality as t(x, y, i) order by i);--> statement-breakpoint
DROP TABLE "usage_deltas" CASCADE;