-- Bill only what may have been billed: a reservation knows whether its call was sent.
--
-- sent_at: set by the attempt's node, one statement per lease for all the reservations it
-- received, before it sends their calls (the node sends only those the statement marked). A lease
-- whose rows never reached its node (a connection reset after the commit, a node killed before it
-- read them) stays unmarked, so when its lease expires the sweeper REFUNDS it (outcome
-- never_sent): nothing went upstream. A marked one is billed by the timeout rule as before
-- (outcome node_lost).
-- reconciled_at: a settlement that arrives after the sweeper settled its reservation corrects
-- the expiry's bill (and may finish the job) once; this is its fence.
ALTER TABLE "reservations" ADD COLUMN "sent_at" timestamp with time zone;
--> statement-breakpoint
ALTER TABLE "reservations" ADD COLUMN "reconciled_at" timestamp with time zone;
--> statement-breakpoint
-- Attempts open when this migration runs were leased by nodes that did not mark: assume sent.
UPDATE "reservations" SET "sent_at" = "created_at" WHERE "settled_at" IS NULL;
