-- sluice_lease_head: the API of the job pg-boss's fetch would hand out first from queue p_queue,
-- jobs of p_skip_apis aside (null: none). Jobs this call picked already (p_picked) are skipped:
-- their activation waits for the end of the call, and SKIP LOCKED skips only other transactions'
-- locks. The batch turn's head (held APIs skipped) and a dormant queue's head (is it held?).
-- plpgsql, not sql: see sluice_boss_activate.
CREATE OR REPLACE FUNCTION sluice_lease_head(p_queue text, p_picked uuid[], p_skip_apis text[])
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
  head text;
BEGIN
  SELECT j.data->>'api' INTO head FROM pgboss.job j
    WHERE j.name = p_queue AND j.state < 'active' AND NOT j.blocked AND j.start_after <= pgboss.job_now()
      AND NOT ((j.data->>'api') = ANY (p_skip_apis)) AND NOT (j.id = ANY (p_picked))
    ORDER BY j.priority DESC, j.created_on LIMIT 1;
  RETURN head;
END $function$;
