/**
 * The dispatcher: one per worker process, not one pg-boss `work()` per queue.
 * It composes three parts, each with one job:
 *   - the window loops (window-loop.ts): for each window a few loops
 *     (DISPATCH_LOOPS), each one lease after another (ONE call of
 *     sluice_lease across as many tenants as the fair order allows), then
 *     the calls to the provider, each tracked so a throw settles its attempts;
 *   - the attempt leases (attempt-leases.ts): the open attempts, their leases
 *     refreshed on a timer and a connection of their own, their deadlines and
 *     aborts, the "sent" mark;
 *   - the settler (settler.ts): the attempts' outcomes, grouped, many per
 *     transaction every SETTLE_INTERVAL_MS, retried until they land.
 * Every limit is checked by a conditional statement in Postgres, so any number
 * of processes can run these loops against one database.
 *
 * Liveness has ONE authority: the attempt lease. A call whose lease this
 * process could not refresh in time is aborted before the lease can expire,
 * so a second call is never made while the first can still be in flight, and
 * a superseded attempt's late settlement changes nothing (fenced by its
 * reservation id).
 *
 * Metrics are not the dispatcher's business: the process attaches them
 * through `onLeased` and `onSettled` (src/app.ts).
 */
import type { Logger } from 'pino';
import type { PgBoss } from 'pg-boss';
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import { WORK_CHANNEL } from '../jobs/service.ts';
import type { ProviderClient } from '../provider/types.ts';
import { type JobClass } from '../config/classes.ts';
import type { LatencyTracker } from '../scheduler/pool.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import type { Breakers } from './breakers.ts';
import { AttemptLeases } from './attempt-leases.ts';
import { Settler, type SettledAttempt } from './settler.ts';
import { WindowLoops } from './window-loop.ts';

export interface DispatcherOptions {
  sql: Sql;
  /**
   * The attempt leases' refresh runs here: a connection of its own, so it never queues behind the
   * hot path's statements on `sql` (a refresh that waits there could let a live lease expire).
   * Default `sql`.
   */
  leaseSql?: Sql;
  boss: PgBoss;
  client: ProviderClient;
  catalog: ApiCatalog;
  windows: readonly WindowSpec[];
  nodeId: string;
  poolMax: number;
  initialLatencyMs: number;
  leaseMax: number;
  /** Items per unit of weight one batch turn may take. */
  batchQuantum: number;
  /** Decision loops per window in this process: leases of different tenants run side by side. */
  loopsPerWindow: number;
  /** Most jobs one decision takes when the queue's head API batches (1 = never batch). Default 1. */
  batchMax?: number;
  idlePollMs: number;
  maxWaitMs: Partial<Record<JobClass, number>>;
  retryLimit: number;
  retryDelaySeconds: number;
  /** The attempt lease: how long an open attempt stays live without a refresh (the sweeper settles it after). */
  leaseSeconds: number;
  /** Settlements are grouped: one transaction per this interval (0 = as soon as one is ready). Default 2. */
  settleIntervalMs?: number;
  timeoutBilling: 'billed' | 'refunded';
  breakers: Breakers;
  /** How long a credits-exhausted account stops when the provider gave no renewal time. */
  creditsStopSeconds: number;
  /** Called once per lease with how many jobs of each class it dispatched on the window. */
  onLeased?: (window: string, jobClass: JobClass, jobs: number) => void;
  /** Called once per attempt when its outcome is planned and billed, as it is queued to settle. */
  onSettled?: (attempt: SettledAttempt) => void;
  log: Logger;
}

export class Dispatcher {
  private readonly options: DispatcherOptions;
  private running = false;
  private unlisten: (() => Promise<void>) | null = null;
  private readonly leases: AttemptLeases;
  private readonly settler: Settler;
  private readonly loops: WindowLoops;

  constructor(options: DispatcherOptions) {
    this.options = options;
    const { sql, leaseSql, boss, leaseSeconds, log } = options;
    this.leases = new AttemptLeases({ sql, leaseSql, leaseSeconds, log });
    this.settler = new Settler({
      sql,
      boss,
      leases: this.leases,
      retryLimit: options.retryLimit,
      retryDelaySeconds: options.retryDelaySeconds,
      settleIntervalMs: options.settleIntervalMs,
      creditsStopSeconds: options.creditsStopSeconds,
      stopping: () => !this.running,
      onSettled: options.onSettled,
      log,
    });
    this.loops = new WindowLoops({
      sql,
      client: options.client,
      catalog: options.catalog,
      windows: options.windows,
      nodeId: options.nodeId,
      poolMax: options.poolMax,
      initialLatencyMs: options.initialLatencyMs,
      leaseMax: options.leaseMax,
      batchQuantum: options.batchQuantum,
      loopsPerWindow: options.loopsPerWindow,
      batchMax: options.batchMax,
      idlePollMs: options.idlePollMs,
      maxWaitMs: options.maxWaitMs,
      leaseSeconds,
      timeoutBilling: options.timeoutBilling,
      breakers: options.breakers,
      leases: this.leases,
      settler: this.settler,
      running: () => this.running,
      onLeased: options.onLeased,
      log,
    });
  }

  /** Each window's call latencies (p50/p95 feed its pool size; the sweeper publishes them). */
  get latency(): ReadonlyMap<string, LatencyTracker> {
    return this.loops.latency;
  }

  /** Oldest ready job's wait per class, refreshed by the sweeper for the starvation guard. */
  get oldestWaitMs(): Partial<Record<JobClass, number>> {
    return this.loops.oldestWaitMs;
  }

  set oldestWaitMs(waits: Partial<Record<JobClass, number>>) {
    this.loops.oldestWaitMs = waits;
  }

  poolFor(w: WindowSpec): number {
    return this.loops.poolFor(w);
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    const { unlisten } = await this.options.sql.listen(WORK_CHANNEL, () => this.poke());
    this.unlisten = unlisten;
    this.leases.start();
    this.loops.start();
  }

  /**
   * Stops leasing at once, waits up to `graceMs` (default 30 s) for the calls
   * in flight to finish and their settlements to land (retried through a
   * database outage), and resolves. Past the grace, what is still open is
   * abandoned: its calls are aborted and nothing more is written, and its
   * reservations are settled by the sweeper by the timeout rule when their
   * attempt leases expire (never called twice, never reserved forever).
   */
  async stop(opts: { graceMs?: number } = {}): Promise<{ unsettled: number }> {
    if (!this.running) return { unsettled: 0 };
    this.running = false;
    this.poke();
    const graceMs = opts.graceMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), graceMs)));
    const drained = (async () => {
      await this.loops.drained();
      return true as const;
    })();
    const clean = await Promise.race([drained, graceOver]);
    clearTimeout(timer);
    const unsettled = clean ? 0 : this.leases.size;
    if (!clean) {
      this.leases.abandon();
      this.settler.dropQueued();
    }
    this.leases.stopTimer();
    await this.unlisten?.().catch(() => {});
    return { unsettled };
  }

  /** Wakes every sleeping window loop (new work, a freed slot, stop). */
  poke(): void {
    this.loops.poke();
  }
}
