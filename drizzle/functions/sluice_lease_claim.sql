-- sluice_lease_claim: the first half of the lease's commit, after its last turn (src/scheduler/lease.ts
-- commitPicks): the picks (p_picks, one per job) become the call's attempts. Returns them as a
-- jsonb array: each pick with its attempt, its reservation id and whether it carries a pool slot.
--
-- A paced window's batch call that got one job only (a turn below the API's minimum that no other
-- turn joined) goes as a single call: the same slot and token, no batch for one item. The jobs are
-- activated in pg-boss (sluice_boss_activate: the rows are ours, locked by the fetches) and claimed
-- (RUNNING, the attempt number fencing the attempt; started_at: when its turn was decided,
-- p_turn_at); a job cancelled meanwhile is acknowledged in pg-boss (sluice_boss_complete), not
-- called. A batch call's pool slot is carried by its first claimed job's reservation (its first
-- turn's). Then each tenant's cap slots and the credits its attempts reserve: one write per tenant
-- for the jobs it claimed (the ledger's period row is not written: sluice_lease_commit).
-- The claim's statement runs with sluice.lease_claim on: the jobs' depth trigger leaves the depth
-- to sluice_lease_commit, which writes each claimed queue once (the lease holds those rows). Set
-- for that statement only (and undone with the call's subtransaction if it fails).
-- Runs under sluice_lease's planner settings.
CREATE OR REPLACE FUNCTION sluice_lease_claim(p_picks sluice_lease_job[], p_turn_at timestamp with time zone[], p_batch jsonb, p_paced boolean)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $function$
DECLARE
  lone int[];
  queues text[];
  ids uuid[];
  out_rows jsonb;
BEGIN
  IF p_paced THEN
    SELECT coalesce(array_agg(x.call), '{}') INTO lone
      FROM (SELECT p.call FROM unnest(p_picks) p WHERE p.call IS NOT NULL GROUP BY p.call HAVING count(*) = 1) x;
    FOR i IN 1 .. CASE WHEN cardinality(lone) > 0 THEN cardinality(p_picks) ELSE 0 END LOOP
      IF (p_picks[i]).call = ANY (lone) AND coalesce((p_batch -> ((p_picks[i]).data->>'api') ->> 1)::int, 1) > 1 THEN
        p_picks[i].batched := false;
        p_picks[i].call := NULL;
      END IF;
    END LOOP;
  END IF;
  SELECT array_agg(p.queue), array_agg(p.id) INTO queues, ids FROM unnest(p_picks) p;
  PERFORM sluice_boss_activate(queues, ids);
  PERFORM set_config('sluice.lease_claim', 'on', true);
  WITH cl AS (
    UPDATE jobs jb SET state = 'RUNNING', attempts = jb.attempts + 1, started_at = coalesce(jb.started_at, p_turn_at[p.turn]), updated_at = now()
    FROM unnest(p_picks) p
    WHERE jb.id = p.id AND jb.id = ANY (ids) AND jb.state IN ('QUEUED', 'WAITING_QUOTA')
    RETURNING jb.id, jb.attempts),
  m AS (
    SELECT p, cl.attempts, row_number() OVER (PARTITION BY coalesce(p.call, p.turn) ORDER BY p.turn, p.o) AS k
    FROM unnest(p_picks) p JOIN cl ON cl.id = p.id)
  SELECT coalesce(jsonb_agg(to_jsonb(m.p) || jsonb_build_object('attempt', m.attempts, 'rid', gen_random_uuid(),
      'slot', NOT (m.p).batched OR m.k = 1) ORDER BY (m.p).turn, (m.p).o), '[]')
    INTO out_rows FROM m;
  PERFORM set_config('sluice.lease_claim', 'off', true);
  IF jsonb_array_length(out_rows) < cardinality(p_picks) THEN
    SELECT array_agg(p.queue), array_agg(p.id) INTO queues, ids FROM unnest(p_picks) p
      WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(out_rows) e WHERE (e->>'id')::uuid = p.id);
    PERFORM sluice_boss_complete(queues, ids);
  END IF;
  UPDATE sched_tenants st SET in_flight = st.in_flight + d.n, reserved = st.reserved + d.credits
    FROM (SELECT (o->>'tenant_id')::uuid AS tenant_id, count(*)::int AS n, sum((o->>'cost')::int) AS credits
      FROM jsonb_array_elements(out_rows) o GROUP BY 1) d
    WHERE st.tenant_id = d.tenant_id;
  RETURN out_rows;
END $function$;
