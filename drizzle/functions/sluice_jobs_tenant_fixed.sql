-- sluice_jobs_tenant_fixed: row trigger (BEFORE UPDATE OF tenant_id on jobs): a job's tenant never
-- changes (the foreign key it replaces would otherwise have checked the new tenant).
CREATE OR REPLACE FUNCTION sluice_jobs_tenant_fixed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
    RAISE EXCEPTION 'a job''s tenant_id never changes' USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs';
  END IF;
  RETURN NEW;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
-- Fires only for statements that name tenant_id in SET (none do): no cost to leases and settlements.
CREATE TRIGGER jobs_tenant_fixed BEFORE UPDATE OF tenant_id ON jobs
  FOR EACH ROW EXECUTE FUNCTION sluice_jobs_tenant_fixed();
