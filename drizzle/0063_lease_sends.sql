CREATE TABLE "lease_sends" (
	"lease_id" uuid PRIMARY KEY NOT NULL,
	"sent_at" timestamp with time zone,
	"lease_expires_at" timestamp with time zone,
	"riders" uuid[],
	"at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "reservations" ADD COLUMN "lease_id" uuid DEFAULT gen_random_uuid() NOT NULL;--> statement-breakpoint
CREATE INDEX "lease_sends_at_idx" ON "lease_sends" USING btree ("at");--> statement-breakpoint
-- Reservations marked sent before the mark moved to lease_sends: each is a lease of its own (the
-- column's default), and its mark becomes that lease's row, so the sweeper still bills it when it expires.
INSERT INTO "lease_sends" ("lease_id", "sent_at", "lease_expires_at", "at")
  SELECT "lease_id", "sent_at", "lease_expires_at", "sent_at" FROM "reservations" WHERE "sent_at" IS NOT NULL;
