CREATE TABLE "sched_fair_keys" (
	"tenant_id" uuid NOT NULL,
	"class" text NOT NULL,
	"fairness_key" text NOT NULL,
	"last_rank" integer NOT NULL,
	"last_job" uuid NOT NULL,
	CONSTRAINT "sched_fair_keys_tenant_id_class_fairness_key_pk" PRIMARY KEY("tenant_id","class","fairness_key")
);
--> statement-breakpoint
ALTER TABLE "jobs" ADD COLUMN "fairness_key" text;--> statement-breakpoint
ALTER TABLE "sched_fair_keys" ADD CONSTRAINT "sched_fair_keys_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
-- sluice_job_json: a job event's payload, the JobRow shape of src/jobs/store.ts (JOB_COLUMNS'
-- names, dates as ISO text; jobFromJson turns them back). One function for every publisher
-- (publishJobEvents and the settlement's own NOTIFY), so an event is byte for byte the same
-- whoever sends it; test/fanout.test.ts checks an event carries what a read gives.
CREATE OR REPLACE FUNCTION sluice_job_json(p_id uuid)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  SELECT to_jsonb(x) FROM (
    SELECT j.id, j.tenant_id AS "tenantId", j.api, j.params, j.priority, j.state,
      j.idempotency_key AS "idempotencyKey", j.fairness_key AS "fairnessKey", j.attempts, j.created_at AS "createdAt",
      (extract(epoch FROM j.created_at) * 1000000)::bigint::text AS "createdAtMicros", j.run_after AS "runAfter",
      j.started_at AS "startedAt", j.finished_at AS "finishedAt",
      r.data AS result, r.error_code AS "errorCode", r.error_message AS "errorMessage",
      r.http_status AS "httpStatus", coalesce(r.credits_billed, 0) AS "creditsBilled"
    FROM jobs j LEFT JOIN job_results r ON r.job_id = j.id WHERE j.id = p_id) x
$function$;
