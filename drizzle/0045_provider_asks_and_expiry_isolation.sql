ALTER TABLE "reservations" ADD COLUMN "expiry_error" text;--> statement-breakpoint
ALTER TABLE "reservations" ADD COLUMN "expiry_failed_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "windows" ADD COLUMN "capped_ask_seconds" double precision;--> statement-breakpoint
ALTER TABLE "windows" ADD COLUMN "capped_ask_at" timestamp with time zone;--> statement-breakpoint
CREATE INDEX "job_results_attempt_lost_idx" ON "job_results" USING btree ("updated_at") WHERE "job_results"."error_code" = 'ATTEMPT_LOST';--> statement-breakpoint
CREATE INDEX "jobs_waiting_created_idx" ON "jobs" USING btree ("created_at","id") WHERE "jobs"."state" in ('QUEUED', 'WAITING_QUOTA');