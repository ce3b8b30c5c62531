-- sluice_jobs_webhooks: statement-level trigger (AFTER UPDATE on jobs): one webhook delivery per
-- (enabled endpoint of the job's tenant that asked for the event, job reaching a final state), written
-- in the transaction that makes the job final, so an event is never lost and never sent before
-- the job's row commits. Insert only (no lock on a hot row; the endpoint's row gets the foreign
-- key's KEY SHARE, which no endpoint update but a delete waits for). With no endpoint the join is
-- empty and nothing is written: settlement pays one probe of webhook_endpoints' index per statement,
-- no round trip. The NOTIFY wakes the senders (one per transaction, Postgres folds duplicates).
CREATE OR REPLACE FUNCTION sluice_jobs_webhooks()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  INSERT INTO webhook_deliveries (tenant_id, endpoint_id, job_id, event)
  SELECT n.tenant_id, e.id, n.id, 'JOB_' || n.state
  FROM new_rows n
  JOIN webhook_endpoints e ON e.tenant_id = n.tenant_id AND e.enabled AND ('JOB_' || n.state) = ANY (e.events)
  WHERE n.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
    AND NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.id = n.id AND o.state = n.state)
  ON CONFLICT DO NOTHING;
  IF FOUND THEN
    PERFORM pg_notify('sluice_webhooks', '');
  END IF;
  RETURN NULL;
END $function$;

-- The trigger executing it (as pg_get_triggerdef prints it).
CREATE TRIGGER jobs_webhooks AFTER UPDATE ON jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_webhooks();
