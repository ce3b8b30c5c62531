-- sluice_tenant_backlogged: whether a tenant's waiting work takes part in the fair order at all:
-- a weight above zero, not suspended, not waiting for quota (its free cap aside: that is
-- sluice_tenant_eligible). The one definition the lease's walk, lock and reserved totals read.
-- IMMUTABLE and one expression: the planner inlines it (the whole-row argument becomes the
-- columns), so the queries using it keep their index plans.
CREATE OR REPLACE FUNCTION sluice_tenant_backlogged(t sched_tenants)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT t.weight > 0 AND NOT t.suspended AND NOT t.quota_blocked
$function$;
