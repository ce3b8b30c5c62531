-- sluice_quota_period: the quota period containing now (tenants/policy.ts quotaPeriod): monthly
-- from the anchor, in UTC, the day clamped to the month's last day.
CREATE OR REPLACE FUNCTION sluice_quota_period(anchor timestamp with time zone, at timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
  a timestamp := anchor AT TIME ZONE 'UTC';
  n timestamp := at AT TIME ZONE 'UTC';
  months int := (extract(year FROM n)::int - extract(year FROM a)::int) * 12 + (extract(month FROM n)::int - extract(month FROM a)::int);
BEGIN
  IF a + make_interval(months => months) > n THEN months := months - 1; END IF;
  months := greatest(0, months);
  RETURN (a + make_interval(months => months)) AT TIME ZONE 'UTC';
END $function$;
