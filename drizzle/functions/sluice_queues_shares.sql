-- sluice_queues_shares: row-level trigger (AFTER UPDATE, DELETE on sched_queues, fired only when
-- the row enters or leaves the fair index: its WHEN clause): appends the change of its class's
-- reserved-shares totals to sched_share_deltas, so the lease reads R, W and RW as counters instead of
-- summing every ready queue of the class on each call. In the index = backlogged (ready, and not
-- dormant: tenant suspended or quota-blocked, scheduled later, held by a breaker); a tenant of
-- weight 0 counts nowhere. Insert only: no writer waits on another. A queue deleted after its
-- tenant's row (a tenant's deletion cascades to both) was counted out by sluice_tenants_shares.
CREATE OR REPLACE FUNCTION sluice_queues_shares()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
  st record;
  sign int;
BEGIN
  IF TG_OP = 'DELETE' THEN
    sign := -1;
  ELSE
    sign := CASE WHEN sluice_queue_in_fair_index(NEW) THEN 1 ELSE -1 END;
  END IF;
  SELECT t.weight, t.reserved_share INTO st FROM sched_tenants t WHERE t.tenant_id = OLD.tenant_id;
  IF NOT FOUND OR st.weight <= 0 THEN RETURN NULL; END IF;
  INSERT INTO sched_share_deltas (class, r, w, rw) VALUES (OLD.class,
    CASE WHEN st.reserved_share > 0 THEN sign * st.reserved_share::numeric ELSE 0 END,
    CASE WHEN st.reserved_share > 0 THEN 0 ELSE sign * st.weight END,
    CASE WHEN st.reserved_share > 0 THEN sign * st.weight ELSE 0 END);
  RETURN NULL;
END $function$;

-- The triggers executing it (as pg_get_triggerdef prints them).
-- Only a row entering or leaving the fair index calls the function: a depth or virtual-time write
-- (nearly every write of the table) is judged by the WHEN clause alone.
-- Not for the lease commit's own write (sluice.lease_commit on): it folds the change it makes
-- into the classes' row itself.
CREATE TRIGGER sched_queues_shares_upd AFTER UPDATE ON sched_queues FOR EACH ROW
  WHEN (((sluice_queue_in_fair_index(old.*) IS DISTINCT FROM sluice_queue_in_fair_index(new.*)) AND (current_setting('sluice.lease_commit'::text, true) IS DISTINCT FROM 'on'::text)))
  EXECUTE FUNCTION sluice_queues_shares();

CREATE TRIGGER sched_queues_shares_del AFTER DELETE ON sched_queues FOR EACH ROW
  WHEN (sluice_queue_in_fair_index(old.*))
  EXECUTE FUNCTION sluice_queues_shares();
