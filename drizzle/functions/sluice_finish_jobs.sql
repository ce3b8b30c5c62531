-- sluice_finish_jobs: many attempts' jobs finished in ONE statement. Each is fenced by its attempt
-- (RUNNING on that attempt), or, with a null attempt, by still waiting (QUEUED or WAITING_QUOTA: a
-- job the lease fails for quota without running it); only those it finished get their result (on
-- the jobs row, in the update that finishes it: one write per job) and their pg-boss ack
-- (sluice_boss_complete), in the same transaction (I6). Lock order: jobs, pgboss.job (as
-- pg-boss's complete).
-- items: [{"id", "attempt", "state", "queue", "data", "error_code", "error_message", "http_status", "billed"}, ...]
-- "billed" (absent: 0) is what the caller's settlement, in this statement, billed for the job's
-- reservations (sluice_settle_group): added to the job's creditsBilled in the same write, so a
-- settled job's row is written once; the ledger moved by the same credits (I11). Nothing else is
-- billed here.
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
      error_message text, http_status int, billed int)),
  f AS (
    UPDATE jobs j SET state = x.state, finished_at = now(), updated_at = now(),
      result = x.data, error_code = x.error_code, error_message = x.error_message, http_status = x.http_status,
      credits_billed = nullif(coalesce(j.credits_billed, 0) + coalesce(x.billed, 0), 0)
    FROM x WHERE j.id = x.id
      AND (j.state = 'RUNNING' AND j.attempts = x.attempt OR x.attempt IS NULL AND j.state IN ('QUEUED', 'WAITING_QUOTA'))
    RETURNING j.id)
  SELECT coalesce(array_agg(x.id), '{}'), coalesce(array_agg(x.queue), '{}') INTO ids, queues FROM x JOIN f ON f.id = x.id;
  PERFORM sluice_boss_complete(queues, ids);
  RETURN QUERY SELECT unnest(ids);
END $function$;
