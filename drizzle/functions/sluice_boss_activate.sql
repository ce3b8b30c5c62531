-- sluice_boss_activate: pg-boss's activation of fetched jobs, exactly as its fetch does (the one
-- home of that statement: the lease's picks, and a job the lease fails for quota, which is
-- activated then completed as pg-boss would). The caller holds the rows (its fetch locked them).
-- plpgsql, not sql: pg-boss creates its schema after the migrations, and a sql function's body is
-- checked against the tables when it is created.
CREATE OR REPLACE FUNCTION sluice_boss_activate(p_names text[], p_ids uuid[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
  UPDATE pgboss.job j SET state = 'active', started_on = pgboss.job_now(), heartbeat_on = pgboss.job_now(),
      retry_count = CASE WHEN j.started_on IS NOT NULL THEN j.retry_count + 1 ELSE j.retry_count END
    FROM unnest(p_names, p_ids) p(name, id)
    WHERE j.name = p.name AND j.id = p.id;
END $function$;
