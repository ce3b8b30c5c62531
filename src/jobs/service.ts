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
import { validateSubmission, type JobInput, type ValidJob } from './validate.ts';
import type postgres from 'postgres';
import { admit, tenantDrainRate } from '../admission/rules.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import { busyWeights, globalDepthByClass, ledgerFor, lockTenantDepth, readWindows, tenantSchedState } from '../scheduler/store.ts';
import { effectiveLimits, quotaPeriod, type TenantRecord } from '../tenants/policy.ts';
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
  admission: AdmissionConfig;
  /** Counts refusals (metrics). */
  onRefused?: (code: string, jobClass: JobClass | null) => void;
}

export interface AdmissionConfig {
  globalBound: number;
  classShare: Partial<Record<JobClass, number>>;
  /** The windows, for drain-time estimates (paced rates, which classes use them). */
  windows: readonly WindowSpec[];
}

export class JobService {
  private readonly deps: JobServiceDeps;
  constructor(deps: JobServiceDeps) {
    this.deps = deps;
  }

  async submit(tenant: TenantRecord, inputs: readonly JobInput[]): Promise<SubmittedJob[]> {
    const { sql, boss, catalog, maxJobsPerSubmission } = this.deps;
    const tenantId = tenant.id;
    const valid = validateSubmission(inputs, catalog, maxJobsPerSubmission);
    const jobs = valid.map((j) => ({ ...j, id: randomUUID() }));

    return sql.begin(async (tx) => {
      // The tenant's scheduler row is locked first (lock order), so a suspension cannot slip in after this check.
      const [sched] = await tx`select suspended from sched_tenants where tenant_id = ${tenantId} for update`;
      if (sched?.suspended || tenant.suspendedAt) throw new SluiceError('TENANT_SUSPENDED', 'your tenant is suspended: submissions are refused until an operator resumes it', {}, 403);
      await this.admit(tx, tenant, valid);
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

  /**
   * Admission, inside the submission's transaction. The tenant's scheduler
   * row is locked first, so one tenant's concurrent submissions cannot both
   * slip under its bound; the global bound is read without a lock (it may be
   * overshot by what is admitted concurrently, never by more).
   */
  private async admit(tx: postgres.TransactionSql, tenant: TenantRecord, jobs: readonly ValidJob[]): Promise<void> {
    const { catalog, admission } = this.deps;
    const limits = effectiveLimits(tenant);
    if (tenant.quotaPolicy === 'FAIL') {
      const period = quotaPeriod(tenant.periodAnchor, new Date());
      const ledger = await ledgerFor(tx, tenant.id, period.start);
      const cheapest = Math.min(...jobs.map((j) => catalog.get(j.api)?.creditCost ?? 1));
      const remaining = limits.monthlyQuota - ledger.billed - ledger.reserved;
      if (remaining < cheapest) {
        throw new SluiceError('QUOTA_EXCEEDED', `your monthly credit quota is spent (${remaining} of ${limits.monthlyQuota} left until ${period.end.toISOString()})`, {
          quota: limits.monthlyQuota,
          creditsRemaining: Math.max(0, remaining),
          periodEnd: period.end.toISOString(),
        });
      }
    }
    const incoming: Partial<Record<JobClass, number>> = {};
    for (const j of jobs) incoming[j.priority] = (incoming[j.priority] ?? 0) + 1;
    const tenantDepth = await lockTenantDepth(tx, tenant.id);
    const globalDepth = await globalDepthByClass(tx);
    const estimate = await this.drainRates(tx, tenant, Object.keys(incoming) as JobClass[]);
    const verdict = admit({
      incoming,
      tenantDepth,
      tenantBound: limits.queueBound,
      globalDepth,
      globalBound: admission.globalBound,
      classShare: admission.classShare,
      tenantDrainPerSecond: estimate.tenant,
      globalDrainPerSecond: estimate.global,
    });
    if (!verdict.ok) {
      this.deps.onRefused?.(verdict.code, verdict.jobClass);
      throw new SluiceError(
        'QUEUE_FULL',
        verdict.message,
        { retryAfterSeconds: verdict.retryAfterSeconds, scope: verdict.scope, ...(verdict.jobClass ? { priority: verdict.jobClass } : {}) },
        429,
        { 'Retry-After': String(verdict.retryAfterSeconds) },
      );
    }
  }

  /** Drain rates (jobs/s) for Retry-After: the tenant's fair share of its classes' pace, and the whole pace. */
  async drainRates(sql: Sql | postgres.TransactionSql, tenant: TenantRecord, classes: readonly JobClass[]): Promise<{ tenant: number; global: number }> {
    const windows = await readWindows(sql);
    const rateOf = (name: string) => {
      const spec = this.deps.admission.windows.find((w) => w.name === name);
      const row = windows.find((w) => w.name === name);
      const latency = Math.max(0.001, (row?.latencyP50Ms ?? 1000) / 1000);
      // An unlimited window drains at its pool's pace: pool / latency (Little's law).
      return spec?.pacedPerMinute != null ? spec.pacedPerMinute / 60 : (row?.poolSize ?? 1) / latency;
    };
    const global = this.deps.admission.windows.reduce((s, w) => s + rateOf(w.name), 0);
    const mine = this.deps.admission.windows.filter((w) => w.classes.some((c) => classes.includes(c)));
    const paced = mine.reduce((s, w) => s + rateOf(w.name), 0);
    const state = await tenantSchedState(sql, tenant.id);
    const latency = Math.max(0.001, (windows.find((w) => mine.some((m) => m.name === w.name))?.latencyP50Ms ?? 1000) / 1000);
    const busy = await busyWeights(sql, classes);
    const limits = effectiveLimits(tenant);
    return {
      tenant: tenantDrainRate({ pacedPerSecond: paced, weight: limits.weight, busyWeights: busy, cap: state?.cap ?? limits.concurrencyCap, latencySeconds: latency }),
      global,
    };
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
