-- sluice_jobs_tenant_fixed: row trigger (AFTER UPDATE OF tenant_id on jobs): a job's tenant never
-- changes (the foreign key it replaces would otherwise have checked the new tenant). Raising in an
-- AFTER trigger undoes the statement as a BEFORE one would.
CREATE OR REPLACE FUNCTION sluice_jobs_tenant_fixed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
    RAISE EXCEPTION 'a job''s tenant_id never changes' USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs';
  END IF;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
-- AFTER, not BEFORE: any BEFORE UPDATE row trigger makes Postgres lock every row an update touches
-- before it checks the trigger's column list (a WAL record per row: two per job, its claim and its
-- finish), whereas an AFTER row trigger is queued only for statements that name tenant_id in SET
-- (none do), so leases and settlements pay nothing for it.
CREATE TRIGGER jobs_tenant_fixed AFTER UPDATE OF tenant_id ON jobs
  FOR EACH ROW EXECUTE FUNCTION sluice_jobs_tenant_fixed();
