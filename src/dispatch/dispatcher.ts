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
 * Liveness has ONE authority: the attempt lease. A sent call's lease
 * outlasts the call's own timeout, and a call whose lease this process could
 * not refresh in time is aborted before the lease can expire, so a second
 * call is never made while the first can still be in flight, an outage never
 * cuts a call short, and a superseded attempt's late settlement changes
 * nothing (fenced by its reservation id).
 *
 * Metrics are not the dispatcher's business: the process attaches them
 * through `onLeased` and `onSettled` (src/app.ts).
 */
import type { Sql } from '../db/client.ts';
import type { Env } from '../config/env.ts';
import { parseClassSeconds } from '../config/classes.ts';
import { WORK_CHANNEL } from '../jobs/service.ts';
import { type JobClass } from '../config/classes.ts';
import type { LatencyTracker } from '../scheduler/pool.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import type { CallOutcome } from '../provider/types.ts';
import type { PaceRules } from '../scheduler/learned-pace.ts';
import { AttemptLeases } from './attempt-leases.ts';
import { PaceLearner } from './pace-learner.ts';
import { Settler, type SettlerOptions } from './settler.ts';
import { WindowLoops, type WindowLoopsOptions } from './window-loop.ts';

/** The window loops' and the settler's settings (documented there), and the lease refresh's connection. */
export type DispatcherOptions = Omit<WindowLoopsOptions, 'leases' | 'settler' | 'running'> &
  Omit<SettlerOptions, 'sql' | 'log' | 'leases' | 'stopping'> & {
    /**
     * The attempt leases' refresh runs here: a connection of its own, so it never queues behind the
     * hot path's statements on `sql` (a refresh that waits there could let a live lease expire).
     * Default `sql`.
     */
    leaseSql?: Sql;
    /** The learned pace (scheduler/learned-pace.ts): its rules and PACE_SAMPLE_MS; absent = paced from configuration only. */
    pace?: { rules: PaceRules; sampleMs: number } | undefined;
    /** The LISTEN for work wake-ups runs here: a session to Postgres itself (DATABASE_DIRECT_URL). Default `sql`. */
    listenSql?: Sql;
    /** The provider client's per-call timeout (PROVIDER_TIMEOUT_MS): a sent call's attempt lease outlasts it. */
    callTimeoutMs: number;
  };

/** The dispatcher's settings from the environment (what is not a connection, a client or a callback). */
export function dispatcherSettings(env: Env) {
  return {
    poolMax: env.POOL_MAX,
    initialLatencyMs: env.INITIAL_LATENCY_MS,
    leaseMax: env.LEASE_MAX,
    loopsPerWindow: env.DISPATCH_LOOPS,
    batchQuantum: env.BATCH_QUANTUM,
    batchMax: env.BATCH_MAX,
    idlePollMs: env.DISPATCH_IDLE_POLL_MS,
    maxWaitMs: parseClassSeconds(env.CLASS_MAX_WAIT_SECONDS),
    retryLimit: env.JOB_RETRY_LIMIT,
    retryDelaySeconds: env.JOB_RETRY_DELAY_SECONDS,
    leaseSeconds: env.ATTEMPT_LEASE_SECONDS ?? env.NODE_TIMEOUT_SECONDS,
    callTimeoutMs: env.PROVIDER_TIMEOUT_MS,
    settleIntervalMs: env.SETTLE_INTERVAL_MS,
    timeoutBilling: env.TIMEOUT_BILLING,
    creditsStopSeconds: env.CREDITS_STOP_SECONDS,
    ...(env.PACE_LEARN
      ? {
          pace: {
            rules: {
              fraction: env.PACE_FRACTION,
              step: env.PACE_STEP,
              stepMs: env.PACE_STEP_MS,
              decrease: env.PACE_DECREASE,
              min: env.PACE_MIN,
              start: env.PACE_START,
              startStepMs: env.PACE_SAMPLE_MS,
            },
            sampleMs: env.PACE_SAMPLE_MS,
          },
        }
      : {}),
  } satisfies Partial<DispatcherOptions>;
}

export class Dispatcher {
  private readonly options: DispatcherOptions;
  private running = false;
  private unlisten: (() => Promise<void>) | null = null;
  private readonly leases: AttemptLeases;
  private readonly settler: Settler;
  private readonly loops: WindowLoops;
  private readonly pace: PaceLearner | null;

  constructor(options: DispatcherOptions) {
    this.options = options;
    const { sql, leaseSql, leaseSeconds, callTimeoutMs, log } = options;
    this.leases = new AttemptLeases({ sql, leaseSql, leaseSeconds, callTimeoutMs, log });
    const pace = options.pace;
    this.pace = pace ? new PaceLearner({ sql, windows: options.windows, rules: pace.rules, sampleMs: pace.sampleMs, log }) : null;
    this.settler = new Settler({
      ...options,
      leases: this.leases,
      stopping: () => !this.running,
      ...(pace ? { rateLimitPace: { decrease: pace.rules.decrease, floor: pace.rules.min } } : {}),
    });
    this.loops = new WindowLoops({
      ...options,
      leases: this.leases,
      settler: this.settler,
      running: () => this.running,
      ...(this.pace ? { onAnswer: (w: WindowSpec, o: CallOutcome) => this.pace!.observe(w, o), paceOf: (w: WindowSpec) => this.pace!.rateOf(w) } : {}),
    });
  }

  /** Each window's call latencies (the sweeper publishes their p50/p95). */
  get latency(): ReadonlyMap<string, LatencyTracker> {
    return this.loops.latency;
  }

  /** How long each window's calls held their pool slots (the p95 sizes the pool; the sweeper publishes it). */
  get held(): ReadonlyMap<string, LatencyTracker> {
    return this.loops.held;
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
    const { unlisten } = await (this.options.listenSql ?? this.options.sql).listen(WORK_CHANNEL, () => this.loops.pokeWork());
    this.unlisten = unlisten;
    await this.settler.warm();
    if (!this.running) return; // stopped during the warm-up
    this.leases.start();
    this.pace?.start();
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
    await this.pace?.stop();
    await this.unlisten?.().catch(() => {});
    return { unsettled };
  }

  /** Wakes every sleeping window loop (stop; new work wakes only the windows it could help). */
  poke(): void {
    this.loops.poke();
  }
}
