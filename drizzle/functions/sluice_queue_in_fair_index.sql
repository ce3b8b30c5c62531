-- sluice_queue_in_fair_index: whether a queue is in the fair index (sched_queues_fair_idx's
-- predicate): marked ready, and not dormant (its tenant suspended or quota-blocked, every job due
-- later, or every due job for a held API). The lease's walk, the lift, the reserved totals and the
-- shares triggers read it. Inlined by the planner, so the walk still matches the partial index.
CREATE OR REPLACE FUNCTION sluice_queue_in_fair_index(q sched_queues)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT q.ready_at IS NOT NULL AND NOT q.tenant_dormant AND NOT q.scheduled AND q.held_api IS NULL
$function$;
