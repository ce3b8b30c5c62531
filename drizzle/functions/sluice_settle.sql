-- sluice_settle: settles reservations exactly once (settled_at null -> set: billed on success,
-- refunded otherwise, as each outcome says) and releases what they held: the tenants' cap slots
-- (rows locked in id order), the ledger's reserved credits (billed ones added), and the window's
-- pool slots, appended to window_slot_deltas instead of updating the window's hot row (the next
-- lease folds them). Returns the reservations it settled.
-- Every credit it bills is added to its job's creditsBilled (job_results.credits_billed,
-- upserted) in the same statement, whoever settles (a settlement, the sweeper's lease expiry): the
-- ledger and the jobs' bills move together, so per job the sum is what the ledger billed for its
-- attempts (I11). Nothing else adds to credits_billed (a late settlement's correction excepted,
-- src/dispatch/late-settlement.ts). Lock order: job_results before tenant_ledger.
-- outcomes: [{"id", "billed", "outcome"}, ...]
CREATE OR REPLACE FUNCTION sluice_settle(outcomes jsonb)
 RETURNS SETOF uuid
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
  IF jsonb_array_length(settled) = 0 THEN
    RETURN;
  END IF;
  PERFORM 1 FROM sched_tenants t
    WHERE t.tenant_id IN (SELECT (x->>'tenant_id')::uuid FROM jsonb_array_elements(settled) x)
    ORDER BY t.tenant_id FOR UPDATE;
  UPDATE sched_tenants t SET in_flight = greatest(0, t.in_flight - d.n)
    FROM (SELECT (x->>'tenant_id')::uuid AS tenant_id, count(*)::int AS n FROM jsonb_array_elements(settled) x GROUP BY 1) d
    WHERE t.tenant_id = d.tenant_id;
  -- The jobs' bills (I11): only billed credits, only for jobs still there (a row per job, its
  -- attempts summed; a job in id order).
  INSERT INTO job_results (job_id, credits_billed, attempts)
    SELECT d.job_id, d.billed, d.attempt FROM (
      SELECT (x->>'job_id')::uuid AS job_id, sum((x->>'billed')::int)::int AS billed, max((x->>'attempt')::int) AS attempt
      FROM jsonb_array_elements(settled) x WHERE (x->>'billed')::int > 0 GROUP BY 1) d
    WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.id = d.job_id)
    ORDER BY d.job_id
    ON CONFLICT (job_id) DO UPDATE SET credits_billed = job_results.credits_billed + excluded.credits_billed, updated_at = now();
  UPDATE tenant_ledger l SET reserved = l.reserved - d.credits, billed = l.billed + d.billed,
      refunded = l.refunded + d.credits - d.billed
    FROM (SELECT (x->>'tenant_id')::uuid AS tenant_id, (x->>'period_start')::timestamptz AS period_start,
            sum((x->>'credits')::int) AS credits, sum((x->>'billed')::int) AS billed
          FROM jsonb_array_elements(settled) x GROUP BY 1, 2) d
    WHERE l.tenant_id = d.tenant_id AND l.period_start = d.period_start;
  -- The window's pool slots: appended, never a row lock.
  INSERT INTO window_slot_deltas ("window", n)
    SELECT x->>'window', -count(*)::int FROM jsonb_array_elements(settled) x
    WHERE (x->>'window_slot')::boolean GROUP BY 1;
  RETURN QUERY SELECT (x->>'id')::uuid FROM jsonb_array_elements(settled) x;
END $function$;
