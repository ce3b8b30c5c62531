-- sluice_job_events: one NOTIFY per event, in the order given. A final state's payload carries the
-- job's row as this transaction sees it (as it commits), unless that would pass Postgres's
-- 8000-byte payload limit: then ids only, and each process reads the row once (src/events/bus.ts).
-- Any other event goes as given (RUNNING, a tenant-wide WAITING_QUOTA). The one place the
-- channel's payloads are built: the lease and the settlement send theirs here.
-- Each OFFSET 0 keeps its subquery from being pulled up into the one above: pulled up, every
-- mention of its column became its expression, and the row was read three times per event (the
-- job's row, then its text, each once per mention).
-- Returns the payloads it sent, in order: the settlement hands its own to the process that settled,
-- which delivers them to its subscribers once the commit is acknowledged, without waiting for the
-- NOTIFY to come back to it (src/events/bus.ts deliverOwn). The other callers PERFORM it.
-- events: [{"jobId", "tenantId", "state"}, ...]
CREATE OR REPLACE FUNCTION sluice_job_events(events jsonb)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
  -- The pg_notify column is volatile: the planner keeps it although only the payload is returned.
  RETURN QUERY SELECT n.payload FROM (
    SELECT pg_notify('sluice_job_events', q.payload) AS sent, q.payload FROM (
      SELECT CASE WHEN p.full IS NOT NULL AND octet_length(p.full) <= 7999 THEN p.full ELSE p.base::text END AS payload
      FROM (
        SELECT x.e AS base, CASE WHEN r.row IS NOT NULL THEN (x.e || jsonb_build_object('job', r.row))::text END AS full, x.o
        FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, o)
        LEFT JOIN LATERAL (SELECT sluice_job_json((x.e->>'jobId')::uuid) AS row
          WHERE x.e->>'state' IN ('SUCCEEDED', 'FAILED', 'CANCELLED') OFFSET 0) r ON true
        ORDER BY x.o OFFSET 0) p
      OFFSET 0) q
    OFFSET 0) n;
END $function$;
