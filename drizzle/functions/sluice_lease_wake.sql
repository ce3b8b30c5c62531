-- sluice_lease_wake: the lease's due check, after its last turn: scheduled queues whose earliest
-- job is due now, and queues held for an API this call does not hold (p_hold: its breaker closed
-- here, or another node's held it), come back to the fair index at the class clock (no credit for
-- the time away). At most 256 of each a call, after every tenant row the call takes, SKIP LOCKED:
-- never waits. With nothing due it is two probes and one per distinct held API (the loose scan
-- below), whatever the number of dormant queues (docs/ARCHITECTURE.md "Dormant work").
-- Runs under sluice_lease's planner settings.
CREATE OR REPLACE FUNCTION sluice_lease_wake(p_hold text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
  wake_apis text[];
BEGIN
  WITH RECURSIVE h(api) AS (
    SELECT min(l.held_api) FROM sched_queues l WHERE l.held_api IS NOT NULL
    UNION ALL
    SELECT (SELECT min(l.held_api) FROM sched_queues l WHERE l.held_api > h.api) FROM h WHERE h.api IS NOT NULL)
  SELECT coalesce(array_agg(h.api), '{}') INTO wake_apis FROM h WHERE h.api IS NOT NULL AND NOT (h.api = ANY (p_hold));
  WITH a AS (SELECT l.tenant_id, l.class FROM sched_queues l WHERE l.scheduled AND l.ready_at <= now()
      ORDER BY l.ready_at LIMIT 256 FOR UPDATE SKIP LOCKED),
    b AS (SELECT l.tenant_id, l.class FROM sched_queues l WHERE l.held_api = ANY (wake_apis)
      LIMIT 256 FOR UPDATE SKIP LOCKED)
  UPDATE sched_queues sq SET scheduled = false, held_api = NULL, vtime = greatest(sq.vtime, k.clock)
    FROM sched_classes k, (SELECT a.tenant_id, a.class FROM a UNION SELECT b.tenant_id, b.class FROM b) l
    WHERE k.class = sq.class AND sq.tenant_id = l.tenant_id AND sq.class = l.class;
END $function$;
