ALTER TABLE "jobs" ADD COLUMN "result" jsonb;--> statement-breakpoint
ALTER TABLE "jobs" ADD COLUMN "error_code" text;--> statement-breakpoint
ALTER TABLE "jobs" ADD COLUMN "error_message" text;--> statement-breakpoint
ALTER TABLE "jobs" ADD COLUMN "http_status" integer;--> statement-breakpoint
ALTER TABLE "jobs" ADD COLUMN "credits_billed" integer;--> statement-breakpoint
-- The results move onto their jobs' rows (one write per finished job instead of two). The copy
-- changes no state: the jobs' triggers (depth, running, webhooks) find nothing to do.
UPDATE "jobs" j SET "result" = r."data", "error_code" = r."error_code", "error_message" = r."error_message",
  "http_status" = r."http_status", "credits_billed" = nullif(r."credits_billed", 0)
  FROM "job_results" r WHERE r."job_id" = j."id";--> statement-breakpoint
ALTER TABLE "job_results" DISABLE ROW LEVEL SECURITY;--> statement-breakpoint
DROP TABLE "job_results" CASCADE;--> statement-breakpoint
CREATE INDEX "jobs_attempt_lost_idx" ON "jobs" USING btree ("finished_at") WHERE "jobs"."error_code" = 'ATTEMPT_LOST';
