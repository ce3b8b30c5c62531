-- sluice_bill_jobs: adds what settled reservations billed to their jobs' creditsBilled
-- (job_results.credits_billed, upserted) in the settling statement, whoever settles (a settlement,
-- the sweeper's lease expiry): the ledger and the jobs' bills move together, so per job the sum is
-- what the ledger billed for its attempts (I11). Nothing else adds to credits_billed but
-- sluice_finish_jobs, with the bill a settlement group hands it for the jobs it finishes (their
-- result row written once, not inserted and then billed), and a late settlement's correction
-- (src/dispatch/late-settlement.ts). Only billed credits, only for jobs still there, none in
-- p_skip (billed by the caller); a row per job, its attempts summed, jobs in id order.
-- The job_results rows are those of the jobs whose reservations the caller holds (every path that
-- writes a running job's result holds its reservation first), so taking them before the tenants'
-- rows closes no cycle.
-- settled: what sluice_settle_reservations returned.
CREATE OR REPLACE FUNCTION sluice_bill_jobs(settled jsonb, p_skip uuid[])
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
  INSERT INTO job_results (job_id, credits_billed, attempts)
    SELECT d.job_id, d.billed, d.attempt FROM (
      SELECT (x->>'job_id')::uuid AS job_id, sum((x->>'billed')::int)::int AS billed, max((x->>'attempt')::int) AS attempt
      FROM jsonb_array_elements(settled) x WHERE (x->>'billed')::int > 0 GROUP BY 1) d
    WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = d.job_id) AND NOT d.job_id = ANY (p_skip)
    ORDER BY d.job_id
    ON CONFLICT (job_id) DO UPDATE SET credits_billed = job_results.credits_billed + excluded.credits_billed, updated_at = now();
END $function$;
