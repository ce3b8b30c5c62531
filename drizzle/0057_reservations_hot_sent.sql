DROP INDEX "reservations_lease_idx";--> statement-breakpoint
DROP INDEX "reservations_job_idx";--> statement-breakpoint
-- Room on every page for the sent mark's HOT update (schema.ts, reservations). Pages already full
-- keep their rows; new rows go to pages filled to half.
ALTER TABLE "reservations" SET (fillfactor = 50);
