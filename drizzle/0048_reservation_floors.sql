ALTER TABLE "sched_classes" ADD COLUMN "reserved_weight" numeric DEFAULT '0' NOT NULL;--> statement-breakpoint
ALTER TABLE "sched_share_deltas" ADD COLUMN "rw" numeric DEFAULT '0' NOT NULL;--> statement-breakpoint
-- The reserved tenants' backlogged weight as of now (the triggers installed next keep it), with
-- the deltas not yet folded counted in by the same sums.
UPDATE sched_classes k SET reserved_weight = coalesce(s.rw, 0)
FROM (SELECT c.class,
    (SELECT sum(t.weight) FROM sched_queues q JOIN sched_tenants t ON t.tenant_id = q.tenant_id
      WHERE q.class = c.class AND q.ready_at IS NOT NULL AND NOT q.tenant_dormant AND NOT q.scheduled AND q.held_api IS NULL
        AND t.weight > 0 AND t.reserved_share > 0) AS rw
  FROM sched_classes c) s
WHERE k.class = s.class;
