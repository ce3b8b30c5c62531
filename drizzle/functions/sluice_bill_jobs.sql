-- sluice_bill_jobs: adds what settled reservations billed to their jobs' creditsBilled
-- (jobs.credits_billed) in the settling statement, whoever settles (a settlement,
-- the sweeper's lease expiry): the ledger and the jobs' bills move together, so per job the sum is
-- what the ledger billed for its attempts (I11). Nothing else adds to credits_billed but
-- sluice_finish_jobs, with the bill a settlement group hands it for the jobs it finishes (their
-- row written once, not finished and then billed), and a late settlement's correction
-- (src/dispatch/late-settlement.ts). Only billed credits, only for jobs still there, none in
-- p_skip (billed by the caller); a write per job, its attempts summed, jobs locked in id order.
-- The jobs rows are those of the jobs whose reservations the caller holds (every path that
-- writes a running job's result holds its reservation first).
-- settled: what sluice_settle_reservations returned.
CREATE OR REPLACE FUNCTION sluice_bill_jobs(settled jsonb, p_skip uuid[])
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
  WITH d AS (
    SELECT (x->>'job_id')::uuid AS job_id, sum((x->>'billed')::int)::int AS billed
    FROM jsonb_array_elements(settled) x WHERE (x->>'billed')::int > 0 GROUP BY 1),
  l AS (
    SELECT j.id FROM jobs j WHERE j.id IN (SELECT d.job_id FROM d WHERE NOT d.job_id = ANY (p_skip))
    ORDER BY j.id FOR UPDATE)
  UPDATE jobs j SET credits_billed = coalesce(j.credits_billed, 0) + d.billed, updated_at = now()
    FROM d JOIN l ON l.id = d.job_id WHERE j.id = d.job_id;
END $function$;
