-- sluice_mark_sent: the "sent" mark (src/scheduler/sql/reservations.ts markSent), ONE statement for
-- all the reservations a lease returned, before their calls are sent: marks the open ones sent
-- (p_riders, a batch's duplicate inputs that ride on another attempt's call, are fenced the same
-- way but not marked), makes each lease last at least p_lease_seconds from now, and sends their
-- jobs' RUNNING events (sluice_job_events). Returns the reservations it fenced.
-- The events leave here rather than from the lease's commit: the lease runs one at a time per
-- window, so every statement taken out of it is throughput (the events were about a tenth of a
-- lease's time); a job's RUNNING event still commits before its call is sent, so before its final
-- event. A lease whose rows never reached its node sends none (its expiry requeues the jobs).
CREATE OR REPLACE FUNCTION sluice_mark_sent(p_ids uuid[], p_riders uuid[], p_lease_seconds double precision)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
  marked jsonb;
BEGIN
  WITH m AS (
    UPDATE reservations r SET sent_at = CASE WHEN r.id = ANY (p_riders) THEN r.sent_at ELSE now() END,
      lease_expires_at = greatest(r.lease_expires_at, now() + make_interval(secs => p_lease_seconds))
    WHERE r.id = ANY (p_ids) AND r.settled_at IS NULL
    RETURNING r.id, r.job_id, r.tenant_id)
  SELECT coalesce(jsonb_agg(jsonb_build_object('id', m.id, 'jobId', m.job_id, 'tenantId', m.tenant_id, 'state', 'RUNNING')), '[]')
    INTO marked FROM m;
  PERFORM sluice_job_events((SELECT coalesce(jsonb_agg(e - 'id'), '[]') FROM jsonb_array_elements(marked) e));
  RETURN QUERY SELECT (e->>'id')::uuid FROM jsonb_array_elements(marked) e;
END $function$;
