-- sched_queues_busy_idx (class, vtime) WHERE ready_at IS NOT NULL is a prefix of
-- sched_queues_fair_idx (class, vtime, tenant_id) with the same predicate (0013): every read it
-- served, the fair index serves, and every virtual-time update of a lease turn maintained both.
DROP INDEX IF EXISTS "sched_queues_busy_idx";
