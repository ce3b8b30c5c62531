-- sched_queues.depth: jobs waiting (QUEUED or WAITING_QUOTA) per tenant and class, kept exact by
-- statement-level triggers on jobs, so every path that changes a job's state (submit, dispatch,
-- requeue, cancel, quota block, crash sweep) moves the count in the same transaction.
-- Admission reads it instead of counting rows on every submission.
CREATE FUNCTION sluice_apply_depth_delta(delta jsonb) RETURNS void LANGUAGE sql AS $$
  UPDATE sched_queues q SET depth = q.depth + (d->>'n')::int
  FROM jsonb_array_elements(delta) d
  WHERE q.tenant_id = (d->>'tenant_id')::uuid AND q.class = d->>'priority';
$$;
--> statement-breakpoint
CREATE FUNCTION sluice_jobs_depth_ins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM sluice_apply_depth_delta(coalesce(jsonb_agg(x), '[]'::jsonb)) FROM (
    SELECT tenant_id, priority, count(*) AS n FROM new_rows
    WHERE state IN ('QUEUED', 'WAITING_QUOTA') GROUP BY tenant_id, priority) x;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE FUNCTION sluice_jobs_depth_upd() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM sluice_apply_depth_delta(coalesce(jsonb_agg(x), '[]'::jsonb)) FROM (
    SELECT tenant_id, priority, sum(n) AS n FROM (
      SELECT tenant_id, priority, 1 AS n FROM new_rows WHERE state IN ('QUEUED', 'WAITING_QUOTA')
      UNION ALL
      SELECT tenant_id, priority, -1 FROM old_rows WHERE state IN ('QUEUED', 'WAITING_QUOTA')
    ) c GROUP BY tenant_id, priority HAVING sum(n) <> 0) x;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE FUNCTION sluice_jobs_depth_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM sluice_apply_depth_delta(coalesce(jsonb_agg(x), '[]'::jsonb)) FROM (
    SELECT tenant_id, priority, -count(*) AS n FROM old_rows
    WHERE state IN ('QUEUED', 'WAITING_QUOTA') GROUP BY tenant_id, priority) x;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER jobs_depth_ins AFTER INSERT ON jobs REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_depth_ins();
--> statement-breakpoint
CREATE TRIGGER jobs_depth_upd AFTER UPDATE ON jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_depth_upd();
--> statement-breakpoint
CREATE TRIGGER jobs_depth_del AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_depth_del();
--> statement-breakpoint
-- Existing jobs: start the counters from the truth.
UPDATE sched_queues q SET depth = coalesce((
  SELECT count(*) FROM jobs j WHERE j.tenant_id = q.tenant_id AND j.priority = q.class AND j.state IN ('QUEUED', 'WAITING_QUOTA')), 0);
--> statement-breakpoint
INSERT INTO account_state (id) VALUES (1) ON CONFLICT DO NOTHING;
