-- Settlement in one round trip (issue 9: "more workers never lower throughput").
--
-- A grouped settlement was BEGIN, lock the reservations, lock the tenants, finish the jobs, settle
-- the reservations, NOTIFY, COMMIT: seven round trips, with the tenants' rows held across all of
-- them. With four worker processes 41% of busy backends were idle in transaction, holding tenant
-- rows the lease then waited for. sluice_settle_group does the same steps in the same lock order
-- inside ONE statement, so a group of final outcomes (nearly every settlement) is one call with no
-- transaction kept open between round trips. Retries and put-backs (re-inserted in pg-boss) and the
-- account reactions still run in the dispatcher's transaction around it.
--
-- The job event payload: one function for every publisher (publishJobEvents calls it too), so the
-- NOTIFY a settlement sends here is byte for byte what the TS publishers send.
-- sluice_job_json: the JobRow shape of src/jobs/store.ts (JOB_COLUMNS' names, dates as ISO text,
-- jobFromJson turns them back); test/fanout.test.ts checks an event carries what a read gives.
CREATE FUNCTION sluice_job_json(p_id uuid) RETURNS jsonb LANGUAGE sql STABLE AS $$
  SELECT to_jsonb(x) FROM (
    SELECT j.id, j.tenant_id AS "tenantId", j.api, j.params, j.priority, j.state,
      j.idempotency_key AS "idempotencyKey", j.attempts, j.created_at AS "createdAt",
      (extract(epoch FROM j.created_at) * 1000000)::bigint::text AS "createdAtMicros",
      j.started_at AS "startedAt", j.finished_at AS "finishedAt",
      r.data AS result, r.error_code AS "errorCode", r.error_message AS "errorMessage",
      r.http_status AS "httpStatus", coalesce(r.credits_billed, 0) AS "creditsBilled"
    FROM jobs j LEFT JOIN job_results r ON r.job_id = j.id WHERE j.id = p_id) x
$$;
--> statement-breakpoint
-- One NOTIFY per event, in the order given. A final state's payload carries the job's row as this
-- transaction sees it (as it commits), unless that would pass Postgres's 8000-byte payload limit:
-- then ids only, and each process reads the row once (src/events/bus.ts).
-- events: [{"jobId", "tenantId", "state"}, ...]
CREATE FUNCTION sluice_job_events(events jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('sluice_job_events',
      CASE WHEN p.full IS NOT NULL AND octet_length(p.full) <= 7999 THEN p.full ELSE p.base::text END)
    FROM (
      SELECT x.e AS base, (x.e || jsonb_build_object('job', r.row))::text AS full, x.o
      FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, o)
      LEFT JOIN LATERAL (SELECT sluice_job_json((x.e->>'jobId')::uuid) AS row
        WHERE x.e->>'state' IN ('SUCCEEDED', 'FAILED', 'CANCELLED')) r ON r.row IS NOT NULL
      ORDER BY x.o) p;
END $$;
--> statement-breakpoint
-- A settlement group in one statement: the reservations still open, locked (the fence: a
-- superseded attempt changes nothing), the final states (jobs, result, pg-boss ack in one
-- statement: sluice_finish_jobs, so the ack commits with the stored result, I6), the events of the
-- jobs it finished, then the bills and slots (sluice_settle: its tenants' rows in id order, the
-- ledger, the window's slot deltas). The tenants' rows come after the jobs' here: the hot rows are
-- held only for the end of the statement and its commit (a lease holds tenant rows, then waiting
-- jobs; this holds RUNNING jobs under their locked reservations: the two never meet; the sweeper
-- takes a reservation first too). Returns the reservations it settled.
-- items: [{"rid", "tenant", "billed", "outcome", "finish": {sluice_finish_jobs item} | absent}, ...]
-- An item without "finish" only settles its reservation (its job was requeued by the caller, in
-- the same transaction, after it locked the same rows in the same order).
CREATE FUNCTION sluice_settle_group(items jsonb) RETURNS SETOF uuid LANGUAGE plpgsql AS $$
DECLARE
  live uuid[];
  fin jsonb;
  done uuid[];
BEGIN
  SELECT coalesce(array_agg(r.id), '{}') INTO live FROM (
    SELECT r.id FROM reservations r
    WHERE r.id IN (SELECT (e->>'rid')::uuid FROM jsonb_array_elements(items) e) AND r.settled_at IS NULL
    ORDER BY r.id FOR UPDATE) r;
  IF cardinality(live) = 0 THEN
    RETURN;
  END IF;
  SELECT coalesce(jsonb_agg(e->'finish' || jsonb_build_object('tenant', e->>'tenant') ORDER BY o), '[]') INTO fin
    FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, o)
    WHERE (e->>'rid')::uuid = ANY (live) AND e ? 'finish';
  SELECT coalesce(array_agg(f), '{}') INTO done FROM sluice_finish_jobs(fin) f;
  -- The events before the bills: a NOTIFY is only queued here (sent at commit), and the tenants'
  -- rows, locked by sluice_settle, are then held only for the last steps and the commit.
  PERFORM sluice_job_events((SELECT coalesce(jsonb_agg(jsonb_build_object('jobId', f->>'id', 'tenantId', f->>'tenant', 'state', f->>'state') ORDER BY o), '[]')
    FROM jsonb_array_elements(fin) WITH ORDINALITY AS x(f, o) WHERE (f->>'id')::uuid = ANY (done)));
  PERFORM sluice_settle((SELECT jsonb_agg(jsonb_build_object('id', e->>'rid', 'billed', e->'billed', 'outcome', e->>'outcome'))
    FROM jsonb_array_elements(items) e WHERE (e->>'rid')::uuid = ANY (live)));
  RETURN QUERY SELECT unnest(live);
END $$;
