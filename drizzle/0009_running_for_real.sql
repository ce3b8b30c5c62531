-- Issue 13, "running it for real": tenant lifecycle, a RUNNING counter, usage history, retention indexes.
--
-- Tenant lifecycle: a suspended tenant's submissions are refused and dispatch skips it
-- (sched_tenants.suspended is the scheduler's copy, read by the candidate query and the slot claim).
ALTER TABLE "tenants" ADD COLUMN "suspended_at" timestamp with time zone;
--> statement-breakpoint
ALTER TABLE "sched_tenants" ADD COLUMN "suspended" boolean DEFAULT false NOT NULL;
--> statement-breakpoint
-- RUNNING per (tenant, class), kept like depth: statement-level triggers on jobs (their own functions,
-- so migration 0004's depth functions stay as they are), in the same transaction as every state change.
-- A scrape or a systemStatus push reads the counter instead of counting RUNNING rows.
-- The triggers only INSERT deltas: updating sched_queues there would lock it in the settlement after
-- `windows` (a job leaving RUNNING), while a lease locks sched_queues (claim) before `windows`, and
-- the two would deadlock. The sweeper folds the deltas into sched_queues.running every round
-- (sluice_fold_running); readers add the counter and the unfolded deltas.
ALTER TABLE "sched_queues" ADD COLUMN "running" integer DEFAULT 0 NOT NULL;
--> statement-breakpoint
CREATE TABLE "sched_running_deltas" (
	"tenant_id" uuid NOT NULL,
	"class" text NOT NULL,
	"n" integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX "sched_running_deltas_idx" ON "sched_running_deltas" USING btree ("tenant_id","class");
--> statement-breakpoint
-- One folder at a time (an advisory lock): two folds updating the same rows in different orders could deadlock.
CREATE FUNCTION sluice_fold_running() RETURNS int LANGUAGE plpgsql AS $$
DECLARE folded int := 0;
BEGIN
  IF NOT pg_try_advisory_xact_lock(7564291) THEN RETURN 0; END IF;
  WITH d AS (DELETE FROM sched_running_deltas RETURNING tenant_id, class, n),
    g AS (SELECT tenant_id, class, sum(n)::int AS n, count(*)::int AS c FROM d GROUP BY tenant_id, class),
    u AS (UPDATE sched_queues q SET running = greatest(0, q.running + g.n) FROM g WHERE q.tenant_id = g.tenant_id AND q.class = g.class RETURNING 1)
  SELECT coalesce(sum(c), 0) INTO folded FROM g;
  RETURN folded;
END $$;
--> statement-breakpoint
-- Direct inserts from the transition tables (no jsonb, no function call): this runs in every lease and settlement.
CREATE FUNCTION sluice_jobs_running_upd() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO sched_running_deltas (tenant_id, class, n)
  SELECT tenant_id, priority, sum(n) FROM (
    SELECT tenant_id, priority, 1 AS n FROM new_rows WHERE state = 'RUNNING'
    UNION ALL
    SELECT tenant_id, priority, -1 FROM old_rows WHERE state = 'RUNNING'
  ) c GROUP BY tenant_id, priority HAVING sum(n) <> 0;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE FUNCTION sluice_jobs_running_del() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO sched_running_deltas (tenant_id, class, n)
  SELECT tenant_id, priority, -count(*) FROM old_rows WHERE state = 'RUNNING' GROUP BY tenant_id, priority;
  RETURN NULL;
END $$;
--> statement-breakpoint
-- Jobs are never inserted RUNNING, so there is no insert trigger.
CREATE TRIGGER jobs_running_upd AFTER UPDATE ON jobs REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_running_upd();
--> statement-breakpoint
CREATE TRIGGER jobs_running_del AFTER DELETE ON jobs REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_jobs_running_del();
--> statement-breakpoint
UPDATE sched_queues q SET running = coalesce((
  SELECT count(*) FROM jobs j WHERE j.tenant_id = q.tenant_id AND j.priority = q.class AND j.state = 'RUNNING'), 0);
--> statement-breakpoint
-- Usage history (I10: history equals the ledger). Hourly aggregates per tenant, ledger period, API and class.
-- No foreign key to tenants: history outlives a deleted tenant and retention of its jobs.
-- latency_hist counts settled attempts per latency bucket (src/usage/histogram.ts names the bounds).
CREATE TABLE "usage_hourly" (
	"tenant_id" uuid NOT NULL,
	"period_start" timestamp with time zone NOT NULL,
	"hour" timestamp with time zone NOT NULL,
	"api" text NOT NULL,
	"class" text NOT NULL,
	"calls" integer DEFAULT 0 NOT NULL,
	"succeeded" integer DEFAULT 0 NOT NULL,
	"failed" integer DEFAULT 0 NOT NULL,
	"credits_billed" bigint DEFAULT 0 NOT NULL,
	"credits_refunded" bigint DEFAULT 0 NOT NULL,
	"latency_hist" integer[] NOT NULL,
	CONSTRAINT "usage_hourly_pk" PRIMARY KEY("tenant_id","hour","period_start","api","class")
);
--> statement-breakpoint
-- Settlements append here (insert only: no row a concurrent settlement could also lock, so no new
-- lock order and no deadlock); the sweeper folds them into usage_hourly. Readers add both.
CREATE TABLE "usage_deltas" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"tenant_id" uuid NOT NULL,
	"period_start" timestamp with time zone NOT NULL,
	"hour" timestamp with time zone NOT NULL,
	"api" text NOT NULL,
	"class" text NOT NULL,
	"calls" integer NOT NULL,
	"succeeded" integer NOT NULL,
	"failed" integer NOT NULL,
	"credits_billed" bigint NOT NULL,
	"credits_refunded" bigint NOT NULL,
	"latency_hist" integer[] NOT NULL
);
--> statement-breakpoint
CREATE INDEX "usage_deltas_tenant_hour_idx" ON "usage_deltas" USING btree ("tenant_id","hour");
--> statement-breakpoint
-- Bucket upper bounds in ms (the last is open): 25 50 100 250 500 1000 2500 5000 10000 30000 +inf.
CREATE FUNCTION sluice_latency_bucket(ms double precision) RETURNS int LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN ms <= 25 THEN 1 WHEN ms <= 50 THEN 2 WHEN ms <= 100 THEN 3 WHEN ms <= 250 THEN 4
    WHEN ms <= 500 THEN 5 WHEN ms <= 1000 THEN 6 WHEN ms <= 2500 THEN 7 WHEN ms <= 5000 THEN 8
    WHEN ms <= 10000 THEN 9 WHEN ms <= 30000 THEN 10 ELSE 11 END;
$$;
--> statement-breakpoint
-- Every settlement (reservation settled_at null → set, by any statement: the dispatcher's, a grouped
-- one, the sweeper's crash settlement) appends its aggregate in the settling transaction. Latency is
-- the reservation's life (lease to settlement), the closest measure a reservation row carries.
CREATE FUNCTION sluice_reservations_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WITH s AS (
    SELECT n.tenant_id, n.period_start, date_trunc('hour', n.settled_at, 'UTC') AS hour,
      coalesce(j.api, 'unknown') AS api, coalesce(j.priority, 'UNKNOWN') AS class, n.outcome,
      coalesce(n.billed, 0)::bigint AS billed, n.credits::bigint AS credits,
      sluice_latency_bucket(extract(epoch FROM n.settled_at - n.created_at) * 1000) AS b
    FROM new_rows n JOIN old_rows o ON o.id = n.id
    LEFT JOIN jobs j ON j.id = n.job_id
    WHERE o.settled_at IS NULL AND n.settled_at IS NOT NULL)
  INSERT INTO usage_deltas (tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist)
  SELECT tenant_id, period_start, hour, api, class, count(*), count(*) FILTER (WHERE outcome = 'billed'),
    count(*) FILTER (WHERE outcome IS DISTINCT FROM 'billed'), sum(billed), sum(credits - billed),
    ARRAY[count(*) FILTER (WHERE b = 1), count(*) FILTER (WHERE b = 2), count(*) FILTER (WHERE b = 3), count(*) FILTER (WHERE b = 4), count(*) FILTER (WHERE b = 5), count(*) FILTER (WHERE b = 6), count(*) FILTER (WHERE b = 7), count(*) FILTER (WHERE b = 8), count(*) FILTER (WHERE b = 9), count(*) FILTER (WHERE b = 10), count(*) FILTER (WHERE b = 11)]::int[]
  FROM s GROUP BY tenant_id, period_start, hour, api, class;
  RETURN NULL;
END $$;
--> statement-breakpoint
CREATE TRIGGER reservations_usage AFTER UPDATE ON reservations REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION sluice_reservations_usage();
--> statement-breakpoint
-- History for settlements made before this migration, so history equals the ledger from the start.
INSERT INTO usage_hourly (tenant_id, period_start, hour, api, class, calls, succeeded, failed, credits_billed, credits_refunded, latency_hist)
SELECT n.tenant_id, n.period_start, date_trunc('hour', n.settled_at, 'UTC'), coalesce(j.api, 'unknown'), coalesce(j.priority, 'UNKNOWN'),
  count(*), count(*) FILTER (WHERE n.outcome = 'billed'), count(*) FILTER (WHERE n.outcome IS DISTINCT FROM 'billed'),
  sum(coalesce(n.billed, 0)), sum(n.credits - coalesce(n.billed, 0)),
  array_fill(0, ARRAY[11])
FROM reservations n LEFT JOIN jobs j ON j.id = n.job_id WHERE n.settled_at IS NOT NULL
GROUP BY 1, 2, 3, 4, 5;
--> statement-breakpoint
-- Retention (src/retention/): finished jobs, settled reservations and cleared alerts by age, in small batches.
CREATE INDEX "jobs_finished_idx" ON "jobs" USING btree ("finished_at") WHERE "jobs"."state" in ('SUCCEEDED', 'FAILED', 'CANCELLED');
--> statement-breakpoint
CREATE INDEX "reservations_settled_idx" ON "reservations" USING btree ("settled_at") WHERE "reservations"."settled_at" is not null;
--> statement-breakpoint
CREATE INDEX "alerts_cleared_idx" ON "alerts" USING btree ("cleared_at") WHERE "alerts"."cleared_at" is not null;
