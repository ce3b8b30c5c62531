-- The lease's records (drizzle/functions/sluice_lease*.sql), instead of parallel arrays: a queue in
-- the fair order (the walk's candidates, the class cursors), and a job a turn picked.
CREATE TYPE sluice_lease_queue AS (tenant_id uuid, vtime double precision);
--> statement-breakpoint
CREATE TYPE sluice_lease_job AS (turn integer, o integer, id uuid, data jsonb, tenant_id uuid, class text, queue text,
  period timestamptz, cost integer, batched boolean, call integer);
