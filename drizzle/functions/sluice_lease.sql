-- sluice_lease: the lease in one round trip. Leases up to p_max jobs of window p_window across as
-- many tenants as the weighted fair order allows, in ONE call (one transaction), and activates
-- their pg-boss jobs in it. src/scheduler/lease.ts (planPicks) is the pure model of the same
-- decisions, in the same phases; test/lease-differential.test.ts checks that the two pick the same
-- jobs and leave the same state.
--
-- This function is the driver: the window's budget (sluice_lease_budget: tokens, pool room), then
-- turns until the budget, p_max or the eligible queues run out, each turn in four phases, then the
-- commit:
-- - pick (sluice_lease_pick): the front queue of the first class of p_classes (the dispatcher's
--   order, starving classes first) that has an eligible one, and the next queue's virtual time;
-- - lock (sluice_lease_lock): its tenant's row and its queue's row ('skip' or 'end' otherwise);
-- - fetch (sluice_lease_fetch): the take (the quantum to the next queue, or a batch turn) and the
--   jobs from pg-boss; a queue with nothing to hand out goes dormant;
-- - quota (sluice_lease_quota): the prefix of the jobs that fits, blocking (WAIT) or failing (FAIL)
--   the first that does not;
-- - the turn itself, here: the queue's virtual time advanced by the jobs actually taken / weight
--   (start + n/w, where a queue's first turn in the call starts at its virtual time or the class
--   clock at the call's start, whichever is later: SFQ's start tag max(v, F)), the tenant's slots,
--   the class clock, the pool (a batch turn joins the call's open batch of its API while the items
--   fit: p_batch_max and the API's maxSize; one slot per call, one token per distinct input), the
--   picks. A turn writes no row: what the next pick reads is kept in the call's arrays;
-- - after the last turn: the due check (sluice_lease_wake), the claim (sluice_lease_claim: pg-boss
--   activation, jobs RUNNING, tenants' cap slots) and the commit (sluice_lease_commit: virtual
--   times and idle marks, ledger, reservations, class clocks, the lift of lagging queues, and last
--   the window row, ONCE, with a conditional update). The output column `call` numbers each
--   batched job's call; the provider counts and bills a batch's items one by one, so nothing ties
--   a call to one tenant (inputs are folded per tenant only).
--
-- Dormant queues (tenant suspended or quota-blocked, every job due later, every due job for a held
-- API) are out of the fair index (sluice_queue_in_fair_index): the walk, the lift and the reserved
-- totals never read them (docs/ARCHITECTURE.md "Dormant work": the call's cost does not grow with
-- dormant queues).
--
-- A queue this call served already ends the call, in a paced window (one round per call) or when
-- it is alone in its class: the next call, at once, shares what is left of the tokens with the
-- queues that became ready meanwhile. Otherwise the tokens a pause or idle time saved up (the
-- bucket: 3 s of pace) went in one call to the queues visible when it started: a call of 120
-- alternating turns took 120 ms while a tenant that had become ready waited for the next. An
-- unpaced window has no saved-up tokens, and its calls are as large as the pool's room.
--
-- Reserved shares (tenant's reserved_share r, 0 to 1 of the window's dispatches) are floors: while
-- a reserved tenant is backlogged, its weight in the virtual clock is w + r / (1 - R) x W, R the
-- backlogged reserved shares of its class (at most 0.8: the admin API keeps the sum there, and a
-- transiently larger sum of scheduler copies is read as 0.8), W the whole backlogged weight there
-- (reserved tenants' included; sluice_lease_shares reads both once); every other tenant keeps w.
-- Shares go as the weights, so each tenant gets r + (1 - R) x w / W of the class's dispatches: its
-- reservation first, then its part of the rest by weight, whatever the weights.
--
-- Contention is a result, not an error (an ERROR per busy call filled Postgres's log: ~1,600
-- lines in two minutes with three workers). One lease per window runs at a time (a
-- transaction-scoped try-lock): a second call returns at once one row with no job and status
-- 'busy'. When the window's row no longer allows the take at the end (a provider signal paused
-- or stopped it, or the account stopped, while the call ran: only leases take tokens and slots,
-- under the try-lock), everything the call wrote is undone and it returns one row with status
-- 'changed'; the dispatcher decides again. The undo needs a savepoint: the function's block has
-- an exception handler for exactly that case (SL409, raised by the commit and caught here, never
-- sent to the client or the log), which costs one subtransaction per call. Job rows carry status
-- 'leased'.
--
-- Counters are never clamped: a window whose in-flight count plus the slots given back would go
-- below zero (more released than taken) raises check_violation (sluice_lease_budget) instead of
-- leasing on a wrong count (a clamp hid a double release until quiescence).
--
-- Lock order (docs/ARCHITECTURE.md): the window's try-lock -> sched_tenants (waited for only for
-- the first, holding nothing; then SKIP LOCKED) -> pgboss.job (SKIP LOCKED) -> jobs ->
-- sched_queues (SKIP LOCKED) -> tenant_ledger -> reservations (new rows) -> sched_classes ->
-- windows.
--
-- Planner settings, for this function and the phases it calls (they set none of their own): no
-- sorts, as every ordered read here has an index in its order (the fair order, pg-boss's fetch
-- order); without statistics (a fresh database, tens of thousands of queues created in seconds)
-- the planner sorted every ready queue on each pick instead of walking the index (7 ms a pick with
-- 10,000 tenants instead of 0.05). No bitmap scans, for the same reason. No sequential scans: a
-- lookup by key always takes its index (the planner priced a jsonb list at 100 rows and hashed it
-- against a scan of the whole table). No JIT: disabled paths cost 1e10 in the planner's
-- arithmetic, which would pass jit_above_cost and compile every call (300 ms). Generic plans: each
-- statement here is planned once per connection, not at each execution; the per-turn statements
-- run ~10,000 times in a 10,000-tenant drain, and planning (the plan cache kept choosing custom
-- plans) was about a tenth of the backends' CPU in a profile. Their parameters are keys and jsonb
-- or array lists, whose estimates a custom plan does not sharpen.
CREATE OR REPLACE FUNCTION sluice_lease(p_window text, p_node uuid, p_pool integer, p_max integer, p_lease_max integer, p_classes text[], p_lease_seconds integer, p_costs jsonb, p_hold text[], p_batch jsonb, p_batch_max integer, p_batch_quantum integer)
 RETURNS TABLE(turn integer, reservation_id uuid, job_id uuid, attempt integer, tenant_id uuid, class text, queue text, data jsonb, credits integer, batched boolean, window_slot boolean, call integer, status text)
 LANGUAGE plpgsql
 SET enable_sort TO 'off'
 SET enable_bitmapscan TO 'off'
 SET jit TO 'off'
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
  now_tokens float8;
  tok int;
  room int;
  taken int := 0;
  slots int := 0;
  tokens_used int := 0;
  n_turn int := 0;
  holding boolean := false;
  -- Queues passed over for the rest of the call ('tenant/class').
  skip text[] := '{}';
  -- Per class of p_classes: the clock at the call's start, the walk's cursor, the lower bound on
  -- the served queues' times (sluice_lease_pick), dead, the reserved totals (sluice_lease_shares).
  clk0 float8[];
  cur sluice_lease_queue[];
  m_low float8[];
  dead boolean[];
  rs_r float8[];
  rs_w float8[];
  -- One turn: its pick, locks, fetch and quota prefix.
  p record;
  l record;
  f record;
  qt record;
  c text;
  qkey text;
  qn text;
  vt float8;
  weff float8;
  n int;
  dn int;
  served jsonb := '{}';
  -- Queues served by this call (key, tenant, class, virtual time now: written by the commit);
  -- parallel arrays, as the pick and the turns look a key up by array_position.
  sv_key text[] := '{}';
  sv_t uuid[] := '{}';
  sv_c text[] := '{}';
  sv_v float8[] := '{}';
  sv_i int;
  -- Tenants served: slots taken (the pick's eligibility counts them) and the period's billed + the
  -- tenant's reserved credits.
  tn_id uuid[] := '{}';
  tn_add int[] := '{}';
  tn_used bigint[] := '{}';
  tn_i int;
  -- The call's open batch per API: its call number (the turn that opened it) and its items so far.
  ob_api text[] := '{}';
  ob_call int[] := '{}';
  ob_items int[] := '{}';
  ob_i int;
  call_no int;
  -- When each turn was decided (a job's started_at), and the picks, one per job.
  turn_at timestamptz[] := '{}';
  picks sluice_lease_job[] := '{}';
  picked_ids uuid[] := '{}';
  out_rows jsonb;
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtext('sluice_lease'), hashtext(p_window)) THEN
    RETURN QUERY SELECT NULL::int, NULL::uuid, NULL::uuid, NULL::int, NULL::uuid, NULL::text, NULL::text, NULL::jsonb, NULL::int,
      NULL::boolean, NULL::boolean, NULL::int, 'busy'::text;
    RETURN;
  END IF;
  SELECT b.now_tokens, b.tok, b.room INTO now_tokens, tok, room FROM sluice_lease_budget(p_window, p_pool) b;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  cur := array_fill(ROW('00000000-0000-0000-0000-000000000000', '-infinity')::sluice_lease_queue, ARRAY[cardinality(p_classes)]);
  m_low := array_fill('infinity'::float8, ARRAY[cardinality(p_classes)]);
  dead := array_fill(false, ARRAY[cardinality(p_classes)]);
  SELECT coalesce(array_agg(coalesce(k.clock, 0) ORDER BY x.o), '{}') INTO clk0
    FROM unnest(p_classes) WITH ORDINALITY x(c, o) LEFT JOIN sched_classes k ON k.class = x.c;
  SELECT s.r, s.w INTO rs_r, rs_w FROM sluice_lease_shares(p_classes) s;

  WHILE taken < p_max AND slots < room AND tokens_used < tok LOOP
    p := sluice_lease_pick(p_classes, cur, dead, m_low, sv_key, sv_t, sv_c, sv_v, tn_id, tn_add, skip);
    dead := p.dead;
    m_low := p.m_low;
    EXIT WHEN p.ci IS NULL;
    c := p_classes[p.ci];
    qkey := (p.q).tenant_id::text || '/' || c;
    sv_i := array_position(sv_key, qkey);
    tn_i := array_position(tn_id, (p.q).tenant_id);
    -- Served already in this call: in a paced window the round is over, and alone in its class in
    -- any window; the call ends, and the next call (at once) shares what is left of the tokens
    -- with the queues that became ready meanwhile (see the header).
    EXIT WHEN (p.next_vtime IS NULL OR now_tokens IS NOT NULL) AND sv_i IS NOT NULL;
    vt := (p.q).vtime;
    IF p.from_walk THEN
      -- Passed for the rest of the call, whatever this turn does (served: read from the arrays from
      -- now on). Its turn starts no earlier than the class clock (SFQ's start tag max(v, F)): one
      -- marked ready at a clock a concurrent lease was moving, or passed over in earlier calls,
      -- gets no credit for the gap. (A queue served in this call is past the clock already.)
      cur[p.ci] := p.q;
      vt := greatest(vt, clk0[p.ci]);
    END IF;
    l := sluice_lease_lock((p.q).tenant_id, c, coalesce(tn_add[tn_i], 0), clk0[p.ci], p.next_vtime IS NULL AND now_tokens IS NOT NULL,
      sv_i IS NOT NULL, holding, CASE WHEN p.next_vtime IS NOT NULL THEN greatest(p.next_vtime, clk0[p.ci]) END);
    holding := l.holding;
    EXIT WHEN l.status = 'end';
    IF l.status = 'skip' THEN
      skip := skip || qkey;
      CONTINUE;
    END IF;
    qn := 't.' || (p.q).tenant_id::text || '.' || lower(c);
    -- The tenant's weight in the virtual clock: raised by its reserved share (see the header).
    weff := (l.tenant).weight;
    IF (l.tenant).reserved_share > 0 THEN
      weff := (l.tenant).weight::float8 + (l.tenant).reserved_share / (1 - least(rs_r[p.ci], 0.8::float8)) * rs_w[p.ci];
    END IF;
    f := sluice_lease_fetch((p.q).tenant_id, c, qn, CASE WHEN sv_i IS NULL THEN '{}' ELSE picked_ids END, vt, l.next_vtime, weff,
      p_lease_max, p_max - taken, room - slots, tok - tokens_used, (l.tenant).cap - ((l.tenant).in_flight + coalesce(tn_add[tn_i], 0)),
      now_tokens IS NOT NULL, p_costs, p_hold, p_batch, p_batch_max, p_batch_quantum, ob_api, ob_items);
    IF cardinality(f.ids) = 0 THEN
      skip := skip || qkey;
      CONTINUE;
    END IF;
    qt := sluice_lease_quota(l.tenant, qn, f.ids, f.costs, tn_used[tn_i]);
    n := qt.fit;
    IF n < cardinality(f.ids) THEN
      skip := skip || qkey;
      CONTINUE WHEN n = 0;
    END IF;
    -- The turn (src/scheduler/lease.ts recordTurn). The queue's virtual time (advanced by the jobs
    -- taken / weight, a batch counts every job) and the tenant's added slots go to the arrays the
    -- next pick reads; the rows are written once for all turns, by the commit.
    n_turn := n_turn + 1;
    turn_at[n_turn] := clock_timestamp();
    IF sv_i IS NULL THEN
      sv_i := cardinality(sv_key) + 1;
      sv_key[sv_i] := qkey;
      sv_t[sv_i] := (p.q).tenant_id;
      sv_c[sv_i] := c;
      sv_v[sv_i] := vt;
    END IF;
    sv_v[sv_i] := sv_v[sv_i] + n::float8 / weff;
    m_low[p.ci] := least(m_low[p.ci], sv_v[sv_i]);
    IF tn_i IS NULL THEN
      tn_i := cardinality(tn_id) + 1;
      tn_id[tn_i] := (p.q).tenant_id;
      tn_add[tn_i] := 0;
    END IF;
    tn_add[tn_i] := tn_add[tn_i] + n;
    tn_used[tn_i] := qt.used;
    -- The class clock: the start tag of the last job served in fair order (the turn's last job,
    -- not its first; jobs beyond the quantum, an unpaced window's minimum batch, are served ahead
    -- of their turn and do not move it).
    IF NOT served ? c OR (served->>c)::float8 < vt + (least(n, f.quantum) - 1)::float8 / weff THEN
      served := jsonb_set(served, ARRAY[c], to_jsonb(vt + (least(n, f.quantum) - 1)::float8 / weff));
    END IF;
    -- The pool: a batch turn joins the call's open batch of its API while the items fit (one call,
    -- one slot, whatever tenants' items it carries), else opens one (a slot); singles take a slot
    -- each. Tokens: one per item sent (a batch's distinct inputs, of the quota's prefix).
    call_no := NULL;
    IF f.batched THEN
      dn := f.distinct_n;
      IF n < cardinality(f.ids) THEN
        SELECT count(DISTINCT d->'params')::int INTO dn FROM unnest(f.datas[1:n]) d;
      END IF;
      ob_i := array_position(ob_api, f.head_api);
      IF ob_i IS NOT NULL AND ob_items[ob_i] + dn <= least(p_batch_max, (p_batch->f.head_api->>0)::int) THEN
        ob_items[ob_i] := ob_items[ob_i] + dn;
      ELSE
        IF ob_i IS NULL THEN
          ob_i := cardinality(ob_api) + 1;
          ob_api[ob_i] := f.head_api;
        END IF;
        ob_call[ob_i] := n_turn;
        ob_items[ob_i] := dn;
        slots := slots + 1;
      END IF;
      call_no := ob_call[ob_i];
      tokens_used := tokens_used + dn;
    ELSE
      slots := slots + n;
      tokens_used := tokens_used + n;
    END IF;
    FOR i IN 1 .. n LOOP
      picks[cardinality(picks) + 1] := ROW(n_turn, i, f.ids[i], f.datas[i], (p.q).tenant_id, c, qn, qt.period, f.costs[i], f.batched, call_no)::sluice_lease_job;
      picked_ids[cardinality(picked_ids) + 1] := f.ids[i];
    END LOOP;
    taken := taken + n;
    IF f.exhausted THEN
      skip := skip || qkey;
    END IF;
  END LOOP;

  PERFORM sluice_lease_wake(p_hold);
  IF taken = 0 THEN
    RETURN;
  END IF;
  out_rows := sluice_lease_claim(picks, turn_at, p_batch, now_tokens IS NOT NULL);
  PERFORM sluice_lease_commit(p_window, p_node, p_pool, p_lease_seconds, tokens_used, out_rows, sv_key, sv_t, sv_c, sv_v, served);
  RETURN QUERY SELECT (o->>'turn')::int, (o->>'rid')::uuid, (o->>'id')::uuid, (o->>'attempt')::int, (o->>'tenant_id')::uuid, o->>'class',
      o->>'queue', o->'data', (o->>'cost')::int, (o->>'batched')::boolean, (o->>'slot')::boolean, (o->>'call')::int, 'leased'::text
    FROM jsonb_array_elements(out_rows) o;
EXCEPTION WHEN SQLSTATE 'SL409' THEN
  -- The window changed under the call: its writes are rolled back to the block's start (no rows
  -- were returned yet: they are the call's last step). Contention, so a result.
  RETURN QUERY SELECT NULL::int, NULL::uuid, NULL::uuid, NULL::int, NULL::uuid, NULL::text, NULL::text, NULL::jsonb, NULL::int,
    NULL::boolean, NULL::boolean, NULL::int, 'changed'::text;
END $function$;
