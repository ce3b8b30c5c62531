-- sluice_settle_reservations: the first half of a settlement (sluice_settle): settles reservations
-- exactly once (settled_at null -> set: billed on success, refunded otherwise, as each outcome says)
-- and adds every credit it bills to its job's creditsBilled (job_results.credits_billed, upserted)
-- in the same statement, whoever settles (a settlement, the sweeper's lease expiry): the ledger and
-- the jobs' bills move together, so per job the sum is what the ledger billed for its attempts
-- (I11). Nothing else adds to credits_billed (a late settlement's correction excepted,
-- src/dispatch/late-settlement.ts). Returns the settled rows for sluice_release_settled.
-- The job_results rows are those of the jobs whose reservations the caller holds (every path that
-- writes a running job's result holds its reservation first), so taking them before the tenants'
-- rows closes no cycle.
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
  -- The jobs' bills (I11): only billed credits, only for jobs still there (a row per job, its
  -- attempts summed; jobs in id order).
  INSERT INTO job_results (job_id, credits_billed, attempts)
    SELECT d.job_id, d.billed, d.attempt FROM (
      SELECT (x->>'job_id')::uuid AS job_id, sum((x->>'billed')::int)::int AS billed, max((x->>'attempt')::int) AS attempt
      FROM jsonb_array_elements(settled) x WHERE (x->>'billed')::int > 0 GROUP BY 1) d
    WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = d.job_id)
    ORDER BY d.job_id
    ON CONFLICT (job_id) DO UPDATE SET credits_billed = job_results.credits_billed + excluded.credits_billed, updated_at = now();
  RETURN settled;
END $function$;
