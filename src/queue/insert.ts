/**
 * Set-based insert into pg-boss's job table for many queues at once: what
 * `boss.insert()` does for one queue (its `insertJobs` plan: the queue's
 * policies, pg-boss's clock), in one statement for a whole group commit or
 * bulk submission. Writing pg-boss's table directly is the supported way to
 * go beyond its API inside our own transaction; this mirrors only the columns
 * Sluice uses (no singleton, group, dependency or trace options).
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';

/** pg-boss 12's defaults (plans.js QUEUE_DEFAULTS), for a queue row that leaves a policy null. */
export const BOSS_QUEUE_DEFAULTS = { expireSeconds: 900, deletionSeconds: 604_800, retentionSeconds: 1_209_600, retryLimit: 2, retryDelay: 0 };

export interface QueueJob {
  id: string;
  /** The pg-boss queue name (`t.<tenant>.<class>`). */
  name: string;
  data: unknown;
}

/**
 * Inserts the jobs; throws (aborting the caller's transaction) unless every
 * one was inserted: a job whose queue is missing must not be acknowledged.
 */
export async function insertQueueJobs(tx: Sql | postgres.TransactionSql, jobs: readonly QueueJob[]): Promise<void> {
  if (jobs.length === 0) return;
  const [row] = await tx`
    with ins as (
      insert into pgboss.job (id, name, data, priority, start_after, created_on, expire_seconds, deletion_seconds, keep_until,
        retry_limit, retry_delay, retry_backoff, retry_delay_max, policy, dead_letter, heartbeat_seconds)
      select x.id, x.name, x.data, 0, pgboss.job_now(), pgboss.job_now(),
        coalesce(q.expire_seconds, ${BOSS_QUEUE_DEFAULTS.expireSeconds}), coalesce(q.deletion_seconds, ${BOSS_QUEUE_DEFAULTS.deletionSeconds}),
        pgboss.job_now() + coalesce(q.retention_seconds, ${BOSS_QUEUE_DEFAULTS.retentionSeconds}) * interval '1s',
        coalesce(q.retry_limit, ${BOSS_QUEUE_DEFAULTS.retryLimit}), coalesce(q.retry_delay, ${BOSS_QUEUE_DEFAULTS.retryDelay}), coalesce(q.retry_backoff, false),
        q.retry_delay_max, q.policy, q.dead_letter, q.heartbeat_seconds
      from jsonb_to_recordset(${tx.json(jobs as never)}::jsonb) as x(id uuid, name text, data jsonb)
      join pgboss.queue q on q.name = x.name
      on conflict do nothing
      returning 1
    )
    select count(*)::int as n from ins`;
  const inserted = row!.n as number;
  if (inserted !== jobs.length) {
    throw new Error(`pg-boss insert stored ${inserted} of ${jobs.length} jobs (a queue is missing or an id repeats)`);
  }
}
