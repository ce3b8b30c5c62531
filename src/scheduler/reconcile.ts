/**
 * The reconciler: no waiting job is left stuck in silence.
 *
 * A `jobs` row that waits (QUEUED or WAITING_QUOTA) must have a live pg-boss
 * job (created, retry, or active while a lost worker's job comes back), or
 * the dispatcher never sees it again. pg-boss's maintenance deletes waiting
 * rows past their queue's retention (tenant queues now keep them far longer
 * than any wait, see queue/boss.ts, but older queues, manual deletes or a
 * restore can still lose them). The sweeper calls `reconcile` each round; it
 * walks the waiting jobs in keyset batches at most every `intervalMs`, and
 * for each one whose pg-boss job is gone:
 *  - its queue exists: puts it back (same id, same data) and marks the queue ready;
 *  - its queue is gone: fails it with QUEUE_ENTRY_LOST, visibly.
 */
import type postgres from 'postgres';
import type { PgBoss } from 'pg-boss';
import type { Logger } from 'pino';
import { publishJobEvents } from '../events/bus.ts';
import { failWaitingJob } from '../jobs/store.ts';
import { inTransaction, queueName } from '../queue/boss.ts';
import { type JobClass } from '../config/classes.ts';
import { markQueuesReady } from './sql/queues.ts';

export const LOST_JOB_CODE = 'QUEUE_ENTRY_LOST';

/** Jobs younger than this are never judged: nothing about a fresh submission is settled enough to call it lost. */
const MIN_AGE_SECONDS = 30;
const BATCH = 1_000;

interface LostJob {
  id: string;
  tenantId: string;
  priority: JobClass;
  api: string;
  params: Record<string, unknown>;
  createdAtMicros: string;
  queueExists: boolean;
}

type Cursor = { micros: string; id: string };

/**
 * The next batch of waiting jobs after the cursor, and which of them have no live pg-boss job. The
 * walk is a range of jobs_waiting_created_idx in its own order (created_at, id): its cost is the
 * batch, never a sort of the whole backlog. `explain` returns the plan instead (the index test).
 */
export async function waitingBatch(tx: postgres.TransactionSql | postgres.Sql, after: Cursor | null, explain = false) {
  const afterCursor = after
    ? tx`and (j.created_at, j.id) > (timestamptz 'epoch' + (${after.micros} || ' microseconds')::interval, ${after.id}::uuid)`
    : tx``;
  return tx`
    ${explain ? tx`explain (format json)` : tx``}
    with batch as (
      select j.id, j.tenant_id, j.priority, j.api, j.params, j.created_at,
        't.' || j.tenant_id || '.' || lower(j.priority) as queue
      from jobs j
      where j.state in ('QUEUED', 'WAITING_QUOTA')
        and j.created_at < now() - make_interval(secs => ${MIN_AGE_SECONDS})
        ${afterCursor}
      order by j.created_at, j.id
      limit ${BATCH}
    )
    select b.id, b.tenant_id as "tenantId", b.priority, b.api, b.params,
      (extract(epoch from b.created_at) * 1000000)::bigint::text as "createdAtMicros",
      exists (select 1 from pgboss.job p where p.name = b.queue and p.id = b.id and p.state in ('created', 'retry', 'active')) as live,
      exists (select 1 from pgboss.queue q where q.name = b.queue) as "queueExists"
    from batch b
    order by b.created_at, b.id`;
}

async function lostJobs(tx: postgres.TransactionSql, after: Cursor | null): Promise<{ scanned: number; last: Cursor | null; lost: LostJob[] }> {
  const rows = await waitingBatch(tx, after);
  const last = rows.at(-1);
  return {
    scanned: rows.length,
    last: last ? { micros: last.createdAtMicros as string, id: last.id as string } : null,
    lost: rows.filter((r) => !r.live).map((r) => r as unknown as LostJob),
  };
}

export class Reconciler {
  private readonly boss: PgBoss;
  private readonly intervalMs: number;
  private readonly log: Logger;
  private cursor: Cursor | null = null;
  private nextPassAt = 0;

  constructor(opts: { boss: PgBoss; intervalMs: number; log: Logger }) {
    this.boss = opts.boss;
    this.intervalMs = opts.intervalMs;
    this.log = opts.log;
  }

  /** One batch, inside the sweeper's transaction (under its lock). Returns what it put back and what it failed. */
  async reconcile(tx: postgres.TransactionSql): Promise<{ requeued: number; failed: number }> {
    if (this.cursor === null && Date.now() < this.nextPassAt) return { requeued: 0, failed: 0 };
    const { scanned, last, lost } = await lostJobs(tx, this.cursor);
    // A short batch ends the pass; the next one starts from the beginning after the interval.
    this.cursor = scanned < BATCH ? null : last;
    if (this.cursor === null) this.nextPassAt = Date.now() + this.intervalMs;
    let requeued = 0;
    let failed = 0;
    const db = inTransaction(tx);
    for (const job of lost) {
      const queue = queueName(job.tenantId, job.priority);
      if (job.queueExists) {
        // A finished pg-boss row under the same id would refuse the insert: remove it first.
        await this.boss.deleteJob(queue, job.id, { db });
        await this.boss.insert(queue, [{ id: job.id, data: { tenantId: job.tenantId, api: job.api, params: job.params } }], { db });
        await markQueuesReady(tx, job.tenantId, [job.priority]);
        requeued++;
      } else {
        const message = "the job's queue entry was lost and its queue no longer exists; submit it again";
        if (!(await failWaitingJob(tx, job.id, { data: null, errorCode: LOST_JOB_CODE, errorMessage: message, httpStatus: null }))) continue;
        await publishJobEvents(tx, [{ jobId: job.id, tenantId: job.tenantId, state: 'FAILED' }]);
        failed++;
      }
    }
    if (requeued + failed > 0) this.log.warn({ requeued, failed }, 'reconciled waiting jobs whose pg-boss job was gone');
    return { requeued, failed };
  }
}
