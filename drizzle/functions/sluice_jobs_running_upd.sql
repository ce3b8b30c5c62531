-- sluice_jobs_running_upd: statement-level trigger (AFTER UPDATE on jobs): jobs entering or leaving
-- RUNNING, appended to sched_running_deltas straight from the transition tables (no jsonb, no
-- function call: this runs in every lease and settlement). The triggers only INSERT deltas:
-- updating sched_queues here would lock it in the settlement after `windows`, while a lease locks
-- sched_queues before `windows`, and the two would deadlock. sluice_fold_running folds them.
-- Not for the lease's claim (sluice.lease_claim, as sluice_jobs_depth_upd): the lease holds the
-- claimed queues' rows already, and sluice_lease_commit adds its jobs to their running count in
-- the same write as their virtual time and depth (no delta appended, then deleted by a fold).
CREATE OR REPLACE FUNCTION sluice_jobs_running_upd()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF current_setting('sluice.lease_claim', true) = 'on' THEN
    RETURN NULL;
  END IF;
  INSERT INTO sched_running_deltas (tenant_id, class, n)
  SELECT tenant_id, priority, sum(n) FROM (
    SELECT tenant_id, priority, 1 AS n FROM new_rows WHERE state = 'RUNNING'
    UNION ALL
    SELECT tenant_id, priority, -1 FROM old_rows WHERE state = 'RUNNING'
  ) c GROUP BY tenant_id, priority HAVING sum(n) <> 0;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
-- Jobs are never inserted RUNNING, so there is no insert trigger.
CREATE TRIGGER jobs_running_upd AFTER UPDATE ON jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_running_upd();
