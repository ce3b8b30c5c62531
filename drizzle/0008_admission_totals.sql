-- admission_totals: the front door's global gate and its per-class count of waiting jobs.
-- Only submissions touch this table: each submitting transaction locks its rows first (class
-- order), so admissions from every process are serialized for the few milliseconds between the
-- bound check and commit, and the global bound is exact. `depth` is an upper estimate kept by
-- submissions alone (+n per accepted job); dispatch, cancel and settle never write it, so they do
-- not contend here. When a check would refuse, it is reconciled to the exact sum of the
-- trigger-kept sched_queues.depth counters (O(queues), but only when near the bound).
CREATE TABLE "admission_totals" (
	"class" text PRIMARY KEY NOT NULL,
	"depth" bigint DEFAULT 0 NOT NULL,
	"reconciled_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
INSERT INTO "admission_totals" ("class", "depth")
SELECT c, coalesce((SELECT sum(q.depth) FROM sched_queues q WHERE q.class = c), 0)
FROM unnest(ARRAY['INTERACTIVE', 'STANDARD', 'BULK']) AS c
ON CONFLICT DO NOTHING;
