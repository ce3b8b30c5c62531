-- sluice_tenants_shares: row-level trigger (AFTER UPDATE OF weight, reserved_share and AFTER DELETE
-- on sched_tenants, fired only when the weight or the share changes, or on deletion): the tenant's
-- queues in the fair index move their classes' reserved-shares totals (sched_share_deltas) from
-- the old contribution to the new one. A tenant of weight 0 counts nowhere; a reserved tenant
-- counts its share in R and its weight in RW, any other its weight in W.
CREATE OR REPLACE FUNCTION sluice_tenants_shares()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
  INSERT INTO sched_share_deltas (class, r, w, rw)
    SELECT q.class,
      (CASE WHEN TG_OP = 'UPDATE' AND NEW.weight > 0 AND NEW.reserved_share > 0 THEN NEW.reserved_share::numeric ELSE 0 END)
        - (CASE WHEN OLD.weight > 0 AND OLD.reserved_share > 0 THEN OLD.reserved_share::numeric ELSE 0 END),
      (CASE WHEN TG_OP = 'UPDATE' AND NEW.weight > 0 AND NOT NEW.reserved_share > 0 THEN NEW.weight ELSE 0 END)
        - (CASE WHEN OLD.weight > 0 AND NOT OLD.reserved_share > 0 THEN OLD.weight ELSE 0 END),
      (CASE WHEN TG_OP = 'UPDATE' AND NEW.weight > 0 AND NEW.reserved_share > 0 THEN NEW.weight ELSE 0 END)
        - (CASE WHEN OLD.weight > 0 AND OLD.reserved_share > 0 THEN OLD.weight ELSE 0 END)
    FROM sched_queues q
    WHERE q.tenant_id = OLD.tenant_id AND sluice_queue_in_fair_index(q);
  RETURN NULL;
END $function$;

-- The triggers executing it (as pg_get_triggerdef prints them).
CREATE TRIGGER sched_tenants_shares_upd AFTER UPDATE OF weight, reserved_share ON sched_tenants FOR EACH ROW
  WHEN (((old.weight IS DISTINCT FROM new.weight) OR (old.reserved_share IS DISTINCT FROM new.reserved_share)))
  EXECUTE FUNCTION sluice_tenants_shares();

CREATE TRIGGER sched_tenants_shares_del AFTER DELETE ON sched_tenants FOR EACH ROW
  EXECUTE FUNCTION sluice_tenants_shares();
