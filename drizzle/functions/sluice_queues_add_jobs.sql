-- sluice_queues_add_jobs: adds a statement's inserted waiting jobs to their queues (the insert
-- depth trigger, sluice_jobs_depth_ins, calls it), one write per (tenant, class) for the whole
-- statement: the depth, and the default key's newest job and its rank (src/scheduler/fair-keys.ts:
-- jobs without a fairness key; the rank is the job's pg-boss priority negated, which the same
-- insert statement wrote: insertJobsQueued). delta: [{"tenant_id", "priority", "n", "last_job"}, ...],
-- last_job the newest of those jobs without a key (ids are time-ordered), or null.
--
-- Keeping the default key here rather than in sched_fair_keys saves a group of submissions from
-- many tenants a second row write per tenant: this row is written for the depth anyway.
-- A job with no pg-boss row (inserted by something other than insertJobsQueued) leaves the
-- key's state as it was. The probe names the row's whole primary key (name, id) and also its
-- created_on (pg-boss's clock, constant in a transaction, as the statement wrote it): where the
-- planner takes pg-boss's (name, created_on) index instead (it did on a small table), the scan
-- is still bounded by this transaction's jobs of the queue, never its whole history.
--
-- Locks and plans as sluice_apply_depth_delta (its comment says why): an index lookup per named
-- tenant, rows updated in key order (tenant id, class), no hash joins. PL/pgSQL, not SQL: a SQL
-- function's body is checked when it is created, before pg-boss has made pgboss.job.
CREATE OR REPLACE FUNCTION sluice_queues_add_jobs(delta jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
AS $function$
BEGIN
  UPDATE sched_queues q SET depth = q.depth + d.n,
    fair_last_rank = coalesce(d.last_rank, q.fair_last_rank),
    fair_last_job = CASE WHEN d.last_rank IS NULL THEN q.fair_last_job ELSE d.last_job END
  FROM (SELECT x.tenant_id, x.priority, x.n, x.last_job,
      (SELECT -p.priority FROM pgboss.job p
        WHERE p.name = 't.' || x.tenant_id || '.' || lower(x.priority) AND p.id = x.last_job
          AND p.created_on = pgboss.job_now()) AS last_rank
    FROM jsonb_to_recordset(delta) AS x(tenant_id uuid, priority text, n int, last_job uuid) ORDER BY 1, 2) d
  WHERE q.tenant_id = d.tenant_id AND q.class = d.priority
    AND q.tenant_id = ANY (ARRAY(SELECT (e->>'tenant_id')::uuid FROM jsonb_array_elements(delta) e));
END $function$;
