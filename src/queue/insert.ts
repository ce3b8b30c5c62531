/**
 * What a set-based insert into pg-boss's job table needs to mirror
 * `boss.insert()` (its `insertJobs` plan: the queue's policies, pg-boss's
 * clock). The insert itself is `insertJobsQueued` in jobs/store.ts, one
 * statement that writes our `jobs` rows and their pg-boss jobs together; it
 * mirrors only the columns Sluice uses (no singleton, group, dependency or
 * trace options).
 */

/** pg-boss 12's defaults (plans.js QUEUE_DEFAULTS), for a queue row that leaves a policy null. */
export const BOSS_QUEUE_DEFAULTS = { expireSeconds: 900, deletionSeconds: 604_800, retentionSeconds: 1_209_600, retryLimit: 2, retryDelay: 0 };
