-- sluice_lease_pick: the lease's pick, one turn's queue (src/scheduler/lease.ts pickQueue): the
-- eligible queue with the smallest virtual time (ties by tenant id) in the first class of
-- p_classes that has one, and the virtual time of the queue after it (null: alone in its class).
--
-- Two lists, merged: the walk, the first two eligible queues of the fair index after the class's
-- cursor (the last queue passed for good in this call), and the queues this call served (their
-- index entries are behind the cursor, at their old virtual times; their times now are in the
-- call's arrays), read only when one of them could come before the walk's second (m_low, a lower
-- bound on their times per class). A class whose two lists are both empty is dead for the rest of
-- the call: nothing makes a queue eligible within a call (caps fill, blocks and skips grow, a
-- queue served is in the second list, readiness is the call's snapshot).
-- A tenant's eligibility is sluice_tenant_eligible, counting the slots this call took for it
-- (p_tn_add); a scalar subquery per index entry (a key lookup, never planned as a join).
-- Runs under sluice_lease's planner settings.
CREATE OR REPLACE FUNCTION sluice_lease_pick(p_classes text[], p_cur sluice_lease_queue[], INOUT dead boolean[], INOUT m_low double precision[], p_sv_key text[], p_sv_t uuid[], p_sv_c text[], p_sv_v double precision[], p_tn_id uuid[], p_tn_add integer[], p_skip text[], OUT ci integer, OUT q sluice_lease_queue, OUT from_walk boolean, OUT next_vtime double precision)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
  c text;
  -- The walk's candidates (at most 2) and the served queues' (merged), each in (vtime, tenant) order.
  walk sluice_lease_queue[];
  mem sluice_lease_queue[];
  i int;
  k int;
BEGIN
  FOR x IN 1 .. cardinality(p_classes) LOOP
    CONTINUE WHEN dead[x];
    c := p_classes[x];
    SELECT coalesce(array_agg(ROW(w.tenant_id, w.vtime)::sluice_lease_queue ORDER BY w.o), '{}') INTO walk FROM (
      SELECT sq.tenant_id, sq.vtime, row_number() OVER () AS o FROM (
        SELECT sq.tenant_id, sq.vtime FROM sched_queues sq
        WHERE sq.class = c AND sluice_queue_in_fair_index(sq) AND sq.ready_at <= now()
          AND (sq.vtime, sq.tenant_id) > ((p_cur[x]).vtime, (p_cur[x]).tenant_id)
          AND coalesce((SELECT sluice_tenant_eligible(st, coalesce(p_tn_add[array_position(p_tn_id, st.tenant_id)], 0))
              FROM sched_tenants st WHERE st.tenant_id = sq.tenant_id), false)
        ORDER BY sq.class, sq.vtime, sq.tenant_id LIMIT 2) sq) w;
    mem := '{}';
    IF cardinality(p_sv_key) > 0 AND (cardinality(walk) < 2 OR m_low[x] <= (walk[2]).vtime) THEN
      SELECT coalesce(array_agg(ROW(m.mt, m.mv)::sluice_lease_queue ORDER BY m.mv, m.mt), '{}') INTO mem
      FROM unnest(p_sv_key, p_sv_t, p_sv_c, p_sv_v) m(mk, mt, mc, mv)
      WHERE m.mc = c AND (cardinality(walk) < 2 OR (m.mv, m.mt) < ((walk[2]).vtime, (walk[2]).tenant_id)) AND NOT (m.mk = ANY (p_skip))
        AND coalesce((SELECT sluice_tenant_eligible(st, coalesce(p_tn_add[array_position(p_tn_id, st.tenant_id)], 0))
            FROM sched_tenants st WHERE st.tenant_id = m.mt), false);
      -- None before the walk's second: every eligible served queue of the class is at or after it
      -- (virtual times only grow within the call).
      IF cardinality(mem) = 0 AND cardinality(walk) = 2 THEN m_low[x] := (walk[2]).vtime; END IF;
    END IF;
    IF cardinality(walk) = 0 AND cardinality(mem) = 0 THEN
      dead[x] := true;
      CONTINUE;
    END IF;
    -- Merge: the pick and the next of both lists.
    i := 1;
    k := 1;
    WHILE next_vtime IS NULL AND (i <= cardinality(walk) OR k <= cardinality(mem)) LOOP
      IF k > cardinality(mem) OR (i <= cardinality(walk) AND ((walk[i]).vtime, (walk[i]).tenant_id) < ((mem[k]).vtime, (mem[k]).tenant_id)) THEN
        IF q IS NULL THEN q := walk[i]; from_walk := true; ELSE next_vtime := (walk[i]).vtime; END IF;
        i := i + 1;
      ELSE
        IF q IS NULL THEN q := mem[k]; from_walk := false; ELSE next_vtime := (mem[k]).vtime; END IF;
        k := k + 1;
      END IF;
    END LOOP;
    ci := x;
    RETURN;
  END LOOP;
END $function$;
