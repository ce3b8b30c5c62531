ALTER TABLE "windows" ADD COLUMN "configured_rate_per_minute" double precision;--> statement-breakpoint
ALTER TABLE "windows" ADD COLUMN "configured_burst" double precision;--> statement-breakpoint
ALTER TABLE "windows" ADD COLUMN "observed_limit_per_minute" double precision;--> statement-breakpoint
ALTER TABLE "windows" ADD COLUMN "pace_reason" text;--> statement-breakpoint
ALTER TABLE "windows" ADD COLUMN "paced_at" timestamp with time zone;