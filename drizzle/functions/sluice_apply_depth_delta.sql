-- sluice_apply_depth_delta: adds a statement's depth changes to sched_queues.depth (the depth
-- triggers on jobs call it). deltas: [{"tenant_id", "priority", "n"}, ...]
--
-- The tenants named in the delta drive an index lookup (= ANY of an array), so only their rows are
-- read. Joined with the jsonb elements alone, the planner (guessing 100 elements) hashed them
-- against a sequential scan of sched_queues: every statement that changed a job's state (each
-- submission group, lease and settlement) read every queue's row, O(tenants).
CREATE OR REPLACE FUNCTION sluice_apply_depth_delta(delta jsonb)
 RETURNS void
 LANGUAGE sql
 SET enable_seqscan TO 'off'
AS $function$
  UPDATE sched_queues q SET depth = q.depth + d.n
  FROM jsonb_to_recordset(delta) AS d(tenant_id uuid, priority text, n int)
  WHERE q.tenant_id = d.tenant_id AND q.class = d.priority
    AND q.tenant_id = ANY (ARRAY(SELECT (e->>'tenant_id')::uuid FROM jsonb_array_elements(delta) e));
$function$;
