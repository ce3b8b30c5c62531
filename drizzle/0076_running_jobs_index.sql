ALTER TABLE "sched_running_deltas" DISABLE ROW LEVEL SECURITY;--> statement-breakpoint
DROP TABLE "sched_running_deltas" CASCADE;--> statement-breakpoint
ALTER TABLE "sched_queues" DROP CONSTRAINT "sched_queues_running_check";--> statement-breakpoint
CREATE INDEX "jobs_running_idx" ON "jobs" USING btree ("tenant_id","priority") WHERE "jobs"."state" = 'RUNNING';--> statement-breakpoint
ALTER TABLE "sched_queues" DROP COLUMN "running";