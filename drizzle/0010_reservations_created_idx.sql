-- The console's calls/s per window counts the last 10 seconds of reservations: an index keeps that read small as the table grows.
CREATE INDEX IF NOT EXISTS "reservations_created_idx" ON "reservations" USING btree ("created_at");
