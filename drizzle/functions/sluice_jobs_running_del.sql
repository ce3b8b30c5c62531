-- sluice_jobs_running_del: statement-level trigger (AFTER DELETE on jobs): RUNNING jobs deleted
-- leave the RUNNING counter, appended as deltas (see sluice_jobs_running_upd).
CREATE OR REPLACE FUNCTION sluice_jobs_running_del()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  INSERT INTO sched_running_deltas (tenant_id, class, n)
  SELECT tenant_id, priority, -count(*) FROM old_rows WHERE state = 'RUNNING' GROUP BY tenant_id, priority;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER jobs_running_del AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_running_del();
