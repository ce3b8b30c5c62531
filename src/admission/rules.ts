/**
 * Admission: accepting or refusing work at the front door. Pure functions.
 *
 * Every tenant has a queue bound (its tier's, overridable) and the whole
 * system has a global bound, of which each class may fill only a share
 * (BULK 70 %, STANDARD 90 %, INTERACTIVE 100 % by default): as the queues fill,
 * BULK is refused first, then STANDARD, and INTERACTIVE last. A submission is
 * accepted whole or refused whole, with a Retry-After computed from how long
 * the excess takes to drain.
 */
import type { JobClass } from '../queue/boss.ts';

export interface AdmissionInput {
  /** Jobs of this submission per class. */
  incoming: Partial<Record<JobClass, number>>;
  /** The tenant's waiting jobs (all classes) and bound. */
  tenantDepth: number;
  tenantBound: number;
  /** Waiting jobs per class, all tenants. */
  globalDepth: Partial<Record<JobClass, number>>;
  globalBound: number;
  /** Share of the global bound each class may use (0..1]. */
  classShare: Partial<Record<JobClass, number>>;
  /** Estimated drain rates (jobs/s): the tenant's fair share, and the whole account's pace. */
  tenantDrainPerSecond: number;
  globalDrainPerSecond: number;
}

export type AdmissionResult =
  | { ok: true }
  | { ok: false; code: 'QUEUE_FULL'; scope: 'TENANT' | 'GLOBAL'; jobClass: JobClass | null; retryAfterSeconds: number; message: string };

export const MAX_RETRY_AFTER_SECONDS = 3_600;

/** Seconds until `excess` jobs have drained at `perSecond`: at least 1, at most an hour. */
export function retryAfterSeconds(excess: number, perSecond: number): number {
  if (!(perSecond > 0)) return MAX_RETRY_AFTER_SECONDS;
  return Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, Math.ceil(excess / perSecond)));
}

const ORDER: JobClass[] = ['BULK', 'STANDARD', 'INTERACTIVE'];

export function admit(a: AdmissionInput): AdmissionResult {
  const total = Object.values(a.incoming).reduce((s, n) => s + (n ?? 0), 0);
  if (a.tenantDepth + total > a.tenantBound) {
    const excess = a.tenantDepth + total - a.tenantBound;
    return {
      ok: false,
      code: 'QUEUE_FULL',
      scope: 'TENANT',
      jobClass: null,
      retryAfterSeconds: retryAfterSeconds(excess, a.tenantDrainPerSecond),
      message: `your queue holds ${a.tenantDepth} jobs; ${total} more would pass its bound of ${a.tenantBound}`,
    };
  }
  const globalTotal = Object.values(a.globalDepth).reduce((s, n) => s + (n ?? 0), 0);
  // Lowest class first, so the refusal names the class that sheds.
  for (const jobClass of ORDER) {
    const n = a.incoming[jobClass] ?? 0;
    if (n === 0) continue;
    const limit = Math.floor(a.globalBound * (a.classShare[jobClass] ?? 1));
    if (globalTotal + total > limit) {
      const excess = globalTotal + total - limit;
      return {
        ok: false,
        code: 'QUEUE_FULL',
        scope: 'GLOBAL',
        jobClass,
        retryAfterSeconds: retryAfterSeconds(excess, a.globalDrainPerSecond),
        message: `the system's queues are full for ${jobClass} work (${globalTotal} waiting, ${jobClass} may fill ${limit})`,
      };
    }
  }
  return { ok: true };
}

/**
 * A tenant's drain rate: its weighted share of the pace among busy tenants,
 * and no more than its cap allows at the measured latency (Little's law).
 */
export function tenantDrainRate(p: { pacedPerSecond: number; weight: number; busyWeights: number; cap: number; latencySeconds: number }): number {
  const share = p.pacedPerSecond * (p.weight / Math.max(p.weight, p.busyWeights));
  const capLimit = p.latencySeconds > 0 ? p.cap / p.latencySeconds : Number.POSITIVE_INFINITY;
  return Math.max(0, Math.min(share, capLimit));
}
