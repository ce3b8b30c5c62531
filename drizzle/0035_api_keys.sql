ALTER TABLE "tenant_api_keys" ADD COLUMN "name" text DEFAULT 'default' NOT NULL;--> statement-breakpoint
ALTER TABLE "tenant_api_keys" ADD COLUMN "scopes" text[] DEFAULT '{SUBMIT,READ}'::text[] NOT NULL;--> statement-breakpoint
ALTER TABLE "tenant_api_keys" ADD COLUMN "expires_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "tenant_api_keys" ADD COLUMN "last_used_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "tenant_api_keys" ADD CONSTRAINT "tenant_api_keys_scopes_check" CHECK (cardinality("tenant_api_keys"."scopes") > 0 and "tenant_api_keys"."scopes" <@ '{SUBMIT,READ}'::text[]);