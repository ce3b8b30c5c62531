-- sluice_window_tokens: a window's tokens now, by its token bucket (refilled at rate_per_minute
-- since refilled_at, up to burst); null for an unpaced window. src/scheduler/pacer.ts is the same
-- arithmetic in TypeScript. One expression: the planner inlines it.
CREATE OR REPLACE FUNCTION sluice_window_tokens(w windows)
 RETURNS double precision
 LANGUAGE sql
AS $function$
  SELECT CASE WHEN w.rate_per_minute IS NULL THEN NULL
    ELSE least(w.burst, w.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - w.refilled_at))) * w.rate_per_minute / 60.0) END
$function$;
