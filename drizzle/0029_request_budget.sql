CREATE TABLE "tenant_request_budgets" (
	"tenant_id" uuid PRIMARY KEY NOT NULL,
	"tokens" double precision NOT NULL,
	"updated_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
ALTER TABLE "tenants" ADD COLUMN "request_burst" integer;--> statement-breakpoint
ALTER TABLE "tenants" ADD COLUMN "request_rate" integer;--> statement-breakpoint
ALTER TABLE "tenant_request_budgets" ADD CONSTRAINT "tenant_request_budgets_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE cascade ON UPDATE no action;