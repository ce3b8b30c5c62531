-- sluice_jobs_tenant_check: statement-level trigger (AFTER INSERT on jobs) replacing the foreign
-- key jobs.tenant_id -> tenants.id, checked once per statement instead of once per row (one
-- SELECT ... FOR KEY SHARE per job was a quarter of a 10,000-job insert). The distinct tenants of
-- the new rows are locked FOR KEY SHARE, as the foreign key's check locks them, so a concurrent
-- tenant delete waits for this transaction; a tenant already gone fails the statement with
-- foreign_key_violation (23503), as the constraint did.
CREATE OR REPLACE FUNCTION sluice_jobs_tenant_check()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
  wanted uuid[];
  found int;
BEGIN
  SELECT array_agg(DISTINCT tenant_id) INTO wanted FROM new_rows;
  IF wanted IS NULL THEN RETURN NULL; END IF;
  SELECT count(*) INTO found FROM (SELECT 1 FROM tenants t WHERE t.id = ANY (wanted) FOR KEY SHARE) l;
  IF found <> cardinality(wanted) THEN
    RAISE EXCEPTION 'insert or update on table "jobs" violates the reference to "tenants": a tenant_id has no tenant'
      USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs';
  END IF;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER jobs_tenant_check_ins AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_tenant_check();
