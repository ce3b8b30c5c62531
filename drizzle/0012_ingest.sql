-- Issue 11, the front door at full speed.
--
-- 1. The idempotency index covers only keyed jobs: a keyless job (every job of a bulk ingest, most
--    single submissions) no longer adds an entry to a unique btree whose NULL keys never conflict.
--    The insert's ON CONFLICT names the same predicate (jobs/store.ts).
DROP INDEX IF EXISTS "jobs_tenant_idempotency_key";
--> statement-breakpoint
CREATE UNIQUE INDEX "jobs_tenant_idempotency_key" ON "jobs" USING btree ("tenant_id","idempotency_key") WHERE "idempotency_key" IS NOT NULL;
--> statement-breakpoint
-- 2. admission_reservations: room a large keyless submitJobs has been admitted into under the
--    gate, before its jobs are written outside it (jobs/service.ts). One row per (reservation,
--    class). A row counts against the tenant bound and the global bound (admission/store.ts) from
--    the gate transaction that creates it until it is deleted: by the insert transaction that
--    writes its jobs (so room turns into depth atomically), or, when that never came (a crash), by
--    the sweeper once `expires_at` passed. Only those two delete rows, each under a row lock, so a
--    reservation is either consumed by its jobs or reclaimed, never both.
CREATE TABLE "admission_reservations" (
	"id" uuid NOT NULL,
	"class" text NOT NULL,
	"tenant_id" uuid NOT NULL REFERENCES "tenants"("id") ON DELETE CASCADE,
	"jobs" integer NOT NULL CHECK ("jobs" > 0),
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	PRIMARY KEY ("id", "class"),
	CHECK ("class" in ('INTERACTIVE', 'STANDARD', 'BULK'))
);
--> statement-breakpoint
CREATE INDEX "admission_reservations_tenant_idx" ON "admission_reservations" USING btree ("tenant_id");
--> statement-breakpoint
CREATE INDEX "admission_reservations_expires_idx" ON "admission_reservations" USING btree ("expires_at");
