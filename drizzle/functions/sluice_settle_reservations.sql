-- sluice_settle_reservations: the first half of a settlement (sluice_settle): settles reservations
-- exactly once (settled_at null -> set: billed on success, refunded otherwise, as each outcome says).
-- Returns the settled rows, for the jobs' bills and sluice_release_settled. Every caller adds what
-- they billed to their jobs' creditsBilled in the same statement (I11): sluice_settle through
-- sluice_bill_jobs; sluice_settle_group with each finished job's result row (sluice_finish_jobs
-- writes it once, bill included) and sluice_bill_jobs for the rest.
-- outcomes: [{"id", "billed", "outcome"}, ...]
CREATE OR REPLACE FUNCTION sluice_settle_reservations(outcomes jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
  settled jsonb;
BEGIN
  WITH s AS (
    UPDATE reservations r SET settled_at = clock_timestamp(),
      billed = least(r.credits, greatest(0, (o->>'billed')::int)), outcome = o->>'outcome'
    FROM jsonb_array_elements(outcomes) o
    WHERE r.id = (o->>'id')::uuid AND r.settled_at IS NULL
    RETURNING r.id, r.job_id, r.attempt, r.tenant_id, r.period_start, r."window", r.credits, r.billed, r.window_slot)
  SELECT coalesce(jsonb_agg(s), '[]'::jsonb) INTO settled FROM s;
  RETURN settled;
END $function$;
