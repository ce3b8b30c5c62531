CREATE TABLE "account_state" (
	"id" integer PRIMARY KEY DEFAULT 1 NOT NULL,
	"dispatch_stopped_until" timestamp with time zone,
	"stop_reason" text,
	"credits_remaining" bigint,
	"max_credits" bigint,
	"renewal_at" timestamp with time zone,
	"status_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "alerts" (
	"id" uuid PRIMARY KEY NOT NULL,
	"key" text NOT NULL,
	"severity" text NOT NULL,
	"message" text NOT NULL,
	"raised_at" timestamp with time zone DEFAULT now() NOT NULL,
	"cleared_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "breakers" (
	"api" text PRIMARY KEY NOT NULL,
	"state" text DEFAULT 'CLOSED' NOT NULL,
	"opened_at" timestamp with time zone,
	"retry_at" timestamp with time zone,
	"failures" integer DEFAULT 0 NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "sched_queues" ADD COLUMN "depth" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE UNIQUE INDEX "alerts_active_key" ON "alerts" USING btree ("key") WHERE "alerts"."cleared_at" is null;--> statement-breakpoint
CREATE INDEX "jobs_tenant_queued_age_idx" ON "jobs" USING btree ("tenant_id","priority","created_at") WHERE "jobs"."state" in ('QUEUED', 'WAITING_QUOTA');