-- sluice_tenants_delete_jobs: statement-level trigger (AFTER DELETE on tenants): the cascade the jobs foreign
-- key gave (see sluice_jobs_tenant_check), deleting the tenant's jobs first.
CREATE OR REPLACE FUNCTION sluice_tenants_delete_jobs()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  DELETE FROM jobs j USING old_rows o WHERE j.tenant_id = o.id;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER tenants_delete_jobs AFTER DELETE ON tenants REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_tenants_delete_jobs();
