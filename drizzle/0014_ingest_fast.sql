-- Issue 11, the front door at full speed: admission's cost per group in the number of tenants it
-- touches, not in the number of tenants there are.
--
-- The depth trigger's counter update joined sched_queues with the delta's jsonb elements. The
-- planner cannot see how many elements there are (it guesses 100) and hashed them against a
-- sequential scan of sched_queues: every statement that changed a job's state (each submission
-- group, each lease, each settlement) read every queue's row, O(tenants). The tenants named in
-- the delta now also drive an index lookup (= ANY of an array), so only their rows are read.
CREATE OR REPLACE FUNCTION sluice_apply_depth_delta(delta jsonb) RETURNS void LANGUAGE sql AS $$
  UPDATE sched_queues q SET depth = q.depth + d.n
  FROM jsonb_to_recordset(delta) AS d(tenant_id uuid, priority text, n int)
  WHERE q.tenant_id = d.tenant_id AND q.class = d.priority
    AND q.tenant_id = ANY (ARRAY(SELECT (e->>'tenant_id')::uuid FROM jsonb_array_elements(delta) e));
$$;
