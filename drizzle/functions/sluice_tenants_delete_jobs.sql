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
