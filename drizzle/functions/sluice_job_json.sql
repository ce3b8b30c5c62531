-- sluice_job_json: a job event's payload, the JobRow shape of src/jobs/store.ts (JOB_COLUMNS'
-- names, the state as it shows by sluice_job_state, dates as ISO text; jobFromJson turns them
-- back). One function for every publisher (publishJobEvents and the settlement's own NOTIFY), so
-- an event is byte for byte the same whoever sends it; test/fanout.test.ts checks an event
-- carries what a read gives. traceParent (a traced job's W3C traceparent) is added only when
-- set, so an untraced job's event is not one byte longer (NOTIFY payloads are bounded).
CREATE OR REPLACE FUNCTION sluice_job_json(p_id uuid)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  SELECT CASE WHEN x."traceParent" IS NULL THEN to_jsonb(x) - 'traceParent' ELSE to_jsonb(x) END FROM (
    SELECT j.id, j.tenant_id AS "tenantId", j.api, j.params, j.priority, sluice_job_state(j.state, qt.quota_blocked) AS state,
      j.idempotency_key AS "idempotencyKey", j.fairness_key AS "fairnessKey", j.attempts, j.created_at AS "createdAt",
      (extract(epoch FROM j.created_at) * 1000000)::bigint::text AS "createdAtMicros", j.run_after AS "runAfter",
      j.started_at AS "startedAt", j.finished_at AS "finishedAt",
      j.result, j.error_code AS "errorCode", j.error_message AS "errorMessage",
      j.http_status AS "httpStatus", coalesce(j.credits_billed, 0) AS "creditsBilled", j.trace_parent AS "traceParent"
    FROM jobs j LEFT JOIN sched_tenants qt ON qt.tenant_id = j.tenant_id
    WHERE j.id = p_id) x
$function$;
