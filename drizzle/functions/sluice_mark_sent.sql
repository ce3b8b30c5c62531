-- sluice_mark_sent: the "sent" mark (src/scheduler/sql/reservations.ts markSent), ONE statement for
-- all the reservations a lease returned, before their calls are sent: one lease_sends row per lease
-- (not an update of each reservation: a lease carries up to a few hundred), which marks every
-- reservation of the lease sent but the riders (p_riders, a batch's duplicate inputs that ride on
-- another attempt's call: fenced, not marked), makes the lease last at least p_lease_seconds from
-- now, and sends the fenced jobs' RUNNING events (sluice_job_events). Returns the reservations it
-- fenced: the open ones among p_ids of the leases it marked.
-- The mark and the sweeper's expiry of a lease never marked both insert the lease's row, so they
-- cannot both win: a lease the sweeper claimed first is not marked (ON CONFLICT: its insert waits
-- for the claim's commit, then does nothing) and none of its calls is sent; a lease marked first
-- is one the sweeper finds sent, with its longer lease. The mark's time is its statement's now(),
-- so the distinct marks count the statements.
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
    INSERT INTO lease_sends AS s (lease_id, sent_at, lease_expires_at, riders)
      SELECT DISTINCT r.lease_id, now(), now() + make_interval(secs => p_lease_seconds), nullif(p_riders, '{}')
      FROM reservations r WHERE r.id = ANY (p_ids)
    ON CONFLICT (lease_id) DO NOTHING
    RETURNING s.lease_id)
  SELECT coalesce(jsonb_agg(jsonb_build_object('id', r.id, 'jobId', r.job_id, 'tenantId', r.tenant_id, 'state', 'RUNNING')), '[]')
    INTO marked
    FROM reservations r JOIN m ON m.lease_id = r.lease_id
    WHERE r.id = ANY (p_ids) AND r.settled_at IS NULL;
  PERFORM sluice_job_events((SELECT coalesce(jsonb_agg(e - 'id'), '[]') FROM jsonb_array_elements(marked) e));
  RETURN QUERY SELECT (e->>'id')::uuid FROM jsonb_array_elements(marked) e;
END $function$;
