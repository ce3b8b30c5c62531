/**
 * What everyone can see: per tenant and class, depth, oldest age, running
 * count, why the head job waits and when the work should be done; and for
 * admins the shared machinery. Counted at query time (depth from the exact
 * trigger-kept counters), never a cached minute-old figure.
 */
import { activeAlerts, type AlertRow } from '../alerts/store.ts';
import { isTransientOutage } from '../db/availability.ts';
import type { Sql } from '../db/client.ts';
import type { Services } from '../graphql/context.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';
import { type AccountRow, readAccount } from '../scheduler/sql/account.ts';
import { readBreakers } from '../scheduler/sql/breakers.ts';
import { ledgerFor } from '../scheduler/sql/ledger.ts';
import { classTotals, tenantQueues } from '../scheduler/sql/queues.ts';
import { earliestRunAfter } from '../jobs/store.ts';
import { busyWeights, tenantSchedState } from '../scheduler/sql/tenants.ts';
import { readWindows, type WindowRow } from '../scheduler/sql/windows.ts';
import { recentService } from '../scheduler/sql/fairness.ts';
import { liveFairness, type LiveFairness } from '../scheduler/sfq-lag.ts';
import { drainSeconds, waitReason, type WaitReason } from '../scheduler/waits.ts';
import { effectiveLimits, quotaPeriod, type TenantRecord } from '../tenants/policy.ts';

export interface QueueStatus {
  priority: JobClass;
  depth: number;
  running: number;
  oldestAgeSeconds: number | null;
  waitReason: WaitReason | null;
  estimatedDrainSeconds: number | null;
}

export interface Usage {
  creditsUsed: number;
  creditsReserved: number;
  quota: number;
  periodStart: Date;
  periodEnd: Date;
}

export async function tenantUsage(services: Services, tenant: TenantRecord): Promise<Usage> {
  const period = quotaPeriod(tenant.periodAnchor, new Date());
  const ledger = await ledgerFor(services.sql, tenant.id, period.start);
  return { creditsUsed: ledger.billed, creditsReserved: ledger.reserved, quota: effectiveLimits(tenant).monthlyQuota, periodStart: period.start, periodEnd: period.end };
}

/** What classStatuses reads: the tenant's queues and scheduler row, and the shared machinery. */
export interface ClassStatusReads {
  queues: Awaited<ReturnType<typeof tenantQueues>>;
  state: Awaited<ReturnType<typeof tenantSchedState>>;
  windows: WindowRow[];
  account: AccountRow;
  breakers: Awaited<ReturnType<typeof readBreakers>>;
  /** When each class's earliest QUEUED job is due (absent: not read; no SCHEDULED reason then). */
  earliestRunAfter?: ReadonlyMap<JobClass, Date>;
}

/** Each class of one tenant: depth, running, oldest age and why its head job waits (no drain estimate); pure. */
export function classStatuses(windowSpecs: Services['windows'], tenant: TenantRecord, r: ClassStatusReads): Array<Omit<QueueStatus, 'estimatedDrainSeconds'>> {
  const { queues, state, windows, account, breakers } = r;
  const now = windows[0]?.dbNow ?? Date.now();
  const open = new Set(breakers.filter((b) => b.state === 'OPEN').map((b) => b.api));
  return CLASSES.map((jobClass) => {
    const q = queues.find((x) => x.jobClass === jobClass) ?? { depth: 0, running: 0, oldestAgeSeconds: null, headApi: null };
    const spec = windowSpecs.find((w) => w.classes.includes(jobClass));
    const w = windows.find((x) => x.name === spec?.name);
    const paused = w !== undefined && w.pausedUntil !== null && w.pausedUntil > w.dbNow;
    const reason = waitReason({
      depth: q.depth,
      suspended: state?.suspended ?? false,
      // A quota-blocked tenant's jobs are stored QUEUED but show WAITING_QUOTA: not "scheduled".
      scheduled: !(state?.quotaBlocked ?? false) && (r.earliestRunAfter?.get(jobClass)?.getTime() ?? now) > now,
      accountStopped: account.dispatchStoppedUntil !== null,
      keyUnusable: paused && w!.pauseReason === 'KEY_UNUSABLE',
      windowPaused: paused,
      breakerOpen: q.headApi !== null && open.has(q.headApi),
      quotaBlocked: state?.quotaBlocked ?? false,
      inFlight: state?.inFlight ?? 0,
      cap: state?.cap ?? effectiveLimits(tenant).concurrencyCap,
    });
    return { priority: jobClass, depth: q.depth, running: q.running, oldestAgeSeconds: q.oldestAgeSeconds, waitReason: reason };
  });
}

export async function tenantQueueStatus(services: Services, tenant: TenantRecord): Promise<QueueStatus[]> {
  const { sql } = services;
  const [queues, state, windows, account, breakers, earliest] = await Promise.all([
    tenantQueues(sql, tenant.id),
    tenantSchedState(sql, tenant.id),
    readWindows(sql),
    readAccount(sql),
    readBreakers(sql),
    earliestRunAfter(sql, tenant.id),
  ]);
  const statuses = classStatuses(services.windows, tenant, { queues, state, windows, account, breakers, earliestRunAfter: earliest });
  // One busy-weight read per class with waiting work, side by side; windows and the scheduler row are shared.
  return Promise.all(
    statuses.map(async (q) => {
      const rate = q.depth > 0 ? services.jobs.drainRatesFrom(tenant, [q.priority], { windows, state, busy: await busyWeights(sql, [q.priority]) }).tenant : 0;
      return { ...q, estimatedDrainSeconds: drainSeconds(q.depth, rate) };
    }),
  );
}

/**
 * How many waiting jobs are ahead of each of these jobs in its tenant's class
 * queue (created_at, id order): one window-function query for a whole page.
 * Jobs that are not waiting are absent from the answer.
 */
export async function queuePositions(sql: Sql, tenantId: string, jobIds: readonly string[]): Promise<Map<string, number>> {
  if (jobIds.length === 0) return new Map();
  const rows = await sql`
    select id, ahead from (
      select id, (row_number() over (partition by priority order by created_at, id) - 1)::int as ahead
      from jobs where tenant_id = ${tenantId} and state in ('QUEUED', 'WAITING_QUOTA')
    ) w where id = any(${jobIds as string[]}::uuid[])`;
  return new Map(rows.map((r) => [r.id as string, r.ahead as number]));
}

/**
 * When a waiting job should start: the jobs ahead of it in its tenant's class
 * queue (`ahead`) at the tenant's fair-share rate for its class (the queue
 * status's depth ÷ drain time). A job waiting for quota does not drain at any
 * rate: it starts when the period renews (the quota is reset), or never on
 * its own when a whole period's quota cannot pay for it (null; the job's
 * waitReason says QUOTA). Pure.
 */
export function estimatedStartAt(
  services: Pick<Services, 'catalog'>,
  tenant: TenantRecord,
  job: { api: string; priority: JobClass; state: string; runAfter?: Date | undefined },
  ahead: number | undefined,
  queues: readonly QueueStatus[],
  now = new Date(),
): Date | null {
  if (job.state !== 'QUEUED' && job.state !== 'WAITING_QUOTA') return null;
  // Not due yet (runAt): it starts then at the earliest.
  if (job.state === 'QUEUED' && job.runAfter !== undefined && job.runAfter > now) return job.runAfter;
  if (job.state === 'WAITING_QUOTA') return quotaRenewalStart(services, tenant, job.api, now);
  if (ahead === 0) return now; // next in line
  const q = queues.find((x) => x.priority === job.priority);
  if (ahead === undefined || !q || q.estimatedDrainSeconds === null || q.depth === 0) return null;
  const seconds = q.estimatedDrainSeconds * (ahead / q.depth);
  return new Date(now.getTime() + seconds * 1000);
}

/** A job waiting for quota starts at the period end, if one period's quota can pay for it at all. */
export function quotaRenewalStart(services: Pick<Services, 'catalog'>, tenant: TenantRecord, api: string, now = new Date()): Date | null {
  const cost = services.catalog.get(api)?.creditCost ?? 1;
  if (effectiveLimits(tenant).monthlyQuota < cost) return null;
  return quotaPeriod(tenant.periodAnchor, now).end;
}

/**
 * Why one waiting job waits: QUOTA for a job waiting for quota, SCHEDULED for
 * one not due yet (runAt, a retry's delay), otherwise its queue's reason (me.queues.waitReason); null once it started.
 */
export function jobWaitReason(job: { priority: JobClass; state: string; runAfter?: Date | undefined }, queues: readonly QueueStatus[], now = new Date()): WaitReason | null {
  if (job.state === 'WAITING_QUOTA') return 'QUOTA';
  if (job.state !== 'QUEUED') return null;
  if (job.runAfter !== undefined && job.runAfter > now) return 'SCHEDULED';
  return queues.find((q) => q.priority === job.priority)?.waitReason ?? 'RATE';
}

export interface SystemStatus {
  windows: Array<WindowRow & { callsPerSecond: number }>;
  account: AccountRow;
  breakers: Awaited<ReturnType<typeof readBreakers>>;
  alerts: AlertRow[];
  classes: Array<{ priority: JobClass; depth: number; running: number; oldestAgeSeconds: number | null }>;
  estimatedDrainSeconds: number | null;
  /** Lag against start-time fair queueing's bound over the recent leases (scheduler/sfq-lag.ts liveFairness). */
  fairness: LiveFairness;
}

/** The live fairness figures read the last 30 s of leases, at most this many jobs (the newest). */
export const FAIRNESS_SECONDS = 30;
export const FAIRNESS_MAX_JOBS = 3000;

export async function systemStatus(services: Services): Promise<SystemStatus> {
  const { sql } = services;
  const [rawWindows, rates, account, breakers, alerts, totals, recent] = await Promise.all([
    readWindows(sql),
    windowCallRates(sql),
    readAccount(sql),
    readBreakers(sql),
    activeAlerts(sql),
    classTotals(sql),
    recentService(sql, FAIRNESS_SECONDS, FAIRNESS_MAX_JOBS),
  ]);
  const windows = rawWindows.map((w) => ({ ...w, callsPerSecond: rates.get(w.name) ?? 0 }));
  const depth = totals.reduce((s, c) => s + c.depth, 0);
  const rate = windows.reduce((s, w) => s + (w.ratePerMinute !== null ? w.ratePerMinute / 60 : w.poolSize / Math.max(0.001, (w.latencyP50Ms ?? 1000) / 1000)), 0);
  return {
    windows,
    account,
    breakers,
    alerts,
    classes: totals.map((c) => ({ priority: c.jobClass, depth: c.depth, running: c.running, oldestAgeSeconds: c.oldestAgeSeconds })),
    estimatedDrainSeconds: account.dispatchStoppedUntil ? null : drainSeconds(depth, rate),
    fairness: liveFairness(recent),
  };
}

/**
 * Polls `read` and yields when the value changed, at most once per
 * `intervalMs`: the shape of tenantUsage and systemStatus. `return()` (the
 * client completes or disconnects) ends it at once: a plain async generator
 * would only see the return at its next yield, which for a value that never
 * changes is never, and would poll Postgres forever after the client left.
 */
export function changes<T>(read: () => Promise<T>, intervalMs = 1_000, signal?: AbortSignal): AsyncIterableIterator<T> {
  const stop = new AbortController();
  signal?.addEventListener('abort', () => stop.abort(), { once: true });
  const stopped = new Promise<IteratorResult<T>>((resolve) => stop.signal.addEventListener('abort', () => resolve({ value: undefined, done: true }), { once: true }));
  const polls = poll(read, intervalMs, stop.signal);
  const iterator: AsyncIterableIterator<T> = {
    next: () => (stop.signal.aborted ? Promise.resolve({ value: undefined, done: true }) : Promise.race([polls.next(), stopped])),
    return: async () => {
      stop.abort();
      return { value: undefined, done: true };
    },
    [Symbol.asyncIterator]() {
      return iterator;
    },
  };
  return iterator;
}

async function* poll<T>(read: () => Promise<T>, intervalMs: number, signal: AbortSignal): AsyncGenerator<T> {
  let last = '';
  while (!signal.aborted) {
    let value: T;
    try {
      value = await read();
    } catch (err) {
      // The database is away: keep the subscription and read again; the first read after recovery sends what changed.
      if (!isTransientOutage(err)) throw err;
      await new Promise((r) => setTimeout(r, intervalMs));
      continue;
    }
    const key = JSON.stringify(value, (k, v) => (k === 'dbNow' ? undefined : v));
    if (key !== last && !signal.aborted) {
      last = key;
      yield value;
    }
    await new Promise<void>((resolve) => {
      const onAbort = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      }, intervalMs);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }
}

/** Calls dispatched per window over the last `seconds` (one per item sent, as the pacer counts), per second. */
export async function windowCallRates(sql: Sql, seconds = 10): Promise<Map<string, number>> {
  const rows = await sql`
    select "window", count(*)::int as n from reservations
    where created_at > clock_timestamp() - make_interval(secs => ${seconds}) group by "window"`;
  return new Map(rows.map((r) => [r.window as string, (r.n as number) / seconds]));
}
