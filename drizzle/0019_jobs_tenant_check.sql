-- Issue 11, the front door at full speed: the jobs → tenants reference checked once per statement,
-- not once per row.
--
-- The foreign key jobs.tenant_id → tenants.id ran its check trigger for every inserted row: one
-- `SELECT … FOR KEY SHARE` of the tenant per job, 10,000 for one submitJobs (EXPLAIN ANALYZE of
-- the bulk insert: about a quarter of the `jobs` insert's time), though a submission's jobs name
-- one tenant (a group commit's, a few hundred at most). The constraint is replaced by triggers
-- that give the same guarantees set-based:
--  1. no jobs row without its tenant: after an INSERT statement, the distinct tenants of the new rows are locked FOR KEY SHARE, as the
--     foreign key's check locks them, so a concurrent tenant delete waits for this transaction
--     (and its cascade, below, then sees these jobs), and a tenant already deleted is not found:
--     the statement fails with foreign_key_violation (23503), as the constraint failed; a job's
--     tenant_id never changes (nothing updates it; an UPDATE that sets it to another value fails);
--  2. ON DELETE CASCADE: after a DELETE on tenants, the jobs of the deleted tenants are deleted
--     (their job_results and reservations still go by their own foreign keys to jobs).
ALTER TABLE "jobs" DROP CONSTRAINT IF EXISTS "jobs_tenant_id_tenants_id_fk";
--> statement-breakpoint
CREATE FUNCTION sluice_jobs_tenant_check() RETURNS trigger LANGUAGE plpgsql AS $$
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
END $$;
--> statement-breakpoint
CREATE TRIGGER jobs_tenant_check_ins AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_tenant_check();
--> statement-breakpoint
CREATE FUNCTION sluice_jobs_tenant_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id THEN
    RAISE EXCEPTION 'a job''s tenant_id never changes' USING ERRCODE = 'foreign_key_violation', TABLE = 'jobs';
  END IF;
  RETURN NEW;
END $$;
--> statement-breakpoint
-- Fires only for statements that name tenant_id in SET (none do): no cost to leases and settlements.
CREATE TRIGGER jobs_tenant_fixed BEFORE UPDATE OF tenant_id ON jobs
  FOR EACH ROW EXECUTE FUNCTION sluice_jobs_tenant_fixed();
--> statement-breakpoint
CREATE FUNCTION sluice_tenants_delete_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM jobs j USING old_rows o WHERE j.tenant_id = o.id;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER tenants_delete_jobs AFTER DELETE ON tenants REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_tenants_delete_jobs();
