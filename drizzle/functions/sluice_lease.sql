-- sluice_lease: the lease in one round trip. Leases up to p_max jobs of window p_window across as
-- many tenants as the weighted fair order allows, in ONE call (one transaction), and activates
-- their pg-boss jobs in it. src/scheduler/lease.ts (planPicks) is the pure model of the same
-- decisions; test/lease-differential.test.ts checks that the two pick the same jobs.
--
-- Dormant queues (tenant suspended or quota-blocked, every job due later, every due job for a held
-- API) are out of the fair index: the walk, the lift and the reserved totals never read them, and a
-- turn that fetches nothing makes its queue dormant (held or scheduled). The due check after the
-- turns brings back the scheduled queues now due and those held for an API this call does not
-- hold (docs/ARCHITECTURE.md "Dormant work": the call's cost does not grow with dormant queues).
--
-- Each turn: the eligible ready queue with the smallest virtual time (ties by tenant id) in the
-- first class of p_classes (the dispatcher's class order, starving classes first) that has one;
-- its tenant's row locked (waited for only while the call holds no tenant row, and after a wait,
-- or for a queue alone in its class in a paced window, a queue ready by the clock bounds the turn
-- too; after that SKIP LOCKED, and a front tenant
-- held by someone else ends the call rather than be overtaken); a take bounded by the quantum to
-- the next queue, the tenant's free cap, the window's tokens and room,
-- p_lease_max (or a batch turn: up to a batch's worth of the head job's API, BATCH_QUANTUM x
-- weight, and the quantum too: a pause's tokens are not the front tenant's); the jobs fetched
-- from pg-boss exactly as its fetch does (same order, SKIP LOCKED, same activation); the quota
-- prefix that fits (ledger: billed + reserved); claim, reserve, virtual time advanced by the jobs
-- actually taken / weight (start + n/w), where a queue's first turn in the call starts at its
-- virtual time or the class clock at the call's start, whichever is later (SFQ's start tag
-- max(v, F): a queue marked ready while a concurrent lease moved the clock joined at the old
-- clock; the next queue counts as at least the clock too). A queue this call served already ends the call, in a paced
-- window (one round per call) or when it is alone in its class: the next call, at once, shares
-- what is left of the tokens with the queues that became ready meanwhile. Otherwise the tokens a
-- pause or idle time saved up (the bucket: 3 s of pace) went in one call to the queues visible
-- when it started: a call of 120 alternating turns took 120 ms while a tenant that had become
-- ready waited for the next. An unpaced window has no saved-up tokens, and its calls are as
-- large as the pool's room. A turn writes no row: what the next pick reads is kept in the call's
-- arrays, and the fair walk resumes from a per-class cursor. A class whose walk and merge both come
-- back empty sits out the rest of the call (nothing makes a queue eligible within a call: caps
-- fill, blocks and skips grow).
--
-- Batch turns: a batch turn joins the call's open batch call of its API while the items fit
-- (p_batch_max and the API's maxSize), and opens a new one (one pool slot) otherwise; a turn with
-- fewer distinct inputs than the API's minimum goes as single calls when it cannot join. In a
-- paced window a batch turn is held to the fair limit like any turn, and opens its call below the
-- minimum when another queue of its class could join it (the next tenants' turns fill the call,
-- so the limit costs no call; a call no other turn joined, one job, goes single). In an unpaced window (no tokens to share, leases as large as the
-- pool's room) a batch turn may take the API's minimum batch instead: tied tenants take their 2
-- jobs in one turn, not two, which halves the lease's statements per job; jobs beyond the quantum
-- do not move the class clock. The
-- output column `call` numbers each batched job's call. The provider counts and bills a batch's
-- items one by one, so nothing ties a call to one tenant; inputs are folded per tenant only (each
-- tenant is billed for its own items).
--
-- After the last turn, one statement each for all turns (cap slots, pg-boss activation, claims,
-- virtual times and idle marks, ledger, reservations), then the class clocks (the start tag of the
-- last job served: a queue joining next starts level with it, not a turn behind), then the lift of
-- ready queues lagging the new clock by more than 8 (a queue passed over while capped, held or
-- locked, or marked ready at a stale clock, gets no credit for it: otherwise it is served alone
-- until it catches up), and last the window row, ONCE, with a conditional update.
--
-- Reserved shares (tenant's reserved_share r, 0 to 1 of the window's dispatches) are floors: while
-- a reserved tenant is backlogged, its weight in the virtual clock is w + r / (1 - R) x W, R the
-- backlogged reserved shares of its class (at most 0.8: the admin API keeps the sum there, and a
-- transiently larger sum of scheduler copies is read as 0.8), W the whole backlogged weight there
-- (reserved tenants' included); every other tenant keeps w. Shares go as the weights, so each
-- tenant gets r + (1 - R) x w / W of the class's dispatches: its reservation first, then its part
-- of the rest by weight, whatever the weights. Backlogged: a ready queue in the
-- class, the tenant not suspended, quota-blocked or of weight 0 (caps not counted), read once at
-- the call's start. Idle, it is not in R: nothing is held back for it. With no reserved tenant
-- ready, this costs one probe of sched_tenants' reserved index.
--
-- Contention is a result, not an error (an ERROR per busy call filled Postgres's log: ~1,600
-- lines in two minutes with three workers). One lease per window runs at a time (a
-- transaction-scoped try-lock): a second call returns at once one row with no job and status
-- 'busy'. When the window's row no longer allows the take at the end (a provider signal paused
-- or stopped it, or the account stopped, while the call ran: only leases take tokens and slots,
-- under the try-lock), everything the call wrote is undone and it returns one row with status
-- 'changed'; the dispatcher decides again. The undo needs a savepoint: the function's block has
-- an exception handler for exactly that case (SL409, raised and caught here, never sent to the
-- client or the log), which costs one subtransaction per call. Job rows carry status 'leased'.
--
-- Counters are never clamped: a window whose in-flight count plus the slots given back would go
-- below zero (more released than taken) raises check_violation instead of leasing on a wrong
-- count (a clamp hid a double release until quiescence).
--
-- Lock order (docs/ARCHITECTURE.md): the window's try-lock -> sched_tenants (waited for only for
-- the first, holding nothing; then SKIP LOCKED) -> pgboss.job (SKIP LOCKED) -> jobs ->
-- sched_queues (SKIP LOCKED) -> tenant_ledger -> reservations (new rows) -> sched_classes ->
-- windows.
--
-- Planner settings: no sorts, as every ordered read here has an index in its order (the fair
-- order, pg-boss's fetch order); without statistics (a fresh database, tens of thousands of queues
-- created in seconds) the planner sorted every ready queue on each pick instead of walking the
-- index (7 ms a pick with 10,000 tenants instead of 0.05). No bitmap scans, for the same reason.
-- No sequential scans: a lookup by key always takes its index (the planner priced a jsonb list at
-- 100 rows and hashed it against a scan of the whole table). No JIT: disabled paths cost 1e10 in
-- the planner's arithmetic, which would pass jit_above_cost and compile every call (300 ms).
CREATE OR REPLACE FUNCTION sluice_lease(p_window text, p_node uuid, p_pool integer, p_max integer, p_lease_max integer, p_classes text[], p_lease_seconds integer, p_costs jsonb, p_hold text[], p_batch jsonb, p_batch_max integer, p_batch_quantum integer)
 RETURNS TABLE(turn integer, reservation_id uuid, job_id uuid, attempt integer, tenant_id uuid, class text, queue text, data jsonb, credits integer, batched boolean, window_slot boolean, call integer, status text)
 LANGUAGE plpgsql
 SET enable_sort TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
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
  ci int;
  q_ci int;
  q record;
  q_tenant uuid;
  q_vtime float8;
  q_mem boolean;
  n_vtime float8;
  t record;
  found_q boolean;
  qn text;
  qkey text;
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
  k int;
  distinct_n int;
  claimed int;
  over_id uuid;
  served jsonb := '{}';
  picked jsonb;
  picked_ids uuid[] := '{}';
  out_rows jsonb := '[]';
  fetched int;
  batch_fetch boolean;
  holding boolean := false;
  -- The first tenant row's wait (its start), and the next queue's start tag read after it.
  waited_at timestamptz;
  n_now float8;
  pending int;
  -- A class's clock after this call: where its lagging queues are lifted to.
  lift_to float8;
  -- APIs of queues held by a breaker that this call does not hold: those queues wake (the due check).
  wake_apis text[];
  -- Each class's clock at the call's start (p_classes order): no queue starts a turn behind it.
  clk0 float8[];
  -- Reserved shares: each class's backlogged reserved sum (R) and whole backlogged weight (W), and the
  -- turn's tenant's weight in the virtual clock (see the header).
  rs_r float8[];
  rs_w float8[];
  r_sum float8;
  w_sum float8;
  weff float8;
  -- The call's open batch per API (one at a time): its call number (the turn that opened it) and
  -- its items so far. A batch turn of that API joins it while the items fit.
  ob_api text[] := '{}';
  ob_call int[] := '{}';
  lone_calls int[];
  ob_items int[] := '{}';
  ob_i int;
  call_no int;
  -- Each class's walk cursor: the last queue of the index passed for good in this call.
  cur_v float8[];
  cur_t uuid[];
  -- Each class's lower bound on the virtual times of its served queues still eligible: the merge
  -- query runs only when one of them could come before the walk's second.
  m_low float8[];
  -- Classes with no eligible queue left for this call (see the header).
  dead boolean[];
  -- The walk's candidates (at most 2) and the served queues' (merged).
  w_t uuid[];
  w_v float8[];
  m_t uuid[];
  m_v float8[];
  -- Queues served by this call: key, tenant, class, virtual time now (written after the loop).
  sv_key text[] := '{}';
  sv_t uuid[] := '{}';
  sv_c text[] := '{}';
  sv_v float8[] := '{}';
  sv_i int;
  -- Tenants served by this call: in_flight added (written after the loop), ledger billed + reserved now.
  tn_id uuid[] := '{}';
  tn_add int[] := '{}';
  tn_used bigint[] := '{}';
  tn_i int;
  -- When each turn was decided (a job's started_at): a queue that became visible while the call
  -- ran is served after the turns decided before it, and its jobs say so.
  turn_at timestamptz[] := '{}';
  -- The picks, one element per job.
  pk_turn int[] := '{}';
  pk_o int[] := '{}';
  pk_data jsonb[] := '{}';
  pk_tenant uuid[] := '{}';
  pk_class text[] := '{}';
  pk_queue text[] := '{}';
  pk_period timestamptz[] := '{}';
  pk_cost int[] := '{}';
  pk_batched boolean[] := '{}';
  pk_call int[] := '{}';
  n_pk int := 0;
BEGIN
  -- One lease per window at a time, without waiting: a busy window is a result (see the header).
  IF NOT pg_try_advisory_xact_lock(hashtext('sluice_lease'), hashtext(p_window)) THEN
    RETURN QUERY SELECT NULL::int, NULL::uuid, NULL::uuid, NULL::int, NULL::uuid, NULL::text, NULL::text, NULL::jsonb, NULL::int,
      NULL::boolean, NULL::boolean, NULL::int, 'busy'::text;
    RETURN;
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
  -- Slots settlements gave back since the last lease (window_slot_deltas) count as free.
  SELECT coalesce(sum(d.n), 0)::int INTO pending FROM window_slot_deltas d WHERE d."window" = p_window;
  IF w.in_flight + pending < 0 THEN
    RAISE EXCEPTION 'sluice_lease: window % has % calls in flight: more pool slots released than taken', p_window, w.in_flight + pending
      USING ERRCODE = 'check_violation';
  END IF;
  room := p_pool - (w.in_flight + pending);
  cur_v := array_fill('-infinity'::float8, ARRAY[cardinality(p_classes)]);
  cur_t := array_fill('00000000-0000-0000-0000-000000000000'::uuid, ARRAY[cardinality(p_classes)]);
  m_low := array_fill('infinity'::float8, ARRAY[cardinality(p_classes)]);
  dead := array_fill(false, ARRAY[cardinality(p_classes)]);
  SELECT coalesce(array_agg(coalesce(k.clock, 0) ORDER BY x.o), '{}') INTO clk0
    FROM unnest(p_classes) WITH ORDINALITY x(c, o) LEFT JOIN sched_classes k ON k.class = x.c;
  rs_r := array_fill(0::float8, ARRAY[cardinality(p_classes)]);
  rs_w := array_fill(0::float8, ARRAY[cardinality(p_classes)]);
  -- Reserved shares: R and W per class, read only while a reserved tenant is backlogged (in the
  -- fair index), from the class's counters plus their unfolded deltas: never a sum over queues.
  IF EXISTS (SELECT 1 FROM sched_tenants st WHERE st.reserved_share > 0 AND st.weight > 0 AND NOT st.suspended AND NOT st.quota_blocked
      AND EXISTS (SELECT 1 FROM sched_queues sq WHERE sq.tenant_id = st.tenant_id AND sq.class = ANY (p_classes) AND sq.ready_at IS NOT NULL
        AND NOT sq.tenant_dormant AND NOT sq.scheduled AND sq.held_api IS NULL)) THEN
    FOR ci IN 1 .. cardinality(p_classes) LOOP
      SELECT k.reserved_sum + coalesce((SELECT sum(d.r) FROM sched_share_deltas d WHERE d.class = k.class), 0),
          k.unreserved_weight + k.reserved_weight + coalesce((SELECT sum(d.w + d.rw) FROM sched_share_deltas d WHERE d.class = k.class), 0)
        INTO r_sum, w_sum
        FROM sched_classes k WHERE k.class = p_classes[ci];
      rs_r[ci] := coalesce(r_sum, 0);
      rs_w[ci] := coalesce(w_sum, 0);
    END LOOP;
  END IF;

  WHILE taken < p_max AND slots < room AND tokens_used < tok LOOP
    found_q := false;
    FOR ci IN 1 .. cardinality(p_classes) LOOP
      CONTINUE WHEN dead[ci];
      c := p_classes[ci];
      -- The first two eligible queues of the class after the cursor, in the index's order (the
      -- tenant's eligibility a scalar subquery: a key lookup per row, never planned as a join).
      -- A tenant's in_flight is its row's plus what this call added.
      SELECT coalesce(array_agg(x.tenant_id ORDER BY x.o), '{}'), coalesce(array_agg(x.vtime ORDER BY x.o), '{}') INTO w_t, w_v FROM (
        SELECT sq.tenant_id, sq.vtime, row_number() OVER () AS o FROM (
          SELECT sq.tenant_id, sq.vtime FROM sched_queues sq
          WHERE sq.class = c AND sq.ready_at IS NOT NULL AND sq.ready_at <= now()
            AND NOT sq.tenant_dormant AND NOT sq.scheduled AND sq.held_api IS NULL
            AND (sq.vtime, sq.tenant_id) > (cur_v[ci], cur_t[ci])
            AND coalesce((SELECT st.in_flight + coalesce(tn_add[array_position(tn_id, st.tenant_id)], 0) < st.cap
                  AND NOT st.quota_blocked AND NOT st.suspended AND st.weight > 0
                FROM sched_tenants st WHERE st.tenant_id = sq.tenant_id), false)
          ORDER BY sq.class, sq.vtime, sq.tenant_id LIMIT 2) sq) x;
      -- The queues this call served (their index entries are behind the cursor, at their old
      -- virtual times): the eligible ones that come before the walk's second.
      m_t := '{}';
      m_v := '{}';
      IF cardinality(sv_key) > 0 AND (cardinality(w_t) < 2 OR m_low[ci] <= w_v[2]) THEN
        SELECT coalesce(array_agg(m.mt ORDER BY m.mv, m.mt), '{}'), coalesce(array_agg(m.mv ORDER BY m.mv, m.mt), '{}') INTO m_t, m_v
        FROM unnest(sv_key, sv_t, sv_c, sv_v) m(mk, mt, mc, mv)
        WHERE m.mc = c AND (cardinality(w_t) < 2 OR (m.mv, m.mt) < (w_v[2], w_t[2])) AND NOT (m.mk = ANY (skip))
          AND coalesce((SELECT st.in_flight + coalesce(tn_add[array_position(tn_id, st.tenant_id)], 0) < st.cap
                AND NOT st.quota_blocked AND NOT st.suspended AND st.weight > 0
              FROM sched_tenants st WHERE st.tenant_id = m.mt), false);
        -- None before the walk's second: every eligible served queue of the class is at or after
        -- it (virtual times only grow within the call).
        IF cardinality(m_t) = 0 AND cardinality(w_t) = 2 THEN m_low[ci] := w_v[2]; END IF;
      END IF;
      -- Neither list has a queue: none of the class's can become eligible later in this call (a
      -- tenant's cap slots only fill, quota blocks and skips only grow, a queue served is in the
      -- second list, and readiness is the call's snapshot), so the class is not read again.
      IF cardinality(w_t) = 0 AND cardinality(m_t) = 0 THEN
        dead[ci] := true;
        CONTINUE;
      END IF;
      -- Merge: the pick and the next of both lists (both in (vtime, tenant_id) order).
      q_tenant := NULL;
      n_vtime := NULL;
      i := 1;
      k := 1;
      WHILE n_vtime IS NULL AND (i <= cardinality(w_t) OR k <= cardinality(m_t)) LOOP
        IF k > cardinality(m_t) OR (i <= cardinality(w_t) AND (w_v[i], w_t[i]) < (m_v[k], m_t[k])) THEN
          IF q_tenant IS NULL THEN q_tenant := w_t[i]; q_vtime := w_v[i]; q_mem := false; ELSE n_vtime := w_v[i]; END IF;
          i := i + 1;
        ELSE
          IF q_tenant IS NULL THEN q_tenant := m_t[k]; q_vtime := m_v[k]; q_mem := true; ELSE n_vtime := m_v[k]; END IF;
          k := k + 1;
        END IF;
      END LOOP;
      -- (A FOR loop's variable is the loop's own: keep the class's index.)
      IF q_tenant IS NOT NULL THEN found_q := true; q_ci := ci; EXIT; END IF;
    END LOOP;
    EXIT WHEN NOT found_q;
    SELECT q_tenant AS tenant_id, q_vtime AS vtime INTO q;
    qkey := q.tenant_id::text || '/' || c;
    -- Served already in this call: in a paced window the round is over, and alone in its class in
    -- any window; the call ends, and the next call (at once) shares what is left of the tokens
    -- with the queues that became ready meanwhile (see the header).
    EXIT WHEN (n_vtime IS NULL OR now_tokens IS NOT NULL) AND array_position(sv_key, qkey) IS NOT NULL;
    -- From the walk: whatever this turn does, the queue is passed for the rest of the call (served:
    -- read from the arrays from now on; otherwise skipped or the call ends).
    IF NOT q_mem THEN
      cur_v[q_ci] := q.vtime;
      cur_t[q_ci] := q.tenant_id;
      -- A queue's turn starts no earlier than the class clock (SFQ's start tag max(v, F)): one
      -- marked ready at a clock a concurrent lease was moving, or passed over in earlier calls,
      -- gets no credit for the gap. (A queue served in this call is past the clock already.)
      q.vtime := greatest(q.vtime, clk0[q_ci]);
    END IF;
    -- The next queue's turn will start no earlier than the clock either.
    IF n_vtime IS NOT NULL THEN n_vtime := greatest(n_vtime, clk0[q_ci]); END IF;
    tn_i := array_position(tn_id, q.tenant_id);
    -- The tenant's row, locked and re-checked: waited for only while the call holds no tenant row;
    -- after that SKIP LOCKED, and a front tenant held by someone else ends the call.
    IF holding THEN
      SELECT st.* INTO t FROM sched_tenants st
        WHERE st.tenant_id = q.tenant_id AND st.in_flight + coalesce(tn_add[tn_i], 0) < st.cap AND NOT st.quota_blocked AND NOT st.suspended
        FOR UPDATE SKIP LOCKED;
      IF NOT FOUND THEN
        PERFORM 1 FROM sched_tenants st
          WHERE st.tenant_id = q.tenant_id AND st.in_flight + coalesce(tn_add[tn_i], 0) < st.cap AND NOT st.quota_blocked AND NOT st.suspended;
        EXIT WHEN FOUND;
        skip := skip || qkey;
        CONTINUE;
      END IF;
    ELSE
      waited_at := clock_timestamp();
      SELECT st.* INTO t FROM sched_tenants st
        WHERE st.tenant_id = q.tenant_id AND st.in_flight + coalesce(tn_add[tn_i], 0) < st.cap AND NOT st.quota_blocked AND NOT st.suspended
        FOR UPDATE;
      IF NOT FOUND THEN
        skip := skip || qkey;
        CONTINUE;
      END IF;
      holding := true;
      -- Waited for it (a settlement held the row), or picked as alone in its class in a paced
      -- window: the pick stands, but the walk that bounded its turn saw only queues ready by the
      -- call's start, and one whose submission committed since bounds the turn too (else the lone
      -- queue took a whole batch quantum, 20 x its weight, ahead of a tenant already answered).
      -- Ready by the clock, not by now(): its jobs may not be fetchable in this call (pg-boss
      -- fetches by now()), but it is waiting. Only the first row is waited for: at most once a call.
      IF clock_timestamp() - waited_at > interval '1 millisecond' OR (n_vtime IS NULL AND now_tokens IS NOT NULL) THEN
        SELECT greatest(sq.vtime, clk0[q_ci]) INTO n_now FROM sched_queues sq
          WHERE sq.class = c AND sq.ready_at IS NOT NULL AND sq.ready_at <= clock_timestamp() AND sq.tenant_id <> q.tenant_id
            AND NOT sq.tenant_dormant AND NOT sq.scheduled AND sq.held_api IS NULL
            AND coalesce((SELECT st.in_flight < st.cap AND NOT st.quota_blocked AND NOT st.suspended AND st.weight > 0
                FROM sched_tenants st WHERE st.tenant_id = sq.tenant_id), false)
          ORDER BY sq.class, sq.vtime, sq.tenant_id LIMIT 1;
        IF FOUND AND (n_vtime IS NULL OR n_now < n_vtime) THEN n_vtime := n_now; END IF;
      END IF;
    END IF;
    sv_i := array_position(sv_key, qkey);
    -- The queue's row, never waited for: held by another transaction (a submission's depth
    -- trigger, mostly), the queue sits out this call. (Served before in this call: held already.)
    IF sv_i IS NULL THEN
      PERFORM 1 FROM sched_queues sq WHERE sq.tenant_id = q.tenant_id AND sq.class = c FOR UPDATE SKIP LOCKED;
      IF NOT FOUND THEN
        skip := skip || qkey;
        CONTINUE;
      END IF;
    END IF;
    qn := 't.' || q.tenant_id::text || '.' || lower(c);
    cap_free := t.cap - (t.in_flight + coalesce(tn_add[tn_i], 0));
    -- The tenant's weight in the virtual clock: raised by its reserved share (see the header).
    weff := t.weight;
    IF t.reserved_share > 0 THEN
      weff := t.weight::float8 + t.reserved_share / (1 - least(rs_r[q_ci], 0.8::float8)) * rs_w[q_ci];
    END IF;
    -- Items this queue may take before its virtual time passes the next queue's (at least one).
    quantum := CASE WHEN n_vtime IS NULL THEN 2147483647 ELSE greatest(1, floor((n_vtime - q.vtime) * weff) + 1) END;
    take := greatest(1, least(p_lease_max, p_max - taken, room - slots, tok - tokens_used, cap_free, quantum)::int);
    is_batch := false;
    head := NULL;
    IF p_batch_max > 1 THEN
      SELECT j.data->>'api' INTO head FROM pgboss.job j
        WHERE j.name = qn AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
          AND NOT ((j.data->>'api') = ANY (p_hold)) AND (sv_i IS NULL OR NOT (j.id = ANY (picked_ids)))
        ORDER BY j.priority DESC, j.created_on LIMIT 1;
      spec := p_batch -> head;
      IF spec IS NOT NULL THEN
        -- A batch turn (batching.ts batchTake): see the header.
        is_batch := true;
        -- Capped at the fair limit too (the quantum): the next queues' turns join the same call.
        -- An unpaced window's batch turn may take the API's minimum batch (see the header).
        take := greatest(take, least(greatest(take, least(tok - tokens_used, p_batch_max, (spec->>0)::int, cap_free), 1),
          floor(p_batch_quantum * weff), CASE WHEN now_tokens IS NULL THEN greatest(quantum, (spec->>1)::int) ELSE quantum END), 1);
        take := least(take, p_max - taken);
      END IF;
    END IF;
    -- With the jobs, their credits and their distinct inputs (one statement, not three).
    SELECT coalesce(array_agg(f.id ORDER BY f.o), '{}'), coalesce(array_agg(f.data ORDER BY f.o), '{}'),
        coalesce(array_agg(coalesce((p_costs ->> (f.data->>'api'))::int, 1) ORDER BY f.o), '{}'), count(DISTINCT f.data->'params')::int
      INTO ids, datas, costs, distinct_n FROM (
      SELECT j.id, j.data, row_number() OVER () AS o FROM (
        SELECT j.id, j.data FROM pgboss.job j
        WHERE j.name = qn AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
          AND NOT ((j.data->>'api') = ANY (p_hold)) AND (NOT is_batch OR j.data->>'api' = head)
          -- Activation waits for the end of the call: skip the rows this call already took from
          -- this queue (SKIP LOCKED skips only other transactions' locks).
          AND (sv_i IS NULL OR NOT (j.id = ANY (picked_ids)))
        ORDER BY j.priority DESC, j.created_on LIMIT take
        FOR UPDATE OF j SKIP LOCKED) j) f;
    fetched := cardinality(ids);
    batch_fetch := is_batch;
    IF fetched = 0 THEN
      -- Nothing pg-boss would hand out: the queue leaves the fair index (see the header). Its head
      -- job due now is for an API held here: held by that API until a lease not holding it, or a
      -- submission, wakes it. Otherwise scheduled: ready again when its earliest queued job is, by
      -- the due check. Its row is ours (locked above).
      head := NULL;
      IF cardinality(p_hold) > 0 THEN
        SELECT j.data->>'api' INTO head FROM pgboss.job j
          WHERE j.name = qn AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
            AND (sv_i IS NULL OR NOT (j.id = ANY (picked_ids)))
          ORDER BY j.priority DESC, j.created_on LIMIT 1;
        IF NOT (head = ANY (p_hold)) THEN head := NULL; END IF;
      END IF;
      UPDATE sched_queues sq SET
          held_api = CASE WHEN sq.depth = 0 THEN NULL ELSE head END,
          scheduled = sq.depth > 0 AND head IS NULL,
          ready_at = CASE WHEN sq.depth = 0 THEN NULL WHEN head IS NOT NULL THEN sq.ready_at ELSE (
            SELECT greatest(min(jb.run_after), now() + interval '1 second') FROM jobs jb
            WHERE jb.tenant_id = q.tenant_id AND jb.priority = c AND jb.state = 'QUEUED') END
      WHERE sq.tenant_id = q.tenant_id AND sq.class = c;
      skip := skip || qkey;
      CONTINUE;
    END IF;
    IF is_batch THEN
      ob_i := array_position(ob_api, head);
      IF distinct_n < (spec->>1)::int AND NOT coalesce(ob_items[ob_i] + distinct_n <= least(p_batch_max, (spec->>0)::int), false)
          AND (now_tokens IS NULL OR n_vtime IS NULL) THEN
        -- Too few distinct inputs for a batch call of their own and no room in the call's open
        -- one: single calls, each its own slot and token. In a paced window with another queue in
        -- the class to join it, the turn opens the call below the minimum batch instead.
        is_batch := false;
      END IF;
    END IF;
    IF NOT is_batch AND cardinality(ids) > least(room - slots, tok - tokens_used) THEN
      ids := ids[1:least(room - slots, tok - tokens_used)];
      datas := datas[1:least(room - slots, tok - tokens_used)];
      costs := costs[1:least(room - slots, tok - tokens_used)];
    END IF;
    -- The quota: the prefix of the jobs that fits on top of what is billed and reserved.
    period := sluice_quota_period(t.period_anchor, now());
    IF tn_i IS NOT NULL THEN
      used := tn_used[tn_i];
    ELSE
      -- The ledger row cannot change under us: every writer of it holds the tenant's row, as we do.
      SELECT l.billed + l.reserved INTO used FROM tenant_ledger l WHERE l.tenant_id = q.tenant_id AND l.period_start = period;
      used := coalesce(used, 0);
    END IF;
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
        -- (Its depth trigger updates this queue's row: ours.)
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
        -- WAIT: the tenant waits for quota, visibly; its queues go dormant (out of the fair index;
        -- the renewal brings them back at the class clock). O(1) whatever the backlog: the flag
        -- changes, its jobs stay QUEUED and show WAITING_QUOTA while it is set (sluice_job_state),
        -- and one tenant-wide event (no jobId, "allWaiting") tells subscribers their waiting jobs
        -- changed. Only the queue rows free now are marked: a row another transaction holds stays
        -- in the index, and is not picked while the tenant is blocked.
        UPDATE sched_tenants SET quota_blocked = true, quota_blocked_cost = costs[fit + 1] WHERE sched_tenants.tenant_id = q.tenant_id;
        PERFORM pg_notify('sluice_job_events', jsonb_build_object('tenantId', q.tenant_id, 'state', 'WAITING_QUOTA', 'allWaiting', true)::text);
        UPDATE sched_queues sq SET tenant_dormant = true
          FROM (SELECT l.class FROM sched_queues l WHERE l.tenant_id = q.tenant_id ORDER BY l.class FOR UPDATE SKIP LOCKED) l
          WHERE sq.tenant_id = q.tenant_id AND sq.class = l.class;
      END IF;
      skip := skip || qkey;
      ids := ids[1:fit];
      datas := datas[1:fit];
      IF fit = 0 THEN CONTINUE; END IF;
    END IF;
    -- The turn. The queue's virtual time (advanced by the jobs taken / weight, a batch counts every
    -- job) and the tenant's added in_flight go to the arrays the next pick reads; the rows, the
    -- activation, claims, ledger and reservations are written once for all turns, after the loop.
    n_turn := n_turn + 1;
    turn_at[n_turn] := clock_timestamp();
    claimed := cardinality(ids);
    IF is_batch AND fit < fetched THEN
      -- (Counted above for all the fetched jobs; the quota kept a prefix.)
      SELECT count(DISTINCT d->'params')::int INTO distinct_n FROM unnest(datas) d;
    END IF;
    IF sv_i IS NULL THEN
      sv_i := cardinality(sv_key) + 1;
      sv_key[sv_i] := qkey;
      sv_t[sv_i] := q.tenant_id;
      sv_c[sv_i] := c;
      sv_v[sv_i] := q.vtime;
    END IF;
    sv_v[sv_i] := sv_v[sv_i] + claimed::float8 / weff;
    m_low[q_ci] := least(m_low[q_ci], sv_v[sv_i]);
    IF tn_i IS NULL THEN
      tn_i := cardinality(tn_id) + 1;
      tn_id[tn_i] := q.tenant_id;
      tn_add[tn_i] := 0;
    END IF;
    tn_add[tn_i] := tn_add[tn_i] + claimed;
    tn_used[tn_i] := used;
    -- The class clock: the start tag of the last job served in fair order (the turn's last job,
    -- not its first; jobs beyond the quantum, an unpaced window's minimum batch, are served
    -- ahead of their turn and do not move it).
    IF NOT served ? c OR (served->>c)::float8 < q.vtime + (least(claimed, quantum) - 1)::float8 / weff THEN
      served := jsonb_set(served, ARRAY[c], to_jsonb(q.vtime + (least(claimed, quantum) - 1)::float8 / weff));
    END IF;
    -- The pool: a batch turn joins the call's open batch of its API while the items fit (one
    -- call, one slot, whatever tenants' items it carries), else opens one (a slot); singles take
    -- a slot each. Tokens: one per item sent.
    call_no := NULL;
    IF is_batch THEN
      ob_i := array_position(ob_api, head);
      IF ob_i IS NOT NULL AND ob_items[ob_i] + distinct_n <= least(p_batch_max, (spec->>0)::int) THEN
        ob_items[ob_i] := ob_items[ob_i] + distinct_n;
      ELSE
        IF ob_i IS NULL THEN
          ob_i := cardinality(ob_api) + 1;
          ob_api[ob_i] := head;
        END IF;
        ob_call[ob_i] := n_turn;
        ob_items[ob_i] := distinct_n;
        slots := slots + 1;
      END IF;
      call_no := ob_call[ob_i];
      tokens_used := tokens_used + distinct_n;
    ELSE
      slots := slots + claimed;
      tokens_used := tokens_used + claimed;
    END IF;
    FOR i IN 1 .. claimed LOOP
      n_pk := n_pk + 1;
      pk_turn[n_pk] := n_turn;
      pk_o[n_pk] := i;
      picked_ids[n_pk] := ids[i];
      pk_data[n_pk] := datas[i];
      pk_tenant[n_pk] := q.tenant_id;
      pk_class[n_pk] := c;
      pk_queue[n_pk] := qn;
      pk_period[n_pk] := period;
      pk_cost[n_pk] := coalesce((p_costs ->> (datas[i]->>'api'))::int, 1);
      pk_batched[n_pk] := is_batch;
      pk_call[n_pk] := call_no;
    END LOOP;
    taken := taken + claimed;
    -- Fewer ready jobs than the take (any API): the queue has nothing more for this call.
    IF fetched < take AND NOT batch_fetch THEN
      skip := skip || qkey;
    END IF;
  END LOOP;

  -- The deferred per-turn writes, on rows this call holds: tenants' cap slots here, virtual
  -- times below (with the idle marks, one write per queue).
  IF cardinality(sv_key) > 0 THEN
    UPDATE sched_tenants st SET in_flight = st.in_flight + x.n FROM unnest(tn_id, tn_add) x(t, n)
      WHERE st.tenant_id = x.t AND st.tenant_id = ANY (tn_id);
  END IF;
  -- The due check: scheduled queues whose earliest job is due now, and queues held for an API this
  -- call does not hold (its breaker closed here, or another node's held it), come back to the fair
  -- index at the class clock (no credit for the time away). At most 256 of each a call, after
  -- every tenant row it takes, SKIP LOCKED: never waits. With nothing due it is two probes and one
  -- per distinct held API (the loose scan below), whatever the number of dormant queues.
  WITH RECURSIVE h(api) AS (
    SELECT min(l.held_api) FROM sched_queues l WHERE l.held_api IS NOT NULL
    UNION ALL
    SELECT (SELECT min(l.held_api) FROM sched_queues l WHERE l.held_api > h.api) FROM h WHERE h.api IS NOT NULL)
  SELECT coalesce(array_agg(h.api), '{}') INTO wake_apis FROM h WHERE h.api IS NOT NULL AND NOT (h.api = ANY (p_hold));
  WITH a AS (SELECT l.tenant_id, l.class FROM sched_queues l WHERE l.scheduled AND l.ready_at <= now()
      ORDER BY l.ready_at LIMIT 256 FOR UPDATE SKIP LOCKED),
    b AS (SELECT l.tenant_id, l.class FROM sched_queues l WHERE l.held_api = ANY (wake_apis)
      LIMIT 256 FOR UPDATE SKIP LOCKED)
  UPDATE sched_queues sq SET scheduled = false, held_api = NULL, vtime = greatest(sq.vtime, k.clock)
    FROM sched_classes k, (SELECT a.tenant_id, a.class FROM a UNION SELECT b.tenant_id, b.class FROM b) l
    WHERE k.class = sq.class AND sq.tenant_id = l.tenant_id AND sq.class = l.class;
  IF taken = 0 THEN RETURN; END IF;
  -- A paced window's batch call that got one job only (a turn below the API's minimum that no
  -- other turn joined) goes as a single call: the same slot and token, no batch for one item.
  IF now_tokens IS NOT NULL THEN
    SELECT coalesce(array_agg(x.call), '{}') INTO lone_calls
      FROM (SELECT u.call FROM unnest(pk_call) u(call) WHERE u.call IS NOT NULL GROUP BY u.call HAVING count(*) = 1) x;
    IF cardinality(lone_calls) > 0 THEN
      FOR i IN 1 .. n_pk LOOP
        IF pk_call[i] = ANY (lone_calls) AND coalesce((p_batch -> (pk_data[i]->>'api') ->> 1)::int, 1) > 1 THEN
          pk_batched[i] := false;
          pk_call[i] := NULL;
        END IF;
      END LOOP;
    END IF;
  END IF;
  SELECT jsonb_agg(jsonb_build_object('turn', u.turn, 'o', u.o, 'id', u.id, 'data', u.d, 'tenant', u.tenant, 'class', u.cls,
      'queue', u.queue, 'period', u.period, 'cost', u.cost, 'batched', u.batched, 'call', u.call) ORDER BY u.n)
    INTO picked
    FROM unnest(pk_turn, pk_o, picked_ids, pk_data, pk_tenant, pk_class, pk_queue, pk_period, pk_cost, pk_batched, pk_call)
      WITH ORDINALITY u(turn, o, id, d, tenant, cls, queue, period, cost, batched, call, n);
  -- Activate exactly as pg-boss's fetch does (the rows are ours: locked by the fetches above).
  UPDATE pgboss.job j SET state = 'active', started_on = pgboss.job_now(), heartbeat_on = pgboss.job_now(),
      retry_count = CASE WHEN j.started_on IS NOT NULL THEN j.retry_count + 1 ELSE j.retry_count END
    FROM (SELECT e->>'queue' AS name, (e->>'id')::uuid AS id FROM jsonb_array_elements(picked) e) p
    WHERE j.name = p.name AND j.id = p.id;
  -- Claim (the attempt number fences the attempt); a job cancelled meanwhile is acknowledged, not called.
  WITH cl AS (
    UPDATE jobs jb SET state = 'RUNNING', attempts = jb.attempts + 1, started_at = coalesce(jb.started_at, turn_at[p.turn]), updated_at = now()
    FROM unnest(picked_ids, pk_turn) p(id, turn)
    WHERE jb.id = p.id AND jb.id = ANY (picked_ids) AND jb.state IN ('QUEUED', 'WAITING_QUOTA')
    RETURNING jb.id, jb.attempts),
  m AS (
    SELECT e, cl.attempts,
      row_number() OVER (PARTITION BY coalesce((e->>'call')::int, (e->>'turn')::int) ORDER BY (e->>'turn')::int, (e->>'o')::int) AS k
    FROM jsonb_array_elements(picked) e JOIN cl ON cl.id = (e->>'id')::uuid)
  -- A batch call's pool slot is carried by its first claimed job's reservation (its first turn's).
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
    UPDATE sched_tenants st SET in_flight = st.in_flight - d.n
      FROM (SELECT (g.e->>'tenant')::uuid AS tenant_id, count(*)::int AS n FROM g GROUP BY 1) d
      WHERE st.tenant_id = d.tenant_id;
    SELECT count(*) FILTER (WHERE (o->>'slot')::boolean)::int INTO slots FROM jsonb_array_elements(out_rows) o;
  END IF;
  -- Each served queue's virtual time, and a queue that claimed jobs and has nothing left waiting
  -- goes idle (a submission or a retry marks it ready again): one write per queue, after the
  -- claim, whose depth trigger has updated the row (the depth judged here is the claim's).
  UPDATE sched_queues sq SET vtime = x.v,
      ready_at = CASE WHEN sq.depth = 0 AND x.k = ANY (ARRAY(SELECT DISTINCT (o->>'tenant') || '/' || (o->>'class')
        FROM jsonb_array_elements(out_rows) o)) THEN NULL ELSE sq.ready_at END
    FROM unnest(sv_key, sv_t, sv_c, sv_v) x(k, t, c, v)
    WHERE sq.tenant_id = x.t AND sq.class = x.c AND sq.tenant_id = ANY (sv_t);
  IF jsonb_array_length(out_rows) = 0 THEN RETURN; END IF;
  -- The credits: one ledger write per tenant and period for all its turns.
  INSERT INTO tenant_ledger AS l (tenant_id, period_start, reserved)
    SELECT (o->>'tenant')::uuid, (o->>'period')::timestamptz, sum((o->>'cost')::int) FROM jsonb_array_elements(out_rows) o GROUP BY 1, 2
    ON CONFLICT (tenant_id, period_start) DO UPDATE SET reserved = l.reserved + excluded.reserved;
  INSERT INTO reservations (id, job_id, attempt, tenant_id, period_start, "window", node_id, credits, window_slot, created_at, lease_expires_at)
    SELECT (o->>'rid')::uuid, (o->>'id')::uuid, (o->>'attempt')::int, (o->>'tenant')::uuid, (o->>'period')::timestamptz, p_window, p_node,
      (o->>'cost')::int, (o->>'slot')::boolean, clock_timestamp(), clock_timestamp() + make_interval(secs => p_lease_seconds)
    FROM jsonb_array_elements(out_rows) o;
  -- Each class's clock: the largest start tag served in fair order (no credit for idle time).
  UPDATE sched_classes k SET clock = greatest(k.clock, (served->>k.class)::float8), served_at = now() WHERE served ? k.class;
  -- The reserved-shares deltas appended since the last fold (this call's idle marks among them)
  -- fold into the classes' counters, so the next call's read of them stays short; SKIP LOCKED: a
  -- concurrent fold (another window's lease, the sweeper) takes the rest.
  WITH d AS (DELETE FROM sched_share_deltas x WHERE x.ctid = ANY (ARRAY(SELECT y.ctid FROM sched_share_deltas y FOR UPDATE SKIP LOCKED))
    RETURNING x.class, x.r, x.w, x.rw)
  UPDATE sched_classes k SET reserved_sum = k.reserved_sum + s.r, unreserved_weight = k.unreserved_weight + s.w, reserved_weight = k.reserved_weight + s.rw
    FROM (SELECT d.class, sum(d.r) AS r, sum(d.w) AS w, sum(d.rw) AS rw FROM d GROUP BY d.class) s WHERE k.class = s.class;
  -- Ready queues lagging the clock by more than LAG_SLACK (8: a few turns' worth) are lifted to it:
  -- passed over while their tenant was capped, an API held or the row locked, or marked ready at a
  -- clock this call then moved. Otherwise such a queue is served alone until it catches up (see
  -- the header). SKIP LOCKED, after every tenant row this call takes: never waits.
  -- Once lifted, a queue still passed over is lifted again only after the clock moves another 8.
  FOR c IN SELECT jsonb_object_keys(served) LOOP
    SELECT k.clock INTO lift_to FROM sched_classes k WHERE k.class = c;
    UPDATE sched_queues q SET vtime = lift_to
      WHERE q.class = c AND q.tenant_id IN (
        SELECT l.tenant_id FROM sched_queues l
        WHERE l.class = c AND l.ready_at IS NOT NULL AND NOT l.tenant_dormant AND NOT l.scheduled AND l.held_api IS NULL
          AND l.vtime < lift_to - 8
        FOR UPDATE SKIP LOCKED);
  END LOOP;
  -- The slot releases settlements appended since the last lease fold into the row here (only this
  -- call can run on the window now: its try-lock), so settlements never write the hot row.
  WITH f AS (DELETE FROM window_slot_deltas d WHERE d."window" = p_window RETURNING d.n)
  SELECT coalesce(sum(f.n), 0)::int INTO pending FROM f;
  -- The hot row, once per call and last: only if the tokens and slots are still there.
  UPDATE windows x SET
      tokens = CASE WHEN x.rate_per_minute IS NULL THEN 0 ELSE least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) - tokens_used END,
      refilled_at = clock_timestamp(), in_flight = x.in_flight + pending + slots
    WHERE x.name = p_window
      AND (x.paused_until IS NULL OR x.paused_until <= clock_timestamp())
      AND NOT EXISTS (SELECT 1 FROM account_state a WHERE a.dispatch_stopped_until > clock_timestamp())
      AND (x.rate_per_minute IS NULL OR least(x.burst, x.tokens + greatest(0, extract(epoch FROM (clock_timestamp() - x.refilled_at))) * x.rate_per_minute / 60.0) >= tokens_used - 1e-9)
      AND x.in_flight + pending + slots <= p_pool;
  IF NOT FOUND THEN
    -- Undone by the handler below, which returns status 'changed'.
    RAISE EXCEPTION 'sluice_lease: window % changed under the lease', p_window USING ERRCODE = 'SL409';
  END IF;
  PERFORM pg_notify('sluice_job_events', jsonb_build_object('jobId', o->>'id', 'tenantId', o->>'tenant', 'state', 'RUNNING')::text)
    FROM jsonb_array_elements(out_rows) o;
  RETURN QUERY SELECT (o->>'turn')::int, (o->>'rid')::uuid, (o->>'id')::uuid, (o->>'attempt')::int, (o->>'tenant')::uuid, o->>'class',
      o->>'queue', o->'data', (o->>'cost')::int, (o->>'batched')::boolean, (o->>'slot')::boolean, (o->>'call')::int, 'leased'::text
    FROM jsonb_array_elements(out_rows) o;
EXCEPTION WHEN SQLSTATE 'SL409' THEN
  -- The window changed under the call: its writes are rolled back to the block's start (no rows
  -- were returned yet: they are the call's last step). Contention, so a result.
  RETURN QUERY SELECT NULL::int, NULL::uuid, NULL::uuid, NULL::int, NULL::uuid, NULL::text, NULL::text, NULL::jsonb, NULL::int,
    NULL::boolean, NULL::boolean, NULL::int, 'changed'::text;
END $function$;
