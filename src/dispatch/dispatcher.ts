/**
 * The dispatcher: one per process, not one pg-boss `work()` per queue. It
 * finds the tenant queues that hold ready work, fetches from them in rotation
 * while it has free slots, and runs each job through the provider client.
 *
 * This is the simple correct loop of the first milestone: plain rotation over
 * busy queues and a fixed in-flight limit per process. Weighted fair order,
 * caps, the credit ledger and the shared pacer replace the selection step in
 * the scheduler milestone; running and settling a job stays as it is here.
 */
import type { Logger } from 'pino';
import type { JobWithMetadata, PgBoss } from 'pg-boss';
import type { Sql } from '../db/client.ts';
import { publishJobEvents } from '../events/bus.ts';
import { WORK_CHANNEL } from '../jobs/service.ts';
import { claimJob, finishJob, queuesWithWork, requeueJob, upsertResult } from '../jobs/store.ts';
import { reactionTo } from '../provider/classify.ts';
import type { CallOutcome, ProviderClient } from '../provider/types.ts';
import { inTransaction, queueName } from '../queue/boss.ts';
import { errorCodeFor, planSettlement } from './retry.ts';

export interface DispatcherOptions {
  sql: Sql;
  boss: PgBoss;
  client: ProviderClient;
  /** The upstream key every call uses (windows per key come with the scheduler). */
  apiKey: string;
  maxInFlight: number;
  idlePollMs: number;
  retryLimit: number;
  retryDelaySeconds: number;
  heartbeatSeconds: number;
  log: Logger;
}

interface JobData {
  tenantId: string;
  api: string;
  params: Record<string, unknown>;
}

export class Dispatcher {
  private readonly o: DispatcherOptions;
  private running = false;
  private loopDone: Promise<void> | null = null;
  private readonly inFlight = new Set<Promise<void>>();
  private wake: (() => void) | null = null;
  private rotation = 0;
  private unlisten: (() => Promise<void>) | null = null;

  constructor(options: DispatcherOptions) {
    this.o = options;
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    // New work wakes an idle dispatcher at once instead of waiting for its next poll.
    const { unlisten } = await this.o.sql.listen(WORK_CHANNEL, () => this.poke());
    this.unlisten = unlisten;
    this.loopDone = this.loop();
  }

  /** Stops taking work and waits for in-flight jobs to settle. */
  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    this.poke();
    await this.loopDone;
    await Promise.allSettled([...this.inFlight]);
    await this.unlisten?.();
  }

  private poke(): void {
    this.wake?.();
  }

  /** Waits `ms`, or less when poked (new work, a freed slot, stop). */
  private async sleep(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    await new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms);
      this.wake = resolve;
    });
    clearTimeout(timer);
    this.wake = null;
  }

  private async loop(): Promise<void> {
    while (this.running) {
      try {
        if (this.inFlight.size >= this.o.maxInFlight) {
          await Promise.race([...this.inFlight]);
          continue;
        }
        const fetched = await this.fetchRound();
        if (fetched === 0) await this.sleep(this.o.idlePollMs);
      } catch (err) {
        this.o.log.error({ err }, 'dispatch round failed');
        await this.sleep(this.o.idlePollMs);
      }
    }
  }

  /** One pass over the queues with work, starting one place further each time. */
  private async fetchRound(): Promise<number> {
    const queues = await queuesWithWork(this.o.sql);
    if (queues.length === 0) return 0;
    let fetched = 0;
    const start = this.rotation++ % queues.length;
    for (let i = 0; i < queues.length && this.running; i++) {
      const free = this.o.maxInFlight - this.inFlight.size;
      if (free <= 0) break;
      const q = queues[(start + i) % queues.length]!;
      const name = queueName(q.tenantId, q.priority);
      const batchSize = Math.max(1, Math.floor(free / (queues.length - i)));
      const jobs = await this.o.boss.fetch<JobData>(name, { batchSize, includeMetadata: true });
      for (const job of jobs) this.track(this.runJob(name, job));
      fetched += jobs.length;
    }
    return fetched;
  }

  private track(p: Promise<void>): void {
    const tracked = p
      .catch((err) => this.o.log.error({ err }, 'job run failed'))
      .finally(() => {
        this.inFlight.delete(tracked);
        this.poke();
      });
    this.inFlight.add(tracked);
  }

  private async runJob(queue: string, job: JobWithMetadata<JobData>): Promise<void> {
    const { sql, boss } = this.o;
    const { tenantId, api, params } = job.data;
    const claim = await sql.begin(async (tx) => {
      const c = await claimJob(tx, job.id);
      if (c) await publishJobEvents(tx, [{ jobId: job.id, tenantId, state: 'RUNNING' }]);
      return c;
    });
    if (!claim) {
      // Cancelled, or finished by an earlier delivery that crashed before acknowledging: nothing to call.
      await boss.complete(queue, job);
      return;
    }
    // fetch() does not heartbeat: touch the job while the call runs, so a
    // crashed process's job comes back after heartbeatSeconds, not at expiry.
    const heartbeat = setInterval(
      () => void boss.touch(queue, job).catch(() => {}),
      (this.o.heartbeatSeconds * 1000) / 2,
    );
    let outcome: CallOutcome;
    try {
      outcome = await this.o.client.call({ api, params, apiKey: this.o.apiKey });
    } finally {
      clearInterval(heartbeat);
    }
    await this.settle(queue, job, claim.attempts, outcome);
  }

  /**
   * Stores the result, then acknowledges the pg-boss job, in one transaction:
   * the job is never acknowledged without its result (I6).
   */
  private async settle(queue: string, job: JobWithMetadata<JobData>, attempts: number, outcome: CallOutcome): Promise<void> {
    const { sql, boss } = this.o;
    const { tenantId } = job.data;
    const plan = planSettlement(reactionTo(outcome), outcome, attempts, this.o.retryLimit, this.o.retryDelaySeconds);
    const effectiveAttempts = plan.countsAsAttempt ? attempts : attempts - 1;
    await sql.begin(async (tx) => {
      await upsertResult(tx, job.id, {
        data: outcome.kind === 'billed' ? outcome.data : null,
        errorCode: errorCodeFor(outcome.kind),
        errorMessage: outcome.message,
        httpStatus: outcome.httpStatus,
        creditsBilled: outcome.creditsBilled,
        attempts: effectiveAttempts,
      });
      const db = inTransaction(tx);
      if (plan.action === 'requeue') {
        if (!(await requeueJob(tx, job.id, plan.countsAsAttempt))) return;
        // Delete and re-insert under the same id: the job waits out its delay
        // without spending pg-boss's own retry budget, which is kept for crash redelivery.
        await boss.deleteJob(queue, job.id, { db });
        await boss.insert(queue, [{ id: job.id, data: job.data, startAfter: new Date(Date.now() + plan.delaySeconds * 1000) }], { db });
        await publishJobEvents(tx, [{ jobId: job.id, tenantId, state: 'QUEUED' }]);
        return;
      }
      const state = plan.action === 'succeed' ? 'SUCCEEDED' : 'FAILED';
      if (!(await finishJob(tx, job.id, state))) return;
      await boss.complete(queue, job.id, null, { db });
      await publishJobEvents(tx, [{ jobId: job.id, tenantId, state }]);
    });
  }
}
