-- sluice_lease_budget: the lease's budget, read once at the start of a call: the window's tokens
-- now (its bucket refilled to this instant; null = an unpaced window), the whole tokens a call may
-- spend (an unpaced window's is the largest int), and the pool's room (its size less the calls in
-- flight, where the slots settlements gave back since the last lease, window_slot_deltas, count as
-- free). No row when the call may lease nothing: the window is missing or paused, or the account
-- stopped. Counters are never clamped: more slots released than taken raises check_violation
-- instead of leasing on a wrong count. Runs under sluice_lease's planner settings and its try-lock.
CREATE OR REPLACE FUNCTION sluice_lease_budget(p_window text, p_pool integer)
 RETURNS TABLE(now_tokens double precision, tok integer, room integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
  w record;
  pending int;
BEGIN
  SELECT x.*, sluice_window_tokens(x) AS tokens_now INTO w FROM windows x WHERE x.name = p_window;
  IF NOT FOUND OR (w.paused_until IS NOT NULL AND w.paused_until > clock_timestamp())
     OR EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp()) THEN
    RETURN;
  END IF;
  SELECT coalesce(sum(d.n), 0)::int INTO pending FROM window_slot_deltas d WHERE d."window" = p_window;
  IF w.in_flight + pending < 0 THEN
    RAISE EXCEPTION 'sluice_lease: window % has % calls in flight: more pool slots released than taken', p_window, w.in_flight + pending
      USING ERRCODE = 'check_violation';
  END IF;
  now_tokens := w.tokens_now;
  tok := CASE WHEN w.tokens_now IS NULL THEN 2147483647 ELSE floor(w.tokens_now + 1e-9)::int END;
  room := p_pool - (w.in_flight + pending);
  RETURN NEXT;
END $function$;
