CREATE TABLE "sched_share_deltas" (
	"class" text NOT NULL,
	"r" numeric NOT NULL,
	"w" numeric NOT NULL
);
--> statement-breakpoint
DROP INDEX "sched_queues_fair_idx";--> statement-breakpoint
ALTER TABLE "sched_classes" ADD COLUMN "reserved_sum" numeric DEFAULT '0' NOT NULL;--> statement-breakpoint
ALTER TABLE "sched_classes" ADD COLUMN "unreserved_weight" numeric DEFAULT '0' NOT NULL;--> statement-breakpoint
ALTER TABLE "sched_queues" ADD COLUMN "tenant_dormant" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "sched_queues" ADD COLUMN "scheduled" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "sched_queues" ADD COLUMN "held_api" text;--> statement-breakpoint
CREATE INDEX "sched_share_deltas_idx" ON "sched_share_deltas" USING btree ("class");--> statement-breakpoint
CREATE INDEX "sched_queues_due_idx" ON "sched_queues" USING btree ("ready_at") WHERE "sched_queues"."scheduled";--> statement-breakpoint
CREATE INDEX "sched_queues_held_idx" ON "sched_queues" USING btree ("held_api") WHERE "sched_queues"."held_api" is not null;--> statement-breakpoint
CREATE INDEX "sched_queues_fair_idx" ON "sched_queues" USING btree ("class","vtime","tenant_id") WHERE "sched_queues"."ready_at" is not null and not "sched_queues"."tenant_dormant" and not "sched_queues"."scheduled" and "sched_queues"."held_api" is null;--> statement-breakpoint
-- Dormant work leaves the fair index: the tenants' suspension and quota blocks copied to their
-- queues, and queues marked for later marked scheduled (the lease's due check wakes them).
UPDATE sched_queues q SET tenant_dormant = true FROM sched_tenants t WHERE t.tenant_id = q.tenant_id AND (t.suspended OR t.quota_blocked);--> statement-breakpoint
UPDATE sched_queues SET scheduled = true WHERE ready_at > now();--> statement-breakpoint
-- The reserved-shares counters as of now; the triggers of the next migration keep them.
UPDATE sched_classes k SET reserved_sum = coalesce(s.r, 0), unreserved_weight = coalesce(s.w, 0)
FROM (SELECT c.class,
    (SELECT sum(t.reserved_share::numeric) FROM sched_queues q JOIN sched_tenants t ON t.tenant_id = q.tenant_id
      WHERE q.class = c.class AND q.ready_at IS NOT NULL AND NOT q.tenant_dormant AND NOT q.scheduled AND q.held_api IS NULL
        AND t.weight > 0 AND t.reserved_share > 0) AS r,
    (SELECT sum(t.weight) FROM sched_queues q JOIN sched_tenants t ON t.tenant_id = q.tenant_id
      WHERE q.class = c.class AND q.ready_at IS NOT NULL AND NOT q.tenant_dormant AND NOT q.scheduled AND q.held_api IS NULL
        AND t.weight > 0 AND NOT t.reserved_share > 0) AS w
  FROM sched_classes c) s
WHERE s.class = k.class;
