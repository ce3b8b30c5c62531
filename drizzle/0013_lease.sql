-- Issue 9, the lease in one round trip: sluice_lease leases up to p_max jobs across as many tenants
-- as the weighted fair order allows, in ONE call (one transaction), and activates their pg-boss jobs
-- in it. src/scheduler/lease.ts (planPicks) is the pure model of the same decisions; the differential
-- test (test/lease-differential.test.ts) checks that the two pick the same jobs.
--
-- Each turn of the loop: the eligible ready queue with the smallest virtual time (ties by tenant id)
-- in the first class of p_classes (the dispatcher's class order, starving classes first) that has
-- one; its tenant's row locked (waited for only while the call holds no tenant row; after that
-- SKIP LOCKED, and a front tenant held by someone else ends the call rather than be overtaken); a take bounded by the
-- quantum to the next queue, the tenant's free cap, the window's tokens and room, p_lease_max (or a
-- batch turn: up to a batch's worth of the head job's API, BATCH_QUANTUM x weight, one pool slot);
-- the jobs fetched from pg-boss exactly as its fetch does (same order, SKIP LOCKED, same activation);
-- the quota prefix that fits (ledger: billed + reserved); claim, reserve, virtual time advanced by
-- the jobs actually taken / weight. The window row (the hot row) is written ONCE per call, last,
-- with a conditional update: when another node took the tokens or slots meanwhile, the whole call
-- rolls back with SQLSTATE SL409 and the dispatcher decides again.
--
-- Lock order (docs/ARCHITECTURE.md): the window's try-lock → sched_tenants (waited for only for the
-- first, holding nothing; then SKIP LOCKED) → pgboss.job
-- (SKIP LOCKED) → jobs → sched_queues → tenant_ledger → reservations (new rows) → sched_classes →
-- windows.
-- No per-call hot row: a settlement gives its pool slots back by appending a row here instead of
-- updating its window's row (every settlement group of every node did, each holding that one row
-- until its commit: the top wait of bench dispatch). The lease, which holds its window's try-lock,
-- counts these as free and folds them into windows.in_flight when it writes the row (once per call);
-- readers add the unfolded rows (readWindows). Negative n: slots given back.
CREATE TABLE "window_slot_deltas" (
	"window" text NOT NULL,
	"n" integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX "window_slot_deltas_idx" ON "window_slot_deltas" USING btree ("window");
--> statement-breakpoint
-- sluice_settle (0006) as it was, but the window's slots go back as deltas (above), not by updating
-- the window's row.
CREATE OR REPLACE FUNCTION sluice_settle(outcomes jsonb) RETURNS SETOF uuid LANGUAGE plpgsql AS $$
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
  -- The window's pool slots: appended, never a row lock.
  INSERT INTO window_slot_deltas ("window", n)
    SELECT x->>'window', -count(*)::int FROM jsonb_array_elements(settled) x
    WHERE (x->>'window_slot')::boolean GROUP BY 1;
  RETURN QUERY SELECT (x->>'id')::uuid FROM jsonb_array_elements(settled) x;
END $$;
--> statement-breakpoint
CREATE INDEX "sched_queues_fair_idx" ON "sched_queues" USING btree ("class", "vtime", "tenant_id") WHERE "ready_at" IS NOT NULL;
--> statement-breakpoint
-- The quota period containing now (tenants/policy.ts quotaPeriod): monthly from the anchor, in UTC,
-- the day clamped to the month's last day.
CREATE FUNCTION sluice_quota_period(anchor timestamptz, at timestamptz) RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  a timestamp := anchor AT TIME ZONE 'UTC';
  n timestamp := at AT TIME ZONE 'UTC';
  months int := (extract(year FROM n)::int - extract(year FROM a)::int) * 12 + (extract(month FROM n)::int - extract(month FROM a)::int);
BEGIN
  IF a + make_interval(months => months) > n THEN months := months - 1; END IF;
  months := greatest(0, months);
  RETURN (a + make_interval(months => months)) AT TIME ZONE 'UTC';
END $$;
--> statement-breakpoint
CREATE FUNCTION sluice_lease(
  p_window text, p_node uuid, p_pool int, p_max int, p_lease_max int, p_classes text[], p_lease_seconds int,
  p_costs jsonb, p_hold text[], p_batch jsonb, p_batch_max int, p_batch_quantum int)
RETURNS TABLE (turn int, reservation_id uuid, job_id uuid, attempt int, tenant_id uuid, class text, queue text,
  data jsonb, credits int, batched boolean, window_slot boolean)
-- No sorts: every ordered read here has an index in its order (the fair order, pg-boss's fetch
-- order). Without statistics (a fresh database, tens of thousands of queues created in seconds,
-- before autovacuum's first analyze) the planner sorted every ready queue on each pick instead of
-- walking the index: 7 ms a pick with 10,000 tenants instead of 0.05. No bitmap scans, for the same
-- reason (the claim read every queued job by state instead of its ids by key). No JIT: disabled
-- paths cost 1e10 in the planner's arithmetic, which would pass jit_above_cost and compile every
-- call's statements (300 ms).
LANGUAGE plpgsql SET enable_sort = off SET enable_bitmapscan = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
  w record;
  now_tokens float8;
  tok int;
  room int;
  taken int := 0;
  slots int := 0;
  tokens_used int := 0;
  n_turn int := 0;
  skip text[] := '{}';
  c text;
  q record;
  q_tenant uuid;
  q_vtime float8;
  n_vtime float8;
  t record;
  found_q boolean;
  qn text;
  head text;
  spec jsonb;
  quantum float8;
  take int;
  cap_free int;
  is_batch boolean;
  ids uuid[];
  datas jsonb[];
  costs int[];
  used bigint;
  period timestamptz;
  fit int;
  i int;
  distinct_n int;
  claimed int;
  over_id uuid;
  served jsonb := '{}';
  used_by jsonb := '{}';
  picked jsonb := '[]';
  picked_ids uuid[] := '{}';
  out_rows jsonb := '[]';
  fetched int;
  batch_fetch boolean;
  holding boolean := false;
  pending int;
BEGIN
  -- One lease per window at a time, without waiting: a call that finds another under way returns at
  -- once (SL423) and its loop leases again on the next poke. Two calls at once would each read the
  -- same room and tokens, and the second's whole work would roll back at the window update.
  -- Settlements do not take this lock (they only give room back).
  IF NOT pg_try_advisory_xact_lock(hashtext('sluice_lease'), hashtext(p_window)) THEN
    RAISE EXCEPTION 'sluice_lease: another lease of window % is under way', p_window USING ERRCODE = 'SL423';
  END IF;
  SELECT x.*, CASE WHEN x.rate_per_minute IS NULL THEN NULL
      ELSE least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) END AS now_tokens
    INTO w FROM windows x WHERE x.name = p_window;
  IF NOT FOUND OR (w.paused_until IS NOT NULL AND w.paused_until > clock_timestamp())
     OR EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp()) THEN
    RETURN;
  END IF;
  now_tokens := w.now_tokens;
  tok := CASE WHEN now_tokens IS NULL THEN 2147483647 ELSE floor(now_tokens + 1e-9)::int END;
  -- Slots settlements gave back since the last lease (window_slot_deltas, below) count as free.
  SELECT coalesce(sum(d.n), 0)::int INTO pending FROM window_slot_deltas d WHERE d."window" = p_window;
  room := p_pool - greatest(0, w.in_flight + pending);

  WHILE taken < p_max AND slots < room AND tokens_used < tok LOOP
    found_q := false;
    FOREACH c IN ARRAY p_classes LOOP
      q_tenant := NULL;
      n_vtime := NULL;
      -- A walk of sched_queues_fair_idx in order (one table, the index's order: the planner takes
      -- the index whatever its statistics say; a join here was planned as a hash join and a sort
      -- of every queue on a fresh database), checking each queue's tenant by its key, until two
      -- eligible queues: the pick and the next (for the quantum).
      FOR t IN
        SELECT sq.tenant_id, sq.vtime FROM sched_queues sq
        WHERE sq.class = c AND sq.ready_at IS NOT NULL AND sq.ready_at <= now()
        ORDER BY sq.class, sq.vtime, sq.tenant_id
      LOOP
        CONTINUE WHEN (t.tenant_id::text || '/' || c) = ANY (skip);
        PERFORM 1 FROM sched_tenants st WHERE st.tenant_id = t.tenant_id
          AND st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended AND st.weight > 0;
        CONTINUE WHEN NOT FOUND;
        IF q_tenant IS NULL THEN
          q_tenant := t.tenant_id;
          q_vtime := t.vtime;
        ELSE
          n_vtime := t.vtime;
          EXIT;
        END IF;
      END LOOP;
      IF q_tenant IS NOT NULL THEN found_q := true; EXIT; END IF;
    END LOOP;
    EXIT WHEN NOT found_q;
    SELECT q_tenant AS tenant_id, q_vtime AS vtime INTO q;
    -- The tenant's row, locked and re-checked. Until this call holds a tenant row it waits for it
    -- (it holds nothing another transaction could wait for, so no cycle); after that it never
    -- waits, and a front tenant held by someone else (a settlement, mostly) ends the call: serving
    -- the tenants behind it instead would hand its turns to them (measured: the weight-2 tenant of
    -- bench fairness, settling twice as often, got 1.4 shares instead of 2).
    IF holding THEN
      SELECT st.* INTO t FROM sched_tenants st
        WHERE st.tenant_id = q.tenant_id AND st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended
        FOR UPDATE SKIP LOCKED;
      IF NOT FOUND THEN
        PERFORM 1 FROM sched_tenants st
          WHERE st.tenant_id = q.tenant_id AND st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended;
        EXIT WHEN FOUND;
        skip := skip || (q.tenant_id::text || '/' || c);
        CONTINUE;
      END IF;
    ELSE
      SELECT st.* INTO t FROM sched_tenants st
        WHERE st.tenant_id = q.tenant_id AND st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended
        FOR UPDATE;
      IF NOT FOUND THEN
        skip := skip || (q.tenant_id::text || '/' || c);
        CONTINUE;
      END IF;
      holding := true;
    END IF;
    qn := 't.' || q.tenant_id::text || '.' || lower(c);
    cap_free := t.cap - t.in_flight;
    -- Items this queue may take before its virtual time passes the next queue's (at least one).
    quantum := CASE WHEN n_vtime IS NULL THEN 2147483647 ELSE greatest(1, floor((n_vtime - q.vtime) * t.weight) + 1) END;
    take := greatest(1, least(p_lease_max, p_max - taken, room - slots, tok - tokens_used, cap_free, quantum)::int);
    is_batch := false;
    head := NULL;
    IF p_batch_max > 1 THEN
      SELECT j.data->>'api' INTO head FROM pgboss.job j
        WHERE j.name = qn AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
          AND NOT ((j.data->>'api') = ANY (p_hold)) AND NOT (j.id = ANY (picked_ids))
        ORDER BY j.priority DESC, j.created_on LIMIT 1;
      spec := p_batch -> head;
      IF spec IS NOT NULL THEN
        -- A batch turn (batching.ts batchTake): one pool slot, one token per distinct item, at most
        -- BATCH_QUANTUM items per unit of weight so tenants taking turns share by weight.
        is_batch := true;
        take := greatest(take, least(greatest(take, least(tok - tokens_used, p_batch_max, (spec->>0)::int, cap_free), 1),
          p_batch_quantum * t.weight), 1);
        take := least(take, p_max - taken);
      END IF;
    END IF;
    SELECT coalesce(array_agg(f.id ORDER BY f.o), '{}'), coalesce(array_agg(f.data ORDER BY f.o), '{}') INTO ids, datas FROM (
      SELECT j.id, j.data, row_number() OVER () AS o FROM (
        SELECT j.id, j.data FROM pgboss.job j
        WHERE j.name = qn AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
          AND NOT ((j.data->>'api') = ANY (p_hold)) AND (NOT is_batch OR j.data->>'api' = head)
          -- Activation waits for the end of the call: skip the rows this call already took (SKIP
          -- LOCKED skips only other transactions' locks).
          AND NOT (j.id = ANY (picked_ids))
        ORDER BY j.priority DESC, j.created_on LIMIT take
        FOR UPDATE OF j SKIP LOCKED) j) f;
    fetched := cardinality(ids);
    batch_fetch := is_batch;
    IF fetched = 0 THEN
      -- Nothing pg-boss would hand out: the queue is ready again when its earliest queued job is.
      -- (None waiting at all: idle. Jobs counted as waiting that pg-boss would not hand out, held or
      -- on their way back: look again in a second.)
      UPDATE sched_queues sq SET ready_at = CASE WHEN sq.depth = 0 THEN NULL ELSE (
        SELECT greatest(min(jb.run_after), now() + interval '1 second') FROM jobs jb
        WHERE jb.tenant_id = q.tenant_id AND jb.priority = c AND jb.state = 'QUEUED') END
      WHERE sq.tenant_id = q.tenant_id AND sq.class = c;
      skip := skip || (q.tenant_id::text || '/' || c);
      CONTINUE;
    END IF;
    IF is_batch THEN
      SELECT count(DISTINCT d->'params')::int INTO distinct_n FROM unnest(datas) d;
      IF distinct_n < (spec->>1)::int THEN
        -- Too few distinct inputs for a batch: single calls, each its own slot and token.
        is_batch := false;
      END IF;
    END IF;
    IF NOT is_batch AND cardinality(ids) > least(room - slots, tok - tokens_used) THEN
      ids := ids[1:least(room - slots, tok - tokens_used)];
      datas := datas[1:least(room - slots, tok - tokens_used)];
    END IF;
    -- The quota: the prefix of the jobs that fits on top of what is billed and reserved.
    period := sluice_quota_period(t.period_anchor, now());
    IF used_by ? q.tenant_id::text THEN
      used := (used_by->>q.tenant_id::text)::bigint;
    ELSE
      -- The ledger row cannot change under us: every writer of it holds the tenant's row, as we do.
      SELECT l.billed + l.reserved INTO used FROM tenant_ledger l WHERE l.tenant_id = q.tenant_id AND l.period_start = period;
      used := coalesce(used, 0);
    END IF;
    costs := ARRAY(SELECT coalesce((p_costs ->> (d->>'api'))::int, 1) FROM unnest(datas) WITH ORDINALITY u(d, o) ORDER BY o);
    fit := 0;
    FOR i IN 1 .. cardinality(costs) LOOP
      EXIT WHEN used + costs[i] > t.quota;
      used := used + costs[i];
      fit := i;
    END LOOP;
    IF fit < cardinality(ids) THEN
      over_id := ids[fit + 1];
      IF t.quota_policy = 'FAIL' THEN
        -- That job fails with QUOTA_EXCEEDED (acknowledged in pg-boss); the others stay queued.
        UPDATE pgboss.job SET state = 'active', started_on = pgboss.job_now(), heartbeat_on = pgboss.job_now()
          WHERE name = qn AND id = over_id;
        UPDATE pgboss.job SET completed_on = pgboss.job_now(), state = 'completed', output = NULL
          WHERE name = qn AND id = over_id AND state = 'active';
        INSERT INTO job_results (job_id, data, error_code, error_message, http_status, credits_billed, attempts)
          VALUES (over_id, NULL, 'QUOTA_EXCEEDED', format('the tenant''s monthly credit quota has no room for this job (%s credits)', costs[fit + 1]), NULL, 0, 0)
          ON CONFLICT (job_id) DO UPDATE SET data = excluded.data, error_code = excluded.error_code, error_message = excluded.error_message,
            http_status = excluded.http_status, attempts = excluded.attempts, updated_at = now();
        UPDATE jobs SET state = 'FAILED', finished_at = now(), updated_at = now() WHERE id = over_id AND state IN ('QUEUED', 'WAITING_QUOTA');
        PERFORM pg_notify('sluice_job_events', jsonb_build_object('jobId', over_id, 'tenantId', q.tenant_id, 'state', 'FAILED')::text);
      ELSE
        -- WAIT: the tenant waits for quota, visibly; its queues go idle (they rejoin at the class clock).
        UPDATE sched_tenants SET quota_blocked = true, quota_blocked_cost = costs[fit + 1] WHERE sched_tenants.tenant_id = q.tenant_id;
        WITH b AS (UPDATE jobs SET state = 'WAITING_QUOTA', updated_at = now()
          WHERE jobs.tenant_id = q.tenant_id AND state = 'QUEUED' RETURNING id)
        SELECT count(*) INTO i FROM (SELECT pg_notify('sluice_job_events', jsonb_build_object('jobId', b.id, 'tenantId', q.tenant_id, 'state', 'WAITING_QUOTA')::text) FROM b) z;
        UPDATE sched_queues SET ready_at = NULL WHERE sched_queues.tenant_id = q.tenant_id;
      END IF;
      skip := skip || (q.tenant_id::text || '/' || c);
      ids := ids[1:fit];
      datas := datas[1:fit];
      IF fit = 0 THEN CONTINUE; END IF;
    END IF;
    -- The turn: its queue's virtual time advances by the jobs taken / weight (a batch counts every
    -- job), the tenant's cap slots are taken. Both per turn: the next pick reads them. The rest
    -- (activation, claims, ledger, reservations) is written once for all turns, after the loop.
    n_turn := n_turn + 1;
    claimed := cardinality(ids);
    IF is_batch THEN
      SELECT count(DISTINCT d->'params')::int INTO distinct_n FROM unnest(datas) d;
    END IF;
    UPDATE sched_queues sq SET vtime = sq.vtime + claimed::float8 / t.weight WHERE sq.tenant_id = q.tenant_id AND sq.class = c;
    served := jsonb_set(served, ARRAY[c], to_jsonb(greatest(coalesce((served->>c)::float8, '-infinity'::float8), q.vtime)));
    UPDATE sched_tenants st SET in_flight = st.in_flight + claimed WHERE st.tenant_id = q.tenant_id;
    used_by := jsonb_set(used_by, ARRAY[q.tenant_id::text], to_jsonb(used));
    picked := picked || (SELECT jsonb_agg(jsonb_build_object('turn', n_turn, 'o', u.o, 'id', u.id, 'data', u.d, 'tenant', q.tenant_id, 'class', c,
        'queue', qn, 'period', period, 'cost', coalesce((p_costs ->> (u.d->>'api'))::int, 1), 'batched', is_batch) ORDER BY u.o)
      FROM unnest(ids, datas) WITH ORDINALITY u(id, d, o));
    picked_ids := picked_ids || ids;
    taken := taken + claimed;
    IF is_batch THEN
      slots := slots + 1;
      tokens_used := tokens_used + distinct_n;
    ELSE
      slots := slots + claimed;
      tokens_used := tokens_used + claimed;
    END IF;
    -- Fewer ready jobs than the take (any API): the queue has nothing more for this call.
    IF fetched < take AND NOT batch_fetch THEN
      skip := skip || (q.tenant_id::text || '/' || c);
    END IF;
  END LOOP;

  IF taken = 0 THEN RETURN; END IF;
  -- Activate exactly as pg-boss's fetch does (the rows are ours: locked by the fetches above).
  UPDATE pgboss.job j SET state = 'active', started_on = pgboss.job_now(), heartbeat_on = pgboss.job_now(),
      retry_count = CASE WHEN j.started_on IS NOT NULL THEN j.retry_count + 1 ELSE j.retry_count END
    FROM (SELECT e->>'queue' AS name, (e->>'id')::uuid AS id FROM jsonb_array_elements(picked) e) p
    WHERE j.name = p.name AND j.id = p.id;
  -- Claim (the attempt number fences the attempt); a job cancelled meanwhile is acknowledged, not called.
  WITH cl AS (
    UPDATE jobs jb SET state = 'RUNNING', attempts = jb.attempts + 1, started_at = coalesce(jb.started_at, now()), updated_at = now()
    WHERE jb.id = ANY (picked_ids) AND jb.state IN ('QUEUED', 'WAITING_QUOTA')
    RETURNING jb.id, jb.attempts),
  m AS (
    SELECT e, cl.attempts, row_number() OVER (PARTITION BY (e->>'turn')::int ORDER BY (e->>'o')::int) AS k
    FROM jsonb_array_elements(picked) e JOIN cl ON cl.id = (e->>'id')::uuid)
  -- A batch's pool slot is carried by its first claimed job's reservation.
  SELECT coalesce(jsonb_agg(m.e || jsonb_build_object('attempt', m.attempts, 'rid', gen_random_uuid(),
      'slot', NOT (m.e->>'batched')::boolean OR m.k = 1) ORDER BY (m.e->>'turn')::int, (m.e->>'o')::int), '[]')
    INTO out_rows FROM m;
  IF jsonb_array_length(out_rows) < taken THEN
    WITH g AS (
      SELECT e FROM jsonb_array_elements(picked) e
      WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(out_rows) o WHERE o->>'id' = e->>'id')),
    a AS (
      UPDATE pgboss.job j SET completed_on = pgboss.job_now(), state = 'completed', output = NULL
      FROM g WHERE j.name = g.e->>'queue' AND j.id = (g.e->>'id')::uuid AND j.state = 'active' RETURNING 1)
    UPDATE sched_tenants st SET in_flight = greatest(0, st.in_flight - d.n)
      FROM (SELECT (g.e->>'tenant')::uuid AS tenant_id, count(*)::int AS n FROM g GROUP BY 1) d
      WHERE st.tenant_id = d.tenant_id;
    SELECT count(*) FILTER (WHERE (o->>'slot')::boolean)::int INTO slots FROM jsonb_array_elements(out_rows) o;
    IF jsonb_array_length(out_rows) = 0 THEN RETURN; END IF;
  END IF;
  -- Queues with nothing left waiting go idle (a submission or a retry marks them ready again).
  -- Judged on the row's depth, which a concurrent submission's trigger updates under the row lock.
  UPDATE sched_queues sq SET ready_at = NULL
    FROM (SELECT DISTINCT (o->>'tenant')::uuid AS tenant_id, o->>'class' AS class FROM jsonb_array_elements(out_rows) o) d
    WHERE sq.tenant_id = d.tenant_id AND sq.class = d.class AND sq.depth = 0 AND sq.ready_at IS NOT NULL;
  -- The credits: one ledger write per tenant and period for all its turns.
  INSERT INTO tenant_ledger AS l (tenant_id, period_start, reserved)
    SELECT (o->>'tenant')::uuid, (o->>'period')::timestamptz, sum((o->>'cost')::int) FROM jsonb_array_elements(out_rows) o GROUP BY 1, 2
    ON CONFLICT (tenant_id, period_start) DO UPDATE SET reserved = l.reserved + excluded.reserved;
  INSERT INTO reservations (id, job_id, attempt, tenant_id, period_start, "window", node_id, credits, window_slot, created_at, lease_expires_at)
    SELECT (o->>'rid')::uuid, (o->>'id')::uuid, (o->>'attempt')::int, (o->>'tenant')::uuid, (o->>'period')::timestamptz, p_window, p_node,
      (o->>'cost')::int, (o->>'slot')::boolean, clock_timestamp(), clock_timestamp() + make_interval(secs => p_lease_seconds)
    FROM jsonb_array_elements(out_rows) o;
  -- Each class's clock: the largest virtual time served (no credit for idle time).
  UPDATE sched_classes k SET clock = greatest(k.clock, (served->>k.class)::float8), served_at = now() WHERE served ? k.class;
  -- The slot releases settlements appended since the last lease fold into the row here (only this
  -- call can run on the window now: its try-lock), so settlements never write the hot row.
  WITH f AS (DELETE FROM window_slot_deltas d WHERE d."window" = p_window RETURNING d.n)
  SELECT coalesce(sum(f.n), 0)::int INTO pending FROM f;
  -- The hot row, once per call and last: only if the tokens and slots are still there.
  UPDATE windows x SET
      tokens = CASE WHEN x.rate_per_minute IS NULL THEN 0 ELSE least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) - tokens_used END,
      refilled_at = clock_timestamp(), in_flight = greatest(0, x.in_flight + pending) + slots
    WHERE x.name = p_window
      AND (x.paused_until IS NULL OR x.paused_until <= clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp())
      AND (x.rate_per_minute IS NULL OR least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) >= tokens_used - 1e-9)
      AND greatest(0, x.in_flight + pending) + slots <= p_pool;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'sluice_lease: window % changed under the lease', p_window USING ERRCODE = 'SL409';
  END IF;
  PERFORM pg_notify('sluice_job_events', jsonb_build_object('jobId', o->>'id', 'tenantId', o->>'tenant', 'state', 'RUNNING')::text)
    FROM jsonb_array_elements(out_rows) o;
  RETURN QUERY SELECT (o->>'turn')::int, (o->>'rid')::uuid, (o->>'id')::uuid, (o->>'attempt')::int, (o->>'tenant')::uuid, o->>'class',
      o->>'queue', o->'data', (o->>'cost')::int, (o->>'batched')::boolean, (o->>'slot')::boolean
    FROM jsonb_array_elements(out_rows) o;
END $$;
--> statement-breakpoint
-- Grouped settlement, the final half: many attempts' jobs finished in ONE statement (the settlement
-- made per attempt a jobs update, a result upsert and a pg-boss complete). Each is fenced by its
-- attempt (RUNNING on that attempt); only those it finished get their result and their pg-boss ack,
-- in the same transaction (I6). Lock order: jobs, job_results, pgboss.job (as pg-boss's complete).
-- items: [{"id", "attempt", "state", "queue", "data", "error_code", "error_message", "http_status", "billed", "attempts"}, ...]
-- plpgsql, not sql: pg-boss creates its schema after these migrations, and a sql function's body
-- is checked against the tables when it is created.
CREATE FUNCTION sluice_finish_jobs(items jsonb) RETURNS SETOF uuid LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY WITH x AS (
    SELECT * FROM jsonb_to_recordset(items) AS x(id uuid, attempt int, state text, queue text, data jsonb, error_code text,
      error_message text, http_status int, billed int, attempts int)),
  f AS (
    UPDATE jobs j SET state = x.state, finished_at = now(), updated_at = now()
    FROM x WHERE j.id = x.id AND j.state = 'RUNNING' AND j.attempts = x.attempt
    RETURNING j.id),
  r AS (
    INSERT INTO job_results (job_id, data, error_code, error_message, http_status, credits_billed, attempts)
    SELECT x.id, x.data, x.error_code, x.error_message, x.http_status, x.billed, x.attempts FROM x JOIN f ON f.id = x.id
    ON CONFLICT (job_id) DO UPDATE SET
      data = excluded.data, error_code = excluded.error_code, error_message = excluded.error_message,
      http_status = excluded.http_status, credits_billed = job_results.credits_billed + excluded.credits_billed,
      attempts = excluded.attempts, updated_at = now()
    RETURNING job_id),
  b AS (
    UPDATE pgboss.job p SET completed_on = pgboss.job_now(), state = 'completed', output = NULL
    FROM x JOIN f ON f.id = x.id
    WHERE p.name = x.queue AND p.id = x.id AND p.state = 'active'
    RETURNING p.id)
  -- r and b run to completion whether read or not (data-modifying WITH).
  SELECT f.id FROM f;
END $$;
