CREATE TABLE "usage_deltas" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"tenant_ids" uuid[] NOT NULL,
	"period_starts" timestamp with time zone[] NOT NULL,
	"hours" timestamp with time zone[] NOT NULL,
	"apis" text[] NOT NULL,
	"classes" text[] NOT NULL,
	"calls" integer[] NOT NULL,
	"succeeded" integer[] NOT NULL,
	"failed" integer[] NOT NULL,
	"credits_billed" bigint[] NOT NULL,
	"credits_refunded" bigint[] NOT NULL,
	"latency_hists" integer[] NOT NULL
);--> statement-breakpoint
-- A row of up to 32 aggregates (about 4 KB) stays inline, uncompressed: the default target (2 KB)
-- would compress or move it to the toast table at every settlement.
ALTER TABLE "usage_deltas" SET (toast_tuple_target = 8160);
