-- sluice_tenant_eligible: whether a tenant may take a turn now: backlogged (sluice_tenant_backlogged)
-- and below its cap, counting p_added slots a lease call has taken for it but not written yet.
-- The one definition of a tenant's eligibility (the lease's walk, its merge of served queues, its
-- locks, the next queue's re-read). Inlined by the planner, as sluice_tenant_backlogged.
CREATE OR REPLACE FUNCTION sluice_tenant_eligible(t sched_tenants, p_added integer)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT sluice_tenant_backlogged(t) AND t.in_flight + p_added < t.cap
$function$;
