-- sluice_fold_running: folds sched_running_deltas (appended by the RUNNING triggers) into
-- sched_queues.running; the sweeper calls it every round, one folder at a time (advisory lock).
--
-- It never waits for a queue row: a lease updates several sched_queues rows in fair order in one
-- transaction and a submission group's depth trigger several in its own order, and a fold that
-- updated its rows in hash order deadlocked with them (40P01 a few times a second with 2 and 4
-- worker processes). It locks the rows it will fold in key order with SKIP LOCKED and folds only
-- their deltas: a held row's deltas wait for the next round (readers add unfolded deltas, so no
-- reader sees a wrong count meanwhile), and a transaction that never waits closes no cycle.
-- The count is not clamped at zero: folding more leaves than entries raises (CHECK running >= 0).
--
-- It also steps aside for the leases: unless p_force, it first takes every window's lease lock
-- (the try-lock sluice_lease takes), and returns -1 without folding when one is held. A lease that
-- met a queue row held by the fold passed that queue over for its call (it never waits for one),
-- and the queue lost its turn to the next in fair order: the sfq bench's pairs over the SFQ bound
-- (up to 1.37 x, in 2 runs of 8) were such turns, none in 4 runs with the fold paused. Leases
-- meanwhile answer 'busy' and retry within 10 ms. The caller forces a fold after a few rounds
-- stepped aside, so the deltas table stays small under leases that never pause.
CREATE OR REPLACE FUNCTION sluice_fold_running(p_force boolean DEFAULT false)
 RETURNS integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE folded int := 0;
BEGIN
  IF NOT pg_try_advisory_xact_lock(7564291) THEN RETURN 0; END IF;
  IF NOT p_force AND NOT (SELECT coalesce(bool_and(pg_try_advisory_xact_lock(hashtext('sluice_lease'), hashtext(w.name))), true) FROM windows w) THEN
    RETURN -1;
  END IF;
  WITH k AS (SELECT DISTINCT tenant_id, class FROM sched_running_deltas),
    l AS (SELECT q.tenant_id, q.class FROM sched_queues q JOIN k ON q.tenant_id = k.tenant_id AND q.class = k.class
          ORDER BY q.tenant_id, q.class FOR UPDATE OF q SKIP LOCKED),
    d AS (DELETE FROM sched_running_deltas r USING l WHERE r.tenant_id = l.tenant_id AND r.class = l.class
          RETURNING r.tenant_id, r.class, r.n),
    g AS (SELECT tenant_id, class, sum(n)::int AS n, count(*)::int AS c FROM d GROUP BY tenant_id, class),
    u AS (UPDATE sched_queues q SET running = q.running + g.n FROM g WHERE q.tenant_id = g.tenant_id AND q.class = g.class RETURNING 1)
  SELECT coalesce(sum(c), 0) INTO folded FROM g;
  RETURN folded;
END $function$;
