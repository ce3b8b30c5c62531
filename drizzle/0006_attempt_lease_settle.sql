-- One liveness authority: every attempt holds a lease on its reservation, refreshed by the node that
-- runs it on its own timer (fenced by the reservation id). The sweeper settles only reservations whose
-- lease has expired; node heartbeats and pg-boss's job heartbeat no longer decide that an attempt died.
ALTER TABLE "reservations" ADD COLUMN "lease_expires_at" timestamp with time zone DEFAULT now() NOT NULL;
--> statement-breakpoint
CREATE INDEX "reservations_lease_idx" ON "reservations" USING btree ("lease_expires_at") WHERE "reservations"."settled_at" is null;
--> statement-breakpoint
-- Settles many reservations in one call, exactly once each (fenced by settled_at is null), and returns
-- the ids it settled: a reservation settled already (by the sweeper after its lease expired, or by an
-- earlier try whose commit acknowledgement was lost) changes nothing. Locks follow the documented order
-- (docs/ARCHITECTURE.md, "Lock order"): reservations, then tenants in id order, then their ledger rows,
-- then the windows (the hot rows) last.
-- outcomes: [{"id": uuid, "billed": int, "outcome": text}, ...]
CREATE FUNCTION sluice_settle(outcomes jsonb) RETURNS SETOF uuid LANGUAGE plpgsql AS $$
DECLARE
  settled jsonb;
BEGIN
  WITH s AS (
    UPDATE reservations r SET settled_at = clock_timestamp(),
      billed = least(r.credits, greatest(0, (o->>'billed')::int)), outcome = o->>'outcome'
    FROM jsonb_array_elements(outcomes) o
    WHERE r.id = (o->>'id')::uuid AND r.settled_at IS NULL
    RETURNING r.id, r.tenant_id, r.period_start, r."window", r.credits, r.billed, r.window_slot)
  SELECT coalesce(jsonb_agg(s), '[]'::jsonb) INTO settled FROM s;
  IF jsonb_array_length(settled) = 0 THEN
    RETURN;
  END IF;
  PERFORM 1 FROM sched_tenants t
    WHERE t.tenant_id IN (SELECT (x->>'tenant_id')::uuid FROM jsonb_array_elements(settled) x)
    ORDER BY t.tenant_id FOR UPDATE;
  UPDATE sched_tenants t SET in_flight = greatest(0, t.in_flight - d.n)
    FROM (SELECT (x->>'tenant_id')::uuid AS tenant_id, count(*)::int AS n FROM jsonb_array_elements(settled) x GROUP BY 1) d
    WHERE t.tenant_id = d.tenant_id;
  UPDATE tenant_ledger l SET reserved = l.reserved - d.credits, billed = l.billed + d.billed,
      refunded = l.refunded + d.credits - d.billed
    FROM (SELECT (x->>'tenant_id')::uuid AS tenant_id, (x->>'period_start')::timestamptz AS period_start,
            sum((x->>'credits')::int) AS credits, sum((x->>'billed')::int) AS billed
          FROM jsonb_array_elements(settled) x GROUP BY 1, 2) d
    WHERE l.tenant_id = d.tenant_id AND l.period_start = d.period_start;
  -- Hot rows last: the window's pool slots.
  UPDATE windows w SET in_flight = greatest(0, w.in_flight - d.n)
    FROM (SELECT x->>'window' AS name, count(*)::int AS n FROM jsonb_array_elements(settled) x
          WHERE (x->>'window_slot')::boolean GROUP BY 1) d
    WHERE w.name = d.name;
  RETURN QUERY SELECT (x->>'id')::uuid FROM jsonb_array_elements(settled) x;
END $$;
