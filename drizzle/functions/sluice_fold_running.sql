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
CREATE OR REPLACE FUNCTION sluice_fold_running()
 RETURNS integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE folded int := 0;
BEGIN
  IF NOT pg_try_advisory_xact_lock(7564291) THEN RETURN 0; END IF;
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
