-- Issue 9, the lease in one round trip: sluice_lease leases up to p_max jobs across as many tenants
-- as the weighted fair order allows, in ONE call (one transaction), and activates their pg-boss jobs
-- in it. src/scheduler/lease.ts (planPicks) is the pure model of the same decisions; the differential
-- test (test/lease-differential.test.ts) checks that the two pick the same jobs.
--
-- Each turn of the loop: the eligible ready queue with the smallest virtual time (ties by tenant id)
-- in the first class of p_classes (the dispatcher's class order, starving classes first) that has
-- one; its tenant's row locked SKIP LOCKED (a tenant another lease or a settlement holds is passed
-- over, so concurrent leases proceed side by side instead of queueing); a take bounded by the
-- quantum to the next queue, the tenant's free cap, the window's tokens and room, p_lease_max (or a
-- batch turn: up to a batch's worth of the head job's API, BATCH_QUANTUM x weight, one pool slot);
-- the jobs fetched from pg-boss exactly as its fetch does (same order, SKIP LOCKED, same activation);
-- the quota prefix that fits (ledger: billed + reserved); claim, reserve, virtual time advanced by
-- the jobs actually taken / weight. The window row (the hot row) is written ONCE per call, last,
-- with a conditional update: when another node took the tokens or slots meanwhile, the whole call
-- rolls back with SQLSTATE SL409 and the dispatcher decides again.
--
-- Lock order (docs/ARCHITECTURE.md): sched_tenants (SKIP LOCKED, never waited for) → pgboss.job
-- (SKIP LOCKED) → jobs → sched_queues → tenant_ledger → reservations (new rows) → sched_classes →
-- windows.
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
LANGUAGE plpgsql AS $$
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
  gone uuid[];
  over_id uuid;
  served jsonb := '{}';
  out_rows jsonb := '[]';
BEGIN
  SELECT x.*, CASE WHEN x.rate_per_minute IS NULL THEN NULL
      ELSE least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) END AS now_tokens
    INTO w FROM windows x WHERE x.name = p_window;
  IF NOT FOUND OR (w.paused_until IS NOT NULL AND w.paused_until > clock_timestamp())
     OR EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp()) THEN
    RETURN;
  END IF;
  now_tokens := w.now_tokens;
  tok := CASE WHEN now_tokens IS NULL THEN 2147483647 ELSE floor(now_tokens + 1e-9)::int END;
  room := p_pool - w.in_flight;

  WHILE taken < p_max AND slots < room AND tokens_used < tok LOOP
    found_q := false;
    FOREACH c IN ARRAY p_classes LOOP
      q_tenant := NULL;
      n_vtime := NULL;
      FOR t IN
        SELECT sq.tenant_id, sq.vtime FROM sched_queues sq JOIN sched_tenants st ON st.tenant_id = sq.tenant_id
        WHERE sq.class = c AND sq.ready_at IS NOT NULL AND sq.ready_at <= now()
          AND st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended AND st.weight > 0
          AND NOT ((sq.tenant_id::text || '/' || sq.class) = ANY (skip))
        ORDER BY sq.vtime, sq.tenant_id LIMIT 2
      LOOP
        IF q_tenant IS NULL THEN q_tenant := t.tenant_id; q_vtime := t.vtime; ELSE n_vtime := t.vtime; END IF;
      END LOOP;
      IF q_tenant IS NOT NULL THEN found_q := true; EXIT; END IF;
    END LOOP;
    EXIT WHEN NOT found_q;
    SELECT q_tenant AS tenant_id, q_vtime AS vtime INTO q;
    -- The tenant's row: locked, re-checked; held by someone else, this call passes it over.
    SELECT st.* INTO t FROM sched_tenants st
      WHERE st.tenant_id = q.tenant_id AND st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended
      FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
      skip := skip || (q.tenant_id::text || '/' || c);
      CONTINUE;
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
          AND NOT ((j.data->>'api') = ANY (p_hold))
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
        ORDER BY j.priority DESC, j.created_on LIMIT take
        FOR UPDATE OF j SKIP LOCKED) j) f;
    IF cardinality(ids) = 0 THEN
      -- Nothing pg-boss would hand out: the queue is ready again when its earliest queued job is.
      UPDATE sched_queues sq SET ready_at = (
        SELECT greatest(min(jb.run_after), now() + interval '1 second') FROM jobs jb
        WHERE jb.tenant_id = q.tenant_id AND jb.priority = c AND jb.state = 'QUEUED')
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
    INSERT INTO tenant_ledger (tenant_id, period_start) VALUES (q.tenant_id, period) ON CONFLICT DO NOTHING;
    SELECT l.billed + l.reserved INTO used FROM tenant_ledger l WHERE l.tenant_id = q.tenant_id AND l.period_start = period;
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
    -- Activate exactly as pg-boss's fetch does, then claim (a job cancelled meanwhile is acknowledged, not called).
    UPDATE pgboss.job j SET state = 'active', started_on = pgboss.job_now(), heartbeat_on = pgboss.job_now(),
        retry_count = CASE WHEN j.started_on IS NOT NULL THEN j.retry_count + 1 ELSE j.retry_count END
      WHERE j.name = qn AND j.id = ANY (ids);
    n_turn := n_turn + 1;
    WITH cl AS (
      UPDATE jobs jb SET state = 'RUNNING', attempts = jb.attempts + 1, started_at = coalesce(jb.started_at, now()), updated_at = now()
      WHERE jb.id = ANY (ids) AND jb.state IN ('QUEUED', 'WAITING_QUOTA')
      RETURNING jb.id, jb.attempts),
    r AS (
      SELECT gen_random_uuid() AS rid, cl.id, cl.attempts, u.d, u.o, coalesce((p_costs ->> (u.d->>'api'))::int, 1) AS cost
      FROM cl JOIN unnest(ids, datas) WITH ORDINALITY u(id, d, o) ON u.id = cl.id)
    SELECT coalesce(jsonb_agg(jsonb_build_object('rid', r.rid, 'id', r.id, 'attempt', r.attempts, 'data', r.d, 'o', r.o, 'cost', r.cost) ORDER BY r.o), '[]')
      INTO spec FROM r;
    claimed := jsonb_array_length(spec);
    IF claimed < cardinality(ids) THEN
      gone := ARRAY(SELECT x FROM unnest(ids) x WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(spec) e WHERE (e->>'id')::uuid = x));
      UPDATE pgboss.job SET completed_on = pgboss.job_now(), state = 'completed', output = NULL
        WHERE name = qn AND id = ANY (gone) AND state = 'active';
    END IF;
    IF claimed = 0 THEN CONTINUE; END IF;
    IF is_batch THEN
      SELECT count(DISTINCT e->'data'->'params')::int INTO distinct_n FROM jsonb_array_elements(spec) e;
    END IF;
    -- Fair share counts jobs, batched or not: the queue advances by every job it took.
    UPDATE sched_queues sq SET vtime = sq.vtime + claimed::float8 / t.weight WHERE sq.tenant_id = q.tenant_id AND sq.class = c;
    served := jsonb_set(served, ARRAY[c], to_jsonb(greatest(coalesce((served->>c)::float8, '-infinity'::float8), q.vtime)));
    UPDATE tenant_ledger l SET reserved = l.reserved + (SELECT sum((e->>'cost')::int) FROM jsonb_array_elements(spec) e)
      WHERE l.tenant_id = q.tenant_id AND l.period_start = period;
    UPDATE sched_tenants st SET in_flight = st.in_flight + claimed WHERE st.tenant_id = q.tenant_id;
    INSERT INTO reservations (id, job_id, attempt, tenant_id, period_start, "window", node_id, credits, window_slot, created_at, lease_expires_at)
      SELECT (e->>'rid')::uuid, (e->>'id')::uuid, (e->>'attempt')::int, q.tenant_id, period, p_window, p_node, (e->>'cost')::int,
        NOT is_batch OR k = 1, clock_timestamp(), clock_timestamp() + make_interval(secs => p_lease_seconds)
      FROM jsonb_array_elements(spec) WITH ORDINALITY x(e, k);
    out_rows := out_rows || (SELECT jsonb_agg(jsonb_build_object('turn', n_turn, 'rid', e->>'rid', 'id', e->>'id', 'attempt', (e->>'attempt')::int,
        'tenant', q.tenant_id, 'class', c, 'queue', qn, 'data', e->'data', 'cost', (e->>'cost')::int, 'batched', is_batch, 'slot', NOT is_batch OR k = 1) ORDER BY k)
      FROM jsonb_array_elements(spec) WITH ORDINALITY x(e, k));
    taken := taken + claimed;
    IF is_batch THEN
      slots := slots + 1;
      tokens_used := tokens_used + distinct_n;
    ELSE
      slots := slots + claimed;
      tokens_used := tokens_used + claimed;
    END IF;
  END LOOP;

  IF taken = 0 THEN RETURN; END IF;
  -- Each class's clock: the largest virtual time served (no credit for idle time).
  UPDATE sched_classes k SET clock = greatest(k.clock, (served->>k.class)::float8), served_at = now() WHERE served ? k.class;
  -- The hot row, once per call and last: only if the tokens and slots are still there.
  UPDATE windows x SET
      tokens = CASE WHEN x.rate_per_minute IS NULL THEN 0 ELSE least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) - tokens_used END,
      refilled_at = clock_timestamp(), in_flight = x.in_flight + slots
    WHERE x.name = p_window
      AND (x.paused_until IS NULL OR x.paused_until <= clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp())
      AND (x.rate_per_minute IS NULL OR least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) >= tokens_used - 1e-9)
      AND x.in_flight + slots <= p_pool;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'sluice_lease: window % changed under the lease', p_window USING ERRCODE = 'SL409';
  END IF;
  PERFORM pg_notify('sluice_job_events', jsonb_build_object('jobId', e->>'id', 'tenantId', e->>'tenant', 'state', 'RUNNING')::text)
    FROM jsonb_array_elements(out_rows) e;
  RETURN QUERY SELECT (e->>'turn')::int, (e->>'rid')::uuid, (e->>'id')::uuid, (e->>'attempt')::int, (e->>'tenant')::uuid, e->>'class',
      e->>'queue', e->'data', (e->>'cost')::int, (e->>'batched')::boolean, (e->>'slot')::boolean
    FROM jsonb_array_elements(out_rows) e;
END $$;
