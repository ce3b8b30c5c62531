-- sluice_jobs_depth_ins: statement-level trigger (AFTER INSERT on jobs): waiting jobs inserted
-- join their queue's depth, and the default key's newest job its state, one write per (tenant,
-- class) for the whole statement (sluice_queues_add_jobs).
CREATE OR REPLACE FUNCTION sluice_jobs_depth_ins()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  PERFORM sluice_queues_add_jobs(coalesce(jsonb_agg(x), '[]'::jsonb)) FROM (
    SELECT tenant_id, priority, count(*) AS n,
      (array_agg(id ORDER BY id DESC) FILTER (WHERE fairness_key IS NULL))[1] AS last_job
    FROM new_rows
    WHERE state IN ('QUEUED', 'WAITING_QUOTA') GROUP BY tenant_id, priority) x;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER jobs_depth_ins AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_depth_ins();
