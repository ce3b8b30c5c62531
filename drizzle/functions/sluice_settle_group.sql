-- sluice_settle_group: a settlement group in one statement: the reservations still open, locked
-- (the fence: a superseded attempt changes nothing) and settled (sluice_settle_reservations), the
-- final states (jobs, result, pg-boss ack in one statement: sluice_finish_jobs, so the ack commits
-- with the stored result, I6), each finished job's result written once with its bill (I11), the
-- bills of the settled jobs it did not finish (sluice_bill_jobs), the events of the jobs it
-- finished (after the bills, so a final state's event carries its bill), then the slots
-- (sluice_release_settled: its tenants' rows in id order, the ledger, the window's slot deltas).
-- One call instead of seven round trips with tenant rows held
-- across them. The tenants' rows come after the jobs' here: the hot rows are held only for the end
-- of the statement and its commit (a lease holds tenant rows, then waiting jobs; this holds RUNNING
-- jobs under their locked reservations: the two never meet; the sweeper takes a reservation first
-- too). Returns the reservations it settled (`id`, `event` null) and the payloads of the final-state
-- events it sent (`event`, `id` null): they are sent at commit, and the caller delivers them to its
-- own process's subscribers once the commit is acknowledged.
-- No early return when nothing is live: every statement below runs, on empty sets, so a call with
-- no items ('[]', src/scheduler/sql/reservations.ts warmSettleGroup) plans all of them and opens
-- their tables and triggers on its connection before a real settlement needs them there.
-- items: [{"rid", "tenant", "billed", "outcome", "finish": {sluice_finish_jobs item} | absent}, ...]
-- An item without "finish" only settles its reservation (its job was requeued by the caller, in
-- the same transaction, after it locked the same rows in the same order).
-- Generic plans, planned once per connection (see sluice_lease's planner settings): every call
-- has a new jsonb list, and a custom plan of each statement at each call was planning work only.
CREATE OR REPLACE FUNCTION sluice_settle_group(items jsonb)
 RETURNS TABLE(id uuid, event text)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
  live uuid[];
  fin jsonb;
  done uuid[];
  settled jsonb;
  sent text[];
BEGIN
  SELECT coalesce(array_agg(r.id), '{}') INTO live FROM (
    SELECT r.id FROM reservations r
    WHERE r.id IN (SELECT (e->>'rid')::uuid FROM jsonb_array_elements(items) e) AND r.settled_at IS NULL
    ORDER BY r.id FOR UPDATE) r;
  -- The reservations first (rows this statement holds already): what each job was billed then
  -- rides on its final state, and the result row is written once, not inserted and then billed.
  settled := sluice_settle_reservations(coalesce((SELECT jsonb_agg(jsonb_build_object('id', e->>'rid', 'billed', e->'billed', 'outcome', e->>'outcome'))
    FROM jsonb_array_elements(items) e WHERE (e->>'rid')::uuid = ANY (live)), '[]'));
  SELECT coalesce(jsonb_agg(e->'finish' || jsonb_build_object('tenant', e->>'tenant', 'billed', coalesce(b.billed, 0)) ORDER BY o), '[]') INTO fin
    FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, o)
    LEFT JOIN (SELECT (s->>'job_id')::uuid AS job_id, sum((s->>'billed')::int)::int AS billed
      FROM jsonb_array_elements(settled) s GROUP BY 1) b ON b.job_id = (e->'finish'->>'id')::uuid
    WHERE (e->>'rid')::uuid = ANY (live) AND e ? 'finish';
  SELECT coalesce(array_agg(f), '{}') INTO done FROM sluice_finish_jobs(fin) f;
  PERFORM sluice_bill_jobs(settled, done);
  -- The events before the tenants' rows: a NOTIFY is only queued here (sent at commit), and the
  -- tenants' rows, locked by sluice_release_settled, are then held only for the last steps and the
  -- commit.
  SELECT coalesce(array_agg(ev), '{}') INTO sent FROM sluice_job_events((SELECT coalesce(jsonb_agg(jsonb_build_object('jobId', f->>'id', 'tenantId', f->>'tenant', 'state', f->>'state') ORDER BY o), '[]')
    FROM jsonb_array_elements(fin) WITH ORDINALITY AS x(f, o) WHERE (f->>'id')::uuid = ANY (done))) ev;
  PERFORM sluice_release_settled(settled);
  RETURN QUERY SELECT l, NULL::text FROM unnest(live) l UNION ALL SELECT NULL::uuid, s FROM unnest(sent) s;
END $function$;
