-- Keyed bulk submissions take the reservation path too (jobs/service.ts submitBulk). Until now only
-- keyless ones did: the admission gate (every admission_totals row, FOR UPDATE) is what serializes
-- idempotency keys, so a keyed 10,000-job submitJobs held it for its whole insert (~1 s) and every
-- other admission in every process waited (bench fairness: B's 50 jobs accepted 0.03-0.64 s late,
-- right after A's keyed 10,000).
--
-- A reservation now also records its keys, with the job id each will get. Deciders read this table
-- in the same statement (one snapshot) as the jobs they look keys up in
-- (jobs/store.ts originalsByIdempotencyKey), so a key is always seen either reserved or stored:
-- the insert transaction that writes the jobs deletes their key rows (claimRoom), atomically at
-- its commit. A submission naming a reserved key is refused, retryable (IDEMPOTENCY_IN_PROGRESS);
-- once the jobs are stored it is a replay. The sweeper deletes the keys of a reservation it
-- reclaims (expired: its jobs never came), so an abandoned key is free again.
--
-- No foreign key to tenants: a row-level check costs ~14 us per row (10,000 per submission), and
-- every row is deleted by its reservation's claim or reclaim anyway.
CREATE TABLE "admission_reserved_keys" (
	"tenant_id" uuid NOT NULL,
	"idempotency_key" text NOT NULL,
	"reservation_id" uuid NOT NULL,
	"job_id" uuid NOT NULL,
	PRIMARY KEY ("tenant_id", "idempotency_key")
);
--> statement-breakpoint
CREATE INDEX "admission_reserved_keys_reservation_idx" ON "admission_reserved_keys" USING btree ("reservation_id");
