-- sluice_settle_group: a settlement group in one statement: the reservations still open, locked
-- (the fence: a superseded attempt changes nothing), the final states (jobs, result, pg-boss ack in
-- one statement: sluice_finish_jobs, so the ack commits with the stored result, I6), the events of
-- the jobs it finished, then the bills and slots (sluice_settle's halves: the reservations and the
-- jobs' creditsBilled before the events, so a final state's event carries its bill; then its
-- tenants' rows in id order, the ledger, the window's slot deltas). One call instead of seven round trips with tenant rows held
-- across them. The tenants' rows come after the jobs' here: the hot rows are held only for the end
-- of the statement and its commit (a lease holds tenant rows, then waiting jobs; this holds RUNNING
-- jobs under their locked reservations: the two never meet; the sweeper takes a reservation first
-- too). Returns the reservations it settled.
-- No early return when nothing is live: every statement below runs, on empty sets, so a call with
-- no items ('[]', src/scheduler/sql/reservations.ts warmSettleGroup) plans all of them and opens
-- their tables and triggers on its connection before a real settlement needs them there.
-- items: [{"rid", "tenant", "billed", "outcome", "finish": {sluice_finish_jobs item} | absent}, ...]
-- An item without "finish" only settles its reservation (its job was requeued by the caller, in
-- the same transaction, after it locked the same rows in the same order).
CREATE OR REPLACE FUNCTION sluice_settle_group(items jsonb)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
  live uuid[];
  fin jsonb;
  done uuid[];
  settled jsonb;
BEGIN
  SELECT coalesce(array_agg(r.id), '{}') INTO live FROM (
    SELECT r.id FROM reservations r
    WHERE r.id IN (SELECT (e->>'rid')::uuid FROM jsonb_array_elements(items) e) AND r.settled_at IS NULL
    ORDER BY r.id FOR UPDATE) r;
  SELECT coalesce(jsonb_agg(e->'finish' || jsonb_build_object('tenant', e->>'tenant') ORDER BY o), '[]') INTO fin
    FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, o)
    WHERE (e->>'rid')::uuid = ANY (live) AND e ? 'finish';
  SELECT coalesce(array_agg(f), '{}') INTO done FROM sluice_finish_jobs(fin) f;
  -- The reservations and the jobs' bills (rows this statement holds already) before the events,
  -- so each event carries its job's creditsBilled; the events before the tenants' rows: a NOTIFY
  -- is only queued here (sent at commit), and the tenants' rows, locked by sluice_release_settled,
  -- are then held only for the last steps and the commit.
  settled := sluice_settle_reservations(coalesce((SELECT jsonb_agg(jsonb_build_object('id', e->>'rid', 'billed', e->'billed', 'outcome', e->>'outcome'))
    FROM jsonb_array_elements(items) e WHERE (e->>'rid')::uuid = ANY (live)), '[]'));
  PERFORM sluice_job_events((SELECT coalesce(jsonb_agg(jsonb_build_object('jobId', f->>'id', 'tenantId', f->>'tenant', 'state', f->>'state') ORDER BY o), '[]')
    FROM jsonb_array_elements(fin) WITH ORDINALITY AS x(f, o) WHERE (f->>'id')::uuid = ANY (done)));
  PERFORM sluice_release_settled(settled);
  RETURN QUERY SELECT unnest(live);
END $function$;
