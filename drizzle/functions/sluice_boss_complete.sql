-- sluice_boss_complete: pg-boss's completion of active jobs, as its complete does (the one home of
-- that statement: a finished job's ack in sluice_finish_jobs, a leased job cancelled before its
-- claim, a job failed for quota). Returns the jobs it completed.
-- plpgsql, not sql: see sluice_boss_activate.
CREATE OR REPLACE FUNCTION sluice_boss_complete(p_names text[], p_ids uuid[])
 RETURNS SETOF uuid
 LANGUAGE plpgsql
AS $function$
BEGIN
  RETURN QUERY UPDATE pgboss.job j SET completed_on = pgboss.job_now(), state = 'completed', output = NULL
    FROM unnest(p_names, p_ids) p(name, id)
    WHERE j.name = p.name AND j.id = p.id AND j.state = 'active'
    RETURNING j.id;
END $function$;
