-- sluice_finish_jobs: many attempts' jobs finished in ONE statement. Each is fenced by its attempt
-- (RUNNING on that attempt), or, with a null attempt, by still waiting (QUEUED or WAITING_QUOTA: a
-- job the lease fails for quota without running it); only those it finished get their result and
-- their pg-boss ack (sluice_boss_complete), in the same transaction (I6). Lock order: jobs,
-- job_results, pgboss.job (as pg-boss's complete).
-- items: [{"id", "attempt", "state", "queue", "data", "error_code", "error_message", "http_status", "attempts"}, ...]
-- The result's creditsBilled is not written here: sluice_settle adds what it bills, whichever path
-- settles, so the job's bill cannot drift from the ledger.
CREATE OR REPLACE FUNCTION sluice_finish_jobs(items jsonb)
 RETURNS SETOF uuid
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
  ids uuid[];
  queues text[];
BEGIN
  WITH x AS (
    SELECT * FROM jsonb_to_recordset(items) AS x(id uuid, attempt int, state text, queue text, data jsonb, error_code text,
      error_message text, http_status int, attempts int)),
  f AS (
    UPDATE jobs j SET state = x.state, finished_at = now(), updated_at = now()
    FROM x WHERE j.id = x.id
      AND (j.state = 'RUNNING' AND j.attempts = x.attempt OR x.attempt IS NULL AND j.state IN ('QUEUED', 'WAITING_QUOTA'))
    RETURNING j.id),
  r AS (
    INSERT INTO job_results (job_id, data, error_code, error_message, http_status, attempts)
    SELECT x.id, x.data, x.error_code, x.error_message, x.http_status, x.attempts FROM x JOIN f ON f.id = x.id
    ON CONFLICT (job_id) DO UPDATE SET
      data = excluded.data, error_code = excluded.error_code, error_message = excluded.error_message,
      http_status = excluded.http_status, attempts = excluded.attempts, updated_at = now()
    RETURNING job_id)
  -- r runs to completion whether read or not (data-modifying WITH).
  SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.queue), '{}') INTO ids, queues FROM x JOIN f ON f.id = x.id;
  PERFORM sluice_boss_complete(queues, ids);
  RETURN QUERY SELECT unnest(ids);
END $function$;
