/**
 * What everyone can see: per tenant and class, depth, oldest age, running
 * count, why the head job waits and when the work should be done; and for
 * admins the shared machinery. Counted at query time (depth from the exact
 * trigger-kept counters), never a cached minute-old figure.
 */
import { activeAlerts, type AlertRow } from '../alerts/store.ts';
import { isTransientOutage } from '../db/availability.ts';
import type { Services } from '../graphql/context.ts';
import { CLASSES, type JobClass } from '../queue/boss.ts';
import * as sched from '../scheduler/store.ts';
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
  const ledger = await sched.ledgerFor(services.sql, tenant.id, period.start);
  return { creditsUsed: ledger.billed, creditsReserved: ledger.reserved, quota: effectiveLimits(tenant).monthlyQuota, periodStart: period.start, periodEnd: period.end };
}

export async function tenantQueueStatus(services: Services, tenant: TenantRecord): Promise<QueueStatus[]> {
  const { sql } = services;
  const [queues, state, windows, account, breakers] = await Promise.all([
    sched.tenantQueues(sql, tenant.id),
    sched.tenantSchedState(sql, tenant.id),
    sched.readWindows(sql),
    sched.readAccount(sql),
    sched.readBreakers(sql),
  ]);
  const open = new Set(breakers.filter((b) => b.state === 'OPEN').map((b) => b.api));
  const out: QueueStatus[] = [];
  for (const jobClass of CLASSES) {
    const q = queues.find((x) => x.jobClass === jobClass) ?? { depth: 0, running: 0, oldestAgeSeconds: null, headApi: null };
    const spec = services.windows.find((w) => w.classes.includes(jobClass));
    const w = windows.find((x) => x.name === spec?.name);
    const paused = w !== undefined && w.pausedUntil !== null && w.pausedUntil > w.dbNow;
    const reason = waitReason({
      depth: q.depth,
      accountStopped: account.dispatchStoppedUntil !== null,
      keyUnusable: paused && w!.pauseReason === 'KEY_UNUSABLE',
      windowPaused: paused,
      breakerOpen: q.headApi !== null && open.has(q.headApi),
      quotaBlocked: state?.quotaBlocked ?? false,
      inFlight: state?.inFlight ?? 0,
      cap: state?.cap ?? effectiveLimits(tenant).concurrencyCap,
    });
    const rate = q.depth > 0 ? (await services.jobs.drainRates(sql, tenant, [jobClass])).tenant : 0;
    out.push({ priority: jobClass, depth: q.depth, running: q.running, oldestAgeSeconds: q.oldestAgeSeconds, waitReason: reason, estimatedDrainSeconds: drainSeconds(q.depth, rate) });
  }
  return out;
}

/** When a waiting job should start: the jobs ahead of it in its tenant's class queue at the tenant's fair-share rate. */
// The job's own created_at is read in SQL, not passed as a JS Date, which would drop the
// microseconds that order the jobs of one submission.
export async function estimatedStartAt(services: Services, tenant: TenantRecord, job: { id: string; priority: JobClass; state: string; createdAt: Date }): Promise<Date | null> {
  if (job.state !== 'QUEUED' && job.state !== 'WAITING_QUOTA') return null;
  const [row] = await services.sql`
    select count(*)::int as n from jobs
    where tenant_id = ${tenant.id} and priority = ${job.priority} and state in ('QUEUED', 'WAITING_QUOTA')
      and (created_at, id) < (select j.created_at, j.id from jobs j where j.id = ${job.id})`;
  const rate = (await services.jobs.drainRates(services.sql, tenant, [job.priority])).tenant;
  const seconds = drainSeconds(row!.n as number, rate);
  return seconds === null ? null : new Date(Date.now() + seconds * 1000);
}

export interface SystemStatus {
  windows: sched.WindowRow[];
  account: sched.AccountRow;
  breakers: Awaited<ReturnType<typeof sched.readBreakers>>;
  alerts: AlertRow[];
  classes: Array<{ priority: JobClass; depth: number; running: number; oldestAgeSeconds: number | null }>;
  estimatedDrainSeconds: number | null;
}

export async function systemStatus(services: Services): Promise<SystemStatus> {
  const { sql } = services;
  const [windows, account, breakers, alerts, totals] = await Promise.all([
    sched.readWindows(sql),
    sched.readAccount(sql),
    sched.readBreakers(sql),
    activeAlerts(sql),
    sched.classTotals(sql),
  ]);
  const depth = totals.reduce((s, c) => s + c.depth, 0);
  const rate = windows.reduce((s, w) => s + (w.ratePerMinute !== null ? w.ratePerMinute / 60 : w.poolSize / Math.max(0.001, (w.latencyP50Ms ?? 1000) / 1000)), 0);
  return {
    windows,
    account,
    breakers,
    alerts,
    classes: totals.map((c) => ({ priority: c.jobClass, depth: c.depth, running: c.running, oldestAgeSeconds: c.oldestAgeSeconds })),
    estimatedDrainSeconds: account.dispatchStoppedUntil ? null : drainSeconds(depth, rate),
  };
}

/**
 * Polls `read` and yields when the value changed, at most once per
 * `intervalMs`: the shape of tenantUsage and systemStatus.
 */
export async function* changes<T>(read: () => Promise<T>, intervalMs = 1_000, signal?: AbortSignal): AsyncGenerator<T> {
  let last = '';
  while (!signal?.aborted) {
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
    if (key !== last) {
      last = key;
      yield value;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
