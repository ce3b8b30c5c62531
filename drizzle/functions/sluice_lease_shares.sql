-- sluice_lease_shares: the lease's reserved-share totals at the call's start, per class of
-- p_classes (in its order): R, the backlogged reserved shares, and W, the whole backlogged weight
-- (reserved tenants' included), from each class's counters plus their unfolded deltas: never a sum
-- over queues. Read only while a reserved tenant is backlogged (in the fair index); otherwise
-- zeros, at the cost of one probe of sched_tenants' reserved index. sluice_lease's header says how
-- they raise a reserved tenant's weight.
CREATE OR REPLACE FUNCTION sluice_lease_shares(p_classes text[], OUT r double precision[], OUT w double precision[])
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
  r := array_fill(0::float8, ARRAY[cardinality(p_classes)]);
  w := array_fill(0::float8, ARRAY[cardinality(p_classes)]);
  IF EXISTS (SELECT 1 FROM sched_tenants st WHERE st.reserved_share > 0 AND sluice_tenant_backlogged(st)
      AND EXISTS (SELECT 1 FROM sched_queues sq WHERE sq.tenant_id = st.tenant_id AND sq.class = ANY (p_classes)
        AND sluice_queue_in_fair_index(sq))) THEN
    SELECT array_agg(coalesce(k.reserved_sum + (SELECT coalesce(sum(d.r), 0) FROM sched_share_deltas d WHERE d.class = k.class), 0)::float8 ORDER BY x.o),
        array_agg(coalesce(k.unreserved_weight + k.reserved_weight + (SELECT coalesce(sum(d.w + d.rw), 0) FROM sched_share_deltas d WHERE d.class = k.class), 0)::float8 ORDER BY x.o)
      INTO r, w
      FROM unnest(p_classes) WITH ORDINALITY x(c, o) LEFT JOIN sched_classes k ON k.class = x.c;
  END IF;
END $function$;
