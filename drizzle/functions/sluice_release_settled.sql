-- sluice_release_settled: the second half of a settlement (sluice_settle): releases what the
-- reservations just settled by sluice_settle_reservations held: the tenants' cap slots and reserved
-- credits (rows locked in id order), the bills and refunds on the ledger rows of their periods, and
-- the window's pool slots, appended to window_slot_deltas instead of updating the window's hot row
-- (the next lease folds them). Returns the reservations settled. Counters are not clamped:
-- releasing more than was taken raises (CHECK in_flight >= 0, reserved >= 0).
-- settled: what sluice_settle_reservations returned. Nothing settled runs every statement on empty
-- sets (no early return): sluice_settle_group's warm-up plans them too.
CREATE OR REPLACE FUNCTION sluice_release_settled(settled jsonb)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
  PERFORM 1 FROM sched_tenants t
    WHERE t.tenant_id IN (SELECT (x->>'tenant_id')::uuid FROM jsonb_array_elements(settled) x)
    ORDER BY t.tenant_id FOR UPDATE;
  UPDATE sched_tenants t SET in_flight = t.in_flight - d.n, reserved = t.reserved - d.credits
    FROM (SELECT (x->>'tenant_id')::uuid AS tenant_id, count(*)::int AS n, sum((x->>'credits')::int) AS credits
      FROM jsonb_array_elements(settled) x GROUP BY 1) d
    WHERE t.tenant_id = d.tenant_id;
  UPDATE tenant_ledger l SET billed = l.billed + d.billed, refunded = l.refunded + d.credits - d.billed
    FROM (SELECT (x->>'tenant_id')::uuid AS tenant_id, (x->>'period_start')::timestamptz AS period_start,
            sum((x->>'credits')::int) AS credits, sum((x->>'billed')::int) AS billed
          FROM jsonb_array_elements(settled) x GROUP BY 1, 2) d
    WHERE l.tenant_id = d.tenant_id AND l.period_start = d.period_start;
  -- The window's pool slots: appended, never a row lock.
  INSERT INTO window_slot_deltas ("window", n)
    SELECT x->>'window', -count(*)::int FROM jsonb_array_elements(settled) x
    WHERE (x->>'window_slot')::boolean GROUP BY 1;
  RETURN QUERY SELECT (x->>'id')::uuid FROM jsonb_array_elements(settled) x;
END $function$;
