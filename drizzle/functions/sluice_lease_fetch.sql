-- sluice_lease_fetch: the lease's fetch, one turn's jobs (src/scheduler/lease.ts fetchTurn).
--
-- The take: the quantum to the next queue (items before the queue's virtual time p_vtime passes
-- the next's, at least one; weight p_weight), bounded by p_lease_max and what the call has left
-- (jobs, pool room, tokens) and the tenant's free cap. Or a batch turn, when the head job's API
-- batches (batching.ts batchTake): up to a batch's worth of that API's jobs, at most
-- p_batch_quantum x weight and the quantum too (a pause's tokens are not the front tenant's; the
-- next queues' turns join the same call); in an unpaced window the API's minimum batch instead
-- (tied tenants take their 2 jobs in one turn, not two). With fewer distinct inputs than the API's
-- minimum and no room in the call's open batch of the API (p_ob_api, p_ob_items), single calls,
-- unless a paced window has another queue in the class (p_has_next) to join the call it opens.
--
-- The jobs: fetched from pg-boss exactly as its fetch does (same order, SKIP LOCKED; activation is
-- the commit's), with their credits (p_costs; unknown APIs cost 1) and distinct inputs, singles
-- cut to the pool room and tokens left. exhausted: fewer ready jobs than the take (any API), the
-- queue has nothing more for this call.
--
-- Nothing to hand out: the queue leaves the fair index. Its head job due now is for an API held
-- here: held by that API until a lease not holding it, or a submission, wakes it. Otherwise
-- scheduled: ready again when its earliest queued job is (the due check, sluice_lease_wake).
-- Idle when nothing waits. Its row is the caller's (sluice_lease_lock).
-- Runs under sluice_lease's planner settings.
CREATE OR REPLACE FUNCTION sluice_lease_fetch(p_tenant uuid, p_class text, p_queue text, p_picked uuid[], p_vtime double precision, p_next_vtime double precision, p_weight double precision, p_lease_max integer, p_max_left integer, p_room_left integer, p_tok_left integer, p_cap_free integer, p_paced boolean, p_costs jsonb, p_hold text[], p_batch jsonb, p_batch_max integer, p_batch_quantum integer, p_ob_api text[], p_ob_items integer[], OUT ids uuid[], OUT datas jsonb[], OUT costs integer[], OUT distinct_n integer, OUT batched boolean, OUT head_api text, OUT quantum double precision, OUT exhausted boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
  take int;
  spec jsonb;
  ob_i int;
  n int;
BEGIN
  quantum := CASE WHEN p_next_vtime IS NULL THEN 2147483647 ELSE greatest(1, floor((p_next_vtime - p_vtime) * p_weight) + 1) END;
  take := greatest(1, least(p_lease_max, p_max_left, p_room_left, p_tok_left, p_cap_free, quantum)::int);
  batched := false;
  IF p_batch_max > 1 THEN
    head_api := sluice_lease_head(p_queue, p_picked, p_hold);
    spec := p_batch -> head_api;
    IF spec IS NOT NULL THEN
      batched := true;
      take := greatest(take, least(greatest(take, least(p_tok_left, p_batch_max, (spec->>0)::int, p_cap_free), 1),
        floor(p_batch_quantum * p_weight), CASE WHEN NOT p_paced THEN greatest(quantum, (spec->>1)::int) ELSE quantum END), 1);
      take := least(take, p_max_left);
    END IF;
  END IF;
  SELECT coalesce(array_agg(f.id ORDER BY f.o), '{}'), coalesce(array_agg(f.data ORDER BY f.o), '{}'),
      coalesce(array_agg(coalesce((p_costs ->> (f.data->>'api'))::int, 1) ORDER BY f.o), '{}'), count(DISTINCT f.data->'params')::int
    INTO ids, datas, costs, distinct_n FROM (
    SELECT j.id, j.data, row_number() OVER () AS o FROM (
      SELECT j.id, j.data FROM pgboss.job j
      WHERE j.name = p_queue AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
        AND NOT ((j.data->>'api') = ANY (p_hold)) AND (NOT batched OR j.data->>'api' = head_api)
        AND NOT (j.id = ANY (p_picked))
      ORDER BY j.priority DESC, j.created_on LIMIT take
      FOR UPDATE OF j SKIP LOCKED) j) f;
  exhausted := cardinality(ids) < take AND NOT batched;
  IF cardinality(ids) = 0 THEN
    head_api := CASE WHEN cardinality(p_hold) > 0 THEN sluice_lease_head(p_queue, p_picked, '{}') END;
    IF NOT (head_api = ANY (p_hold)) THEN head_api := NULL; END IF;
    UPDATE sched_queues sq SET
        held_api = CASE WHEN sq.depth = 0 THEN NULL ELSE head_api END,
        scheduled = sq.depth > 0 AND head_api IS NULL,
        ready_at = CASE WHEN sq.depth = 0 THEN NULL WHEN head_api IS NOT NULL THEN sq.ready_at ELSE (
          SELECT greatest(min(jb.run_after), now() + interval '1 second') FROM jobs jb
          WHERE jb.tenant_id = p_tenant AND jb.priority = p_class AND jb.state = 'QUEUED') END
    WHERE sq.tenant_id = p_tenant AND sq.class = p_class;
    RETURN;
  END IF;
  IF batched THEN
    ob_i := array_position(p_ob_api, head_api);
    IF distinct_n < (spec->>1)::int AND NOT coalesce(p_ob_items[ob_i] + distinct_n <= least(p_batch_max, (spec->>0)::int), false)
        AND (NOT p_paced OR p_next_vtime IS NULL) THEN
      batched := false;
    END IF;
  END IF;
  IF NOT batched AND cardinality(ids) > least(p_room_left, p_tok_left) THEN
    n := least(p_room_left, p_tok_left);
    ids := ids[1:n];
    datas := datas[1:n];
    costs := costs[1:n];
  END IF;
END $function$;
