-- sluice_job_events: one NOTIFY per event, in the order given. A final state's payload carries the
-- job's row as this transaction sees it (as it commits), unless that would pass Postgres's
-- 8000-byte payload limit: then ids only, and each process reads the row once (src/events/bus.ts).
-- Any other event goes as given (RUNNING, a tenant-wide WAITING_QUOTA). The one place the
-- channel's payloads are built: the lease and the settlement send theirs here.
-- Each OFFSET 0 keeps its subquery from being pulled up into the one above: pulled up, every
-- mention of its column became its expression, and the row was read three times per event (the
-- job's row, then its text, each once per mention).
-- events: [{"jobId", "tenantId", "state"}, ...]
CREATE OR REPLACE FUNCTION sluice_job_events(events jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
  PERFORM pg_notify('sluice_job_events',
      CASE WHEN p.full IS NOT NULL AND octet_length(p.full) <= 7999 THEN p.full ELSE p.base::text END)
    FROM (
      SELECT x.e AS base, CASE WHEN r.row IS NOT NULL THEN (x.e || jsonb_build_object('job', r.row))::text END AS full, x.o
      FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, o)
      LEFT JOIN LATERAL (SELECT sluice_job_json((x.e->>'jobId')::uuid) AS row
        WHERE x.e->>'state' IN ('SUCCEEDED', 'FAILED', 'CANCELLED') OFFSET 0) r ON true
      ORDER BY x.o OFFSET 0) p;
END $function$;
