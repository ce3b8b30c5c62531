-- sluice_latency_bucket: the usage histogram's bucket for a latency in ms (src/usage/histogram.ts
-- has the same bounds). Upper bounds (the last is open): 25 50 100 250 500 1000 2500 5000 10000 30000 +inf.
CREATE OR REPLACE FUNCTION sluice_latency_bucket(ms double precision)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE
AS $function$
  SELECT CASE WHEN ms <= 25 THEN 1 WHEN ms <= 50 THEN 2 WHEN ms <= 100 THEN 3 WHEN ms <= 250 THEN 4
    WHEN ms <= 500 THEN 5 WHEN ms <= 1000 THEN 6 WHEN ms <= 2500 THEN 7 WHEN ms <= 5000 THEN 8
    WHEN ms <= 10000 THEN 9 WHEN ms <= 30000 THEN 10 ELSE 11 END;
$function$;
