CREATE TABLE "nodes" (
	"id" uuid PRIMARY KEY NOT NULL,
	"role" text NOT NULL,
	"pid" integer NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"heartbeat_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "reservations" (
	"id" uuid PRIMARY KEY NOT NULL,
	"job_id" uuid NOT NULL,
	"attempt" integer NOT NULL,
	"tenant_id" uuid NOT NULL,
	"period_start" timestamp with time zone NOT NULL,
	"window" text NOT NULL,
	"node_id" uuid NOT NULL,
	"credits" integer NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"settled_at" timestamp with time zone,
	"billed" integer,
	"outcome" text
);
--> statement-breakpoint
CREATE TABLE "sched_classes" (
	"class" text PRIMARY KEY NOT NULL,
	"clock" double precision DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE TABLE "sched_queues" (
	"tenant_id" uuid NOT NULL,
	"class" text NOT NULL,
	"vtime" double precision DEFAULT 0 NOT NULL,
	"ready_at" timestamp with time zone,
	CONSTRAINT "sched_queues_tenant_id_class_pk" PRIMARY KEY("tenant_id","class")
);
--> statement-breakpoint
CREATE TABLE "sched_tenants" (
	"tenant_id" uuid PRIMARY KEY NOT NULL,
	"weight" integer NOT NULL,
	"cap" integer NOT NULL,
	"quota" bigint NOT NULL,
	"quota_policy" text NOT NULL,
	"period_anchor" timestamp with time zone NOT NULL,
	"in_flight" integer DEFAULT 0 NOT NULL,
	"quota_blocked" boolean DEFAULT false NOT NULL,
	"quota_blocked_cost" integer DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE TABLE "tenant_ledger" (
	"tenant_id" uuid NOT NULL,
	"period_start" timestamp with time zone NOT NULL,
	"billed" bigint DEFAULT 0 NOT NULL,
	"reserved" bigint DEFAULT 0 NOT NULL,
	"refunded" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "tenant_ledger_tenant_id_period_start_pk" PRIMARY KEY("tenant_id","period_start")
);
--> statement-breakpoint
CREATE TABLE "windows" (
	"name" text PRIMARY KEY NOT NULL,
	"rate_per_minute" double precision,
	"burst" double precision NOT NULL,
	"tokens" double precision NOT NULL,
	"refilled_at" timestamp with time zone DEFAULT now() NOT NULL,
	"paused_until" timestamp with time zone,
	"pause_reason" text,
	"in_flight" integer DEFAULT 0 NOT NULL,
	"pool_size" integer DEFAULT 1 NOT NULL,
	"latency_p50_ms" double precision,
	"latency_p95_ms" double precision,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "jobs" DROP CONSTRAINT "jobs_state_check";--> statement-breakpoint
DROP INDEX "jobs_queued_idx";--> statement-breakpoint
ALTER TABLE "jobs" ADD COLUMN "run_after" timestamp with time zone DEFAULT now() NOT NULL;--> statement-breakpoint
ALTER TABLE "sched_queues" ADD CONSTRAINT "sched_queues_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "sched_tenants" ADD CONSTRAINT "sched_tenants_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "tenant_ledger" ADD CONSTRAINT "tenant_ledger_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "reservations_open_idx" ON "reservations" USING btree ("node_id") WHERE "reservations"."settled_at" is null;--> statement-breakpoint
CREATE INDEX "reservations_job_idx" ON "reservations" USING btree ("job_id");--> statement-breakpoint
CREATE INDEX "sched_queues_busy_idx" ON "sched_queues" USING btree ("class","vtime") WHERE "sched_queues"."ready_at" is not null;--> statement-breakpoint
CREATE INDEX "jobs_queued_age_idx" ON "jobs" USING btree ("priority","created_at") WHERE "jobs"."state" = 'QUEUED';--> statement-breakpoint
CREATE INDEX "jobs_queued_idx" ON "jobs" USING btree ("tenant_id","priority","run_after") WHERE "jobs"."state" = 'QUEUED';--> statement-breakpoint
ALTER TABLE "jobs" ADD CONSTRAINT "jobs_state_check" CHECK ("jobs"."state" in ('QUEUED', 'WAITING_QUOTA', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'));