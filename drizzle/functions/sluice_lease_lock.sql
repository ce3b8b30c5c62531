-- sluice_lease_lock: the lease's locks for one turn: the picked tenant's row, locked and its
-- eligibility re-checked (sluice_tenant_eligible, counting the p_added slots this call took for
-- it), then the queue's row. Returns status 'ok' (both held: tenant is the row), 'skip' (the queue
-- sits out the call) or 'end' (the call ends).
--
-- The tenant's row is waited for only while the call holds no tenant row (holding false); after
-- that SKIP LOCKED, and a front tenant held by someone else, still eligible, ends the call rather
-- than be overtaken. After a wait (a settlement held the row), or for a queue picked as alone in
-- its class in a paced window (p_alone_paced), the pick stands, but the walk that bounded its turn
-- saw only queues ready by the call's start, and one whose submission committed since bounds the
-- turn too (else the lone queue took a whole batch quantum, 20 x its weight, ahead of a tenant
-- already answered): next_vtime is lowered to its start tag (at least the class clock p_clock).
-- Ready by the clock, not by now(): its jobs may not be fetchable in this call (pg-boss fetches by
-- now()), but it is waiting. Only the first row is waited for: at most once a call.
--
-- The queue's row is never waited for (a served queue's is held already): held by another
-- transaction (a submission's depth trigger, mostly), the queue sits out this call.
-- Runs under sluice_lease's planner settings.
CREATE OR REPLACE FUNCTION sluice_lease_lock(p_tenant uuid, p_class text, p_added integer, p_clock double precision, p_alone_paced boolean, p_served boolean, INOUT holding boolean, INOUT next_vtime double precision, OUT status text, OUT tenant sched_tenants)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
  waited_at timestamptz;
  n_now float8;
BEGIN
  IF holding THEN
    SELECT st.* INTO tenant FROM sched_tenants st
      WHERE st.tenant_id = p_tenant AND sluice_tenant_eligible(st, p_added)
      FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      status := CASE WHEN EXISTS (SELECT 1 FROM sched_tenants st WHERE st.tenant_id = p_tenant AND sluice_tenant_eligible(st, p_added))
        THEN 'end' ELSE 'skip' END;
      RETURN;
    END IF;
  ELSE
    waited_at := clock_timestamp();
    SELECT st.* INTO tenant FROM sched_tenants st
      WHERE st.tenant_id = p_tenant AND sluice_tenant_eligible(st, p_added)
      FOR UPDATE;
    IF NOT FOUND THEN
      status := 'skip';
      RETURN;
    END IF;
    holding := true;
    IF clock_timestamp() - waited_at > interval '1 millisecond' OR p_alone_paced THEN
      -- (No tenant row was held before this one, so no turn has added slots yet: p_added is 0 for all.)
      SELECT greatest(sq.vtime, p_clock) INTO n_now FROM sched_queues sq
        WHERE sq.class = p_class AND sluice_queue_in_fair_index(sq) AND sq.ready_at <= clock_timestamp() AND sq.tenant_id <> p_tenant
          AND coalesce((SELECT sluice_tenant_eligible(st, 0) FROM sched_tenants st WHERE st.tenant_id = sq.tenant_id), false)
        ORDER BY sq.class, sq.vtime, sq.tenant_id LIMIT 1;
      IF FOUND AND (next_vtime IS NULL OR n_now < next_vtime) THEN next_vtime := n_now; END IF;
    END IF;
  END IF;
  IF NOT p_served THEN
    PERFORM 1 FROM sched_queues sq WHERE sq.tenant_id = p_tenant AND sq.class = p_class FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      status := 'skip';
      RETURN;
    END IF;
  END IF;
  status := 'ok';
END $function$;
