-- Issue 9, the hot path's statements look rows up by key, whatever the planner guesses.
--
-- The set-based statements of the lease and the settlement join a jsonb list (jsonb_to_recordset,
-- jsonb_array_elements, unnest of the call's arrays) with a table: the jobs a group finishes, the
-- tenants and ledger rows it bills, the queues whose depth a claim moves. The planner cannot see
-- how long the list is and guesses 100 rows; 100 index lookups then cost more on paper than one
-- sequential scan of a small table, so it hashed the list against a scan of the whole table.
-- Measured in the dispatch bench with 10,000 tenants of 2 jobs (auto_explain, statements over
-- 4 ms): 286 of the settlement's job updates read all 20,000 `jobs` rows to finish 15-100;
-- 254 tenant locks and in-flight updates read all 10,000 `sched_tenants` rows for ~15; 143 depth
-- updates read all 30,000 `sched_queues` rows for ~24 (~0.3 ms a queue). The cost of a lease and a
-- settlement grew with the number of tenants registered and of jobs kept, not with their own rows.
--
-- These functions run with enable_seqscan = off (a function's SET applies to everything it runs,
-- the triggers its statements fire included): every lookup by key takes the index. A statement
-- with no index to use still scans (the setting only prices a scan out when another path exists).
-- The trigger functions that ingest fires outside them (the depth delta, the tenant check) carry
-- the setting themselves.
ALTER FUNCTION sluice_lease(text, uuid, int, int, int, text[], int, jsonb, text[], jsonb, int, int) SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_settle_group(jsonb) SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_settle(jsonb) SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_finish_jobs(jsonb) SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_job_events(jsonb) SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_fold_running() SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_apply_depth_delta(jsonb) SET enable_seqscan = off;
--> statement-breakpoint
ALTER FUNCTION sluice_jobs_tenant_check() SET enable_seqscan = off;
