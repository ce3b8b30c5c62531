-- sluice_jobs_depth_upd: statement-level trigger (AFTER UPDATE on jobs): the net depth change per
-- (tenant, class) of jobs entering or leaving a waiting state (QUEUED, WAITING_QUOTA).
-- Not for the lease's claim (sluice.lease_claim set by sluice_lease_claim for its one statement):
-- sluice_lease_commit writes the claimed queues' depth with their virtual time, one write a queue.
CREATE OR REPLACE FUNCTION sluice_jobs_depth_upd()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF current_setting('sluice.lease_claim', true) = 'on' THEN
    RETURN NULL;
  END IF;
  PERFORM sluice_apply_depth_delta(coalesce(jsonb_agg(x), '[]'::jsonb)) FROM (
    SELECT tenant_id, priority, sum(n) AS n FROM (
      SELECT tenant_id, priority, 1 AS n FROM new_rows WHERE state IN ('QUEUED', 'WAITING_QUOTA')
      UNION ALL
      SELECT tenant_id, priority, -1 FROM old_rows WHERE state IN ('QUEUED', 'WAITING_QUOTA')
    ) c GROUP BY tenant_id, priority HAVING sum(n) <> 0) x;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER jobs_depth_upd AFTER UPDATE ON jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_depth_upd();
