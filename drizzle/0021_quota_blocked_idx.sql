-- Issue 9, nothing that runs every second reads every tenant's row. The sweeper looks for
-- quota-blocked tenants it can release each round (sched/store.ts unblockableTenants): a scan of
-- all of sched_tenants (27 ms a round with 100,000 tenants registered). A partial index holds only
-- the blocked ones; the in-flight updates of the hot path leave quota_blocked alone, so they stay
-- heap-only updates.
CREATE INDEX "sched_tenants_quota_blocked_idx" ON "sched_tenants" USING btree ("tenant_id") WHERE "quota_blocked";
