ALTER TABLE "sched_queues" ADD COLUMN "fair_last_rank" integer;--> statement-breakpoint
ALTER TABLE "sched_queues" ADD COLUMN "fair_last_job" uuid;--> statement-breakpoint
-- The default key's rows move from sched_fair_keys onto their queue's row.
UPDATE "sched_queues" q SET "fair_last_rank" = f."last_rank", "fair_last_job" = f."last_job"
  FROM "sched_fair_keys" f
  WHERE f."tenant_id" = q."tenant_id" AND f."class" = q."class" AND f."fairness_key" = '';--> statement-breakpoint
DELETE FROM "sched_fair_keys" WHERE "fairness_key" = '';
