-- sluice_settle: settles reservations exactly once (settled_at null -> set: billed on success,
-- refunded otherwise, as each outcome says), adds what it bills to their jobs' creditsBilled (I11),
-- and releases what they held: the tenants' cap slots and reserved credits (rows locked in id
-- order; the bills and refunds go on their periods' ledger rows), and the window's pool slots,
-- appended to window_slot_deltas instead of updating the window's hot row (the next lease folds
-- them). Returns the reservations it settled. Its parts are sluice_settle_reservations,
-- sluice_bill_jobs and sluice_release_settled (sluice_settle_group runs them with the jobs' final
-- states and events).
-- Counters are not clamped: releasing more than was taken raises (CHECK in_flight >= 0, reserved
-- >= 0). The bill alone is clamped to [0, credits]: an input from the provider, not a counter.
-- outcomes: [{"id", "billed", "outcome"}, ...]
CREATE OR REPLACE FUNCTION sluice_settle(outcomes jsonb)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
  settled jsonb;
BEGIN
  settled := sluice_settle_reservations(outcomes);
  PERFORM sluice_bill_jobs(settled, '{}');
  RETURN QUERY SELECT r FROM sluice_release_settled(settled) r;
END $function$;
