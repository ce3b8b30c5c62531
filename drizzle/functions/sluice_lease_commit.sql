-- sluice_lease_commit: the second half of the lease's commit, after sluice_lease_claim (p_out, the
-- claimed attempts), on rows the call holds, one statement each for all turns:
-- - each served queue's virtual time (p_sv_*) and, for the jobs it claimed, its depth (down),
--   which the claim's depth trigger left to this write (sluice.lease_claim); a queue that claimed
--   jobs and has nothing left waiting goes idle (a submission or a retry marks it ready again): one
--   write per queue (running jobs are not counted on the row: visibility counts them in jobs).
--   A queue it idles leaves the fair index: the change of its class's reserved-shares totals goes
--   straight into the class's row with the fold below (this call writes that row anyway), not
--   through a sched_share_deltas row appended by the shares trigger (sluice.lease_commit keeps it
--   from firing) and deleted again by the next fold.
--   A claimed queue not among the served ones (none expected: every pick is a served queue's)
--   gets its depth the trigger's way;
-- - the credits: the reservations (one per attempt, all with this call's lease id: their node's
--   sent mark is one lease_sends row for them all), and each tenant's ledger row for the period if
--   it has none yet (the settlements add to it; the credits held are on the tenant's row, written
--   with its cap slots by sluice_lease_claim: an existing ledger row is not written);
-- - each class's clock: the largest start tag served in fair order (p_served; no credit for idle
--   time), and the reserved-shares deltas folded into the classes' counters (SKIP LOCKED: a
--   concurrent fold, another window's lease or the sweeper, takes the rest), with this call's
--   idled queues';
-- - the lift: ready queues lagging the new clock by more than LAG_SLACK (8: a few turns' worth)
--   are lifted to it: passed over while their tenant was capped, an API held or the row locked, or
--   marked ready at a clock this call then moved; otherwise such a queue is served alone until it
--   catches up. SKIP LOCKED, after every tenant row the call takes: never waits. Once lifted, a
--   queue still passed over is lifted again only after the clock moves another 8;
-- - the window's row, once and last: the slot releases settlements appended since the last lease
--   folded in (only this call can run on the window now: its try-lock), its tokens and slots
--   taken, only if they are still there; otherwise SL409, which sluice_lease turns into 'changed';
-- The RUNNING events are not sent here: the node's sent mark sends them (sluice_mark_sent), out of
-- the window's one-at-a-time lease.
-- Runs under sluice_lease's planner settings.
CREATE OR REPLACE FUNCTION sluice_lease_commit(p_window text, p_node uuid, p_pool integer, p_lease_seconds integer, p_tokens_used integer, p_out jsonb, p_sv_key text[], p_sv_t uuid[], p_sv_c text[], p_sv_v double precision[], p_served jsonb)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
  c text;
  lift_to float8;
  pending int;
  slots int;
  stray jsonb;
  lease uuid := gen_random_uuid();
  idled_c text[];
  idled_r numeric[];
  idled_w numeric[];
  idled_rw numeric[];
BEGIN
  PERFORM set_config('sluice.lease_commit', 'on', true);
  WITH was AS (
    SELECT q.tenant_id, q.class, sluice_queue_in_fair_index(q) AS was FROM sched_queues q
    WHERE (q.tenant_id, q.class) IN (SELECT * FROM unnest(p_sv_t, p_sv_c)) AND q.tenant_id = ANY (p_sv_t)),
  u AS (
    UPDATE sched_queues sq SET vtime = x.v, depth = sq.depth - coalesce(d.n, 0),
        ready_at = CASE WHEN d.n IS NOT NULL AND sq.depth - d.n = 0 THEN NULL ELSE sq.ready_at END
      FROM unnest(p_sv_key, p_sv_t, p_sv_c, p_sv_v) x(k, t, c, v)
      LEFT JOIN (SELECT (o->>'tenant_id')::uuid AS t, o->>'class' AS c, count(*)::int AS n FROM jsonb_array_elements(p_out) o GROUP BY 1, 2) d
        ON d.t = x.t AND d.c = x.c
      WHERE sq.tenant_id = x.t AND sq.class = x.c AND sq.tenant_id = ANY (p_sv_t)
      RETURNING sq.tenant_id, sq.class, sluice_queue_in_fair_index(sq) AS now)
  SELECT coalesce(array_agg(u.class), '{}'), coalesce(array_agg(CASE WHEN st.reserved_share > 0 THEN -st.reserved_share::numeric ELSE 0 END), '{}'),
      coalesce(array_agg(CASE WHEN st.reserved_share > 0 THEN 0 ELSE -st.weight END), '{}'),
      coalesce(array_agg(CASE WHEN st.reserved_share > 0 THEN -st.weight ELSE 0 END), '{}')
    INTO idled_c, idled_r, idled_w, idled_rw
    FROM u JOIN was ON was.tenant_id = u.tenant_id AND was.class = u.class JOIN sched_tenants st ON st.tenant_id = u.tenant_id
    WHERE was.was AND NOT u.now AND st.weight > 0;
  PERFORM set_config('sluice.lease_commit', 'off', true);
  IF jsonb_array_length(p_out) = 0 THEN
    RETURN;
  END IF;
  SELECT coalesce(jsonb_agg(jsonb_build_object('tenant_id', d.t, 'priority', d.c, 'n', -d.n)), '[]') INTO stray
    FROM (SELECT (o->>'tenant_id')::uuid AS t, o->>'class' AS c, count(*)::int AS n FROM jsonb_array_elements(p_out) o GROUP BY 1, 2) d
    WHERE NOT (d.t::text || '/' || d.c) = ANY (p_sv_key);
  IF jsonb_array_length(stray) > 0 THEN
    PERFORM sluice_apply_depth_delta(stray);
  END IF;
  INSERT INTO tenant_ledger (tenant_id, period_start)
    SELECT DISTINCT (o->>'tenant_id')::uuid, (o->>'period')::timestamptz FROM jsonb_array_elements(p_out) o
    ON CONFLICT (tenant_id, period_start) DO NOTHING;
  INSERT INTO reservations (id, job_id, attempt, tenant_id, period_start, "window", node_id, credits, window_slot, created_at, lease_expires_at, lease_id)
    SELECT (o->>'rid')::uuid, (o->>'id')::uuid, (o->>'attempt')::int, (o->>'tenant_id')::uuid, (o->>'period')::timestamptz, p_window, p_node,
      (o->>'cost')::int, (o->>'slot')::boolean, clock_timestamp(), clock_timestamp() + make_interval(secs => p_lease_seconds), lease
    FROM jsonb_array_elements(p_out) o;
  UPDATE sched_classes k SET clock = greatest(k.clock, (p_served->>k.class)::float8), served_at = now() WHERE p_served ? k.class;
  WITH d AS (DELETE FROM sched_share_deltas x WHERE x.ctid = ANY (ARRAY(SELECT y.ctid FROM sched_share_deltas y FOR UPDATE SKIP LOCKED))
    RETURNING x.class, x.r, x.w, x.rw),
  a AS (SELECT d.class, d.r, d.w, d.rw FROM d UNION ALL SELECT * FROM unnest(idled_c, idled_r, idled_w, idled_rw))
  UPDATE sched_classes k SET reserved_sum = k.reserved_sum + s.r, unreserved_weight = k.unreserved_weight + s.w, reserved_weight = k.reserved_weight + s.rw
    FROM (SELECT a.class, sum(a.r) AS r, sum(a.w) AS w, sum(a.rw) AS rw FROM a GROUP BY a.class) s WHERE k.class = s.class;
  FOR c IN SELECT jsonb_object_keys(p_served) LOOP
    SELECT k.clock INTO lift_to FROM sched_classes k WHERE k.class = c;
    UPDATE sched_queues q SET vtime = lift_to
      WHERE q.class = c AND q.tenant_id IN (
        SELECT l.tenant_id FROM sched_queues l
        WHERE l.class = c AND sluice_queue_in_fair_index(l) AND l.vtime < lift_to - 8
        FOR UPDATE SKIP LOCKED);
  END LOOP;
  WITH f AS (DELETE FROM window_slot_deltas d WHERE d."window" = p_window RETURNING d.n)
  SELECT coalesce(sum(f.n), 0)::int INTO pending FROM f;
  SELECT count(*) FILTER (WHERE (o->>'slot')::boolean)::int INTO slots FROM jsonb_array_elements(p_out) o;
  UPDATE windows x SET
      tokens = coalesce(sluice_window_tokens(x) - p_tokens_used, 0),
      refilled_at = clock_timestamp(), in_flight = x.in_flight + pending + slots
    WHERE x.name = p_window
      AND (x.paused_until IS NULL OR x.paused_until <= clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp())
      AND coalesce(sluice_window_tokens(x) >= p_tokens_used - 1e-9, true)
      AND x.in_flight + pending + slots <= p_pool;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'sluice_lease: window % changed under the lease', p_window USING ERRCODE = 'SL409';
  END IF;
END $function$;
