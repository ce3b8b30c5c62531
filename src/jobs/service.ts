/**
 * Submission and cancellation: the front half of a job's path. Validation is
 * pure (validate.ts); here the accepted jobs are written to our jobs table and
 * to the tenant's pg-boss queues in ONE transaction, so a job is either fully
 * accepted (a row we can report on and a queue entry the dispatcher will find)
 * or not at all.
 */
import { randomUUID } from 'node:crypto';
import type { PgBoss } from 'pg-boss';
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import { SluiceError } from '../errors.ts';
import { publishJobEvents } from '../events/bus.ts';
import { CLASSES, inTransaction, queueName, type JobClass } from '../queue/boss.ts';
import { cancelQueuedJob, getJob, insertJobs, jobsByIdempotencyKeys, type JobState } from './store.ts';
import { validateSubmission, type JobInput } from './validate.ts';
import { isQuotaBlocked, markQueuesReady } from '../scheduler/store.ts';

/** Channel the dispatcher listens on to wake up when new work arrives. */
export const WORK_CHANNEL = 'sluice_work';

export interface SubmittedJob {
  id: string;
  state: JobState;
}

export interface JobServiceDeps {
  sql: Sql;
  boss: PgBoss;
  catalog: ApiCatalog;
  maxJobsPerSubmission: number;
}

export class JobService {
  private readonly deps: JobServiceDeps;
  constructor(deps: JobServiceDeps) {
    this.deps = deps;
  }

  async submit(tenantId: string, inputs: readonly JobInput[]): Promise<SubmittedJob[]> {
    const { sql, boss, catalog, maxJobsPerSubmission } = this.deps;
    const valid = validateSubmission(inputs, catalog, maxJobsPerSubmission);
    const jobs = valid.map((j) => ({ ...j, id: randomUUID() }));

    return sql.begin(async (tx) => {
      // A tenant waiting for quota takes new jobs as WAITING_QUOTA, like the ones already waiting.
      const state = (await isQuotaBlocked(tx, tenantId)) ? 'WAITING_QUOTA' : 'QUEUED';
      const inserted = await insertJobs(tx, tenantId, jobs, state);
      const byClass = new Map<JobClass, typeof jobs>();
      for (const job of jobs) {
        if (!inserted.has(job.id)) continue;
        const list = byClass.get(job.priority) ?? [];
        list.push(job);
        byClass.set(job.priority, list);
      }
      const db = inTransaction(tx);
      for (const jobClass of CLASSES) {
        const list = byClass.get(jobClass);
        if (!list) continue;
        await boss.insert(
          queueName(tenantId, jobClass),
          list.map((j) => ({ id: j.id, data: { tenantId, api: j.api, params: j.params } })),
          { db },
        );
      }
      await markQueuesReady(tx, tenantId, [...byClass.keys()]);
      if (inserted.size > 0) await tx`select pg_notify(${WORK_CHANNEL}, ${tenantId})`;

      // Items whose idempotency key was used before (or twice in this call) answer with the original job.
      const replayedKeys = jobs.filter((j) => !inserted.has(j.id) && j.idempotencyKey !== null).map((j) => j.idempotencyKey!);
      const originals = await jobsByIdempotencyKeys(tx, tenantId, [...new Set(replayedKeys)]);
      return jobs.map((job) => {
        if (inserted.has(job.id)) return { id: job.id, state };
        const original = originals.get(job.idempotencyKey!);
        if (!original) throw new Error(`idempotent replay of ${job.idempotencyKey} found no original`);
        return original;
      });
    });
  }

  /** Cancels a queued job of the calling tenant. */
  async cancel(tenantId: string, jobId: string) {
    const { sql, boss } = this.deps;
    const cancelled = await sql.begin(async (tx) => {
      const jobClass = await cancelQueuedJob(tx, tenantId, jobId);
      if (!jobClass) return false;
      await boss.cancel(queueName(tenantId, jobClass), jobId, { db: inTransaction(tx) });
      await publishJobEvents(tx, [{ jobId, tenantId, state: 'CANCELLED' }]);
      return true;
    });
    const job = await getJob(sql, tenantId, jobId);
    if (!job) throw new SluiceError('NOT_FOUND', `no job with id ${jobId}`);
    if (!cancelled) throw new SluiceError('NOT_CANCELLABLE', `job ${jobId} is ${job.state}; only QUEUED or WAITING_QUOTA jobs can be cancelled`, { state: job.state });
    return job;
  }
}
