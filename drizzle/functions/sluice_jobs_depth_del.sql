-- sluice_jobs_depth_del: statement-level trigger (AFTER DELETE on jobs): waiting jobs deleted
-- leave their queue's depth.
CREATE OR REPLACE FUNCTION sluice_jobs_depth_del()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  PERFORM sluice_apply_depth_delta(coalesce(jsonb_agg(x), '[]'::jsonb)) FROM (
    SELECT tenant_id, priority, -count(*) AS n FROM old_rows
    WHERE state IN ('QUEUED', 'WAITING_QUOTA') GROUP BY tenant_id, priority) x;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER jobs_depth_del AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_depth_del();
