ALTER TABLE "tenant_ledger" DROP CONSTRAINT "tenant_ledger_counts_check";--> statement-breakpoint
ALTER TABLE "sched_tenants" ADD COLUMN "reserved" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
-- The open reservations' credits move from their periods' ledger rows to their tenant's row.
UPDATE "sched_tenants" t SET "reserved" = l.reserved
  FROM (SELECT "tenant_id", sum("reserved") AS reserved FROM "tenant_ledger" GROUP BY 1) l
  WHERE l.tenant_id = t.tenant_id;--> statement-breakpoint
ALTER TABLE "tenant_ledger" DROP COLUMN "reserved";--> statement-breakpoint
ALTER TABLE "sched_tenants" ADD CONSTRAINT "sched_tenants_reserved_check" CHECK ("sched_tenants"."reserved" >= 0);--> statement-breakpoint
ALTER TABLE "tenant_ledger" ADD CONSTRAINT "tenant_ledger_counts_check" CHECK ("tenant_ledger"."billed" >= 0 and "tenant_ledger"."refunded" >= 0);