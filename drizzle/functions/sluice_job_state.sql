-- sluice_job_state: the state a job shows (GraphQL Job.state, filters by state, counts), from the
-- state stored in jobs and whether its tenant is quota-blocked (sched_tenants.quota_blocked): a
-- QUEUED job of a blocked tenant shows WAITING_QUOTA. A quota wait changes the tenant's flag and
-- not its jobs, so the lease blocks a tenant in O(1) whatever its backlog; src/jobs/store.ts
-- visibleJobState is the same mapping for TypeScript. (A WAITING_QUOTA stored by an older version
-- shows as it is.) IMMUTABLE and one expression: the planner inlines it.
CREATE OR REPLACE FUNCTION sluice_job_state(p_state text, p_quota_blocked boolean)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT CASE WHEN p_state = 'QUEUED' AND coalesce(p_quota_blocked, false) THEN 'WAITING_QUOTA' ELSE p_state END
$function$;
