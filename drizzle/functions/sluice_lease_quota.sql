-- sluice_lease_quota: the lease's quota check for one turn (src/scheduler/lease.ts applyQuota):
-- the prefix of the fetched jobs (p_ids, credits p_costs) that fits on top of what the tenant's
-- period has billed and the tenant holds reserved (p_used, what this call counted already, or null:
-- the period's ledger row and the tenant's row, which cannot change under us, as every writer of
-- them holds the tenant's row, as we do). Credits still reserved from the last period count against
-- this one until they settle: a turn of the period is never a way past the quota. Returns the
-- prefix's length, the period and its use with the prefix.
--
-- The first job that does not fit: with policy FAIL it fails with QUOTA_EXCEEDED without running
-- (activated and acknowledged in pg-boss as a fetch and a complete would; its final state, result
-- and ack by sluice_finish_jobs; its event by sluice_job_events); the others stay queued. With WAIT
-- the tenant waits for quota, visibly: its queues go dormant (out of the fair index; the renewal
-- brings them back at the class clock). O(1) whatever the backlog: the flag changes, its jobs stay
-- QUEUED and show WAITING_QUOTA while it is set (sluice_job_state), and one tenant-wide event (no
-- jobId, "allWaiting") tells subscribers their waiting jobs changed. Only the queue rows free now
-- are marked: a row another transaction holds stays in the index, and is not picked while the
-- tenant is blocked. (The failed job's depth trigger updates the turn's queue row: the caller's.)
CREATE OR REPLACE FUNCTION sluice_lease_quota(p_tenant sched_tenants, p_queue text, p_ids uuid[], p_costs integer[], p_used bigint, OUT fit integer, OUT used bigint, OUT period timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
  over_id uuid;
BEGIN
  period := sluice_quota_period(p_tenant.period_anchor, now());
  used := p_used;
  IF used IS NULL THEN
    SELECT l.billed INTO used FROM tenant_ledger l WHERE l.tenant_id = p_tenant.tenant_id AND l.period_start = period;
    used := coalesce(used, 0) + p_tenant.reserved;
  END IF;
  fit := 0;
  FOR i IN 1 .. cardinality(p_costs) LOOP
    EXIT WHEN used + p_costs[i] > p_tenant.quota;
    used := used + p_costs[i];
    fit := i;
  END LOOP;
  IF fit = cardinality(p_ids) THEN
    RETURN;
  END IF;
  over_id := p_ids[fit + 1];
  IF p_tenant.quota_policy = 'FAIL' THEN
    PERFORM sluice_boss_activate(ARRAY[p_queue], ARRAY[over_id]);
    IF EXISTS (SELECT 1 FROM sluice_finish_jobs(jsonb_build_array(jsonb_build_object('id', over_id, 'attempt', NULL, 'state', 'FAILED',
        'queue', p_queue, 'data', NULL, 'error_code', 'QUOTA_EXCEEDED', 'http_status', NULL,
        'error_message', format('the tenant''s monthly credit quota has no room for this job (%s credits)', p_costs[fit + 1]))))) THEN
      PERFORM sluice_job_events(jsonb_build_array(jsonb_build_object('jobId', over_id, 'tenantId', p_tenant.tenant_id, 'state', 'FAILED')));
    ELSE
      -- Cancelled meanwhile: only acknowledged.
      PERFORM sluice_boss_complete(ARRAY[p_queue], ARRAY[over_id]);
    END IF;
  ELSE
    UPDATE sched_tenants SET quota_blocked = true, quota_blocked_cost = p_costs[fit + 1] WHERE sched_tenants.tenant_id = p_tenant.tenant_id;
    PERFORM sluice_job_events(jsonb_build_array(jsonb_build_object('tenantId', p_tenant.tenant_id, 'state', 'WAITING_QUOTA', 'allWaiting', true)));
    UPDATE sched_queues sq SET tenant_dormant = true
      FROM (SELECT l.tenant_id, l.class FROM sched_queues l WHERE l.tenant_id = p_tenant.tenant_id ORDER BY l.class FOR UPDATE SKIP LOCKED) l
      WHERE sq.tenant_id = l.tenant_id AND sq.class = l.class;
  END IF;
END $function$;
