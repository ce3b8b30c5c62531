/**
 * Admission: accepting or refusing work at the front door. Pure functions.
 *
 * Every tenant has a queue bound (its tier's, overridable) and the whole
 * system has a global bound, of which each class may fill only a share
 * (BULK 70 %, STANDARD 90 %, INTERACTIVE 100 % by default): as the queues fill,
 * BULK is refused first, then STANDARD, and INTERACTIVE last. The same shares
 * apply to a tenant's own bound. A submission is accepted whole or refused
 * whole; a refusal says how many jobs must drain first (Retry-After is computed
 * from that only when refusing), or that the submission can never fit.
 */
import type { JobClass } from '../config/classes.ts';

export interface AdmissionInput {
  /** Jobs of this submission per class. */
  incoming: Partial<Record<JobClass, number>>;
  /** The tenant's waiting jobs (all classes) and bound. */
  tenantDepth: number;
  tenantBound: number;
  /** Waiting jobs of all tenants, all classes. */
  globalDepth: number;
  globalBound: number;
  /** Share of a bound each class may use (0..1], at both scopes: the lowest class sheds first. */
  classShare: Partial<Record<JobClass, number>>;
}

export interface Refusal {
  ok: false;
  code: 'QUEUE_FULL';
  scope: 'TENANT' | 'GLOBAL';
  /** The class that sheds (GLOBAL); at TENANT scope only when a class share, not the whole bound, caused it. */
  jobClass: JobClass | null;
  /** Jobs that must drain before the submission fits (for Retry-After). */
  excess: number;
  /** False when the submission is bigger than the bound itself: it can never fit, waiting does not help. */
  retryable: boolean;
  message: string;
}

export type AdmissionResult = { ok: true } | Refusal;

export const MAX_RETRY_AFTER_SECONDS = 3_600;

/** Seconds until `excess` jobs have drained at `perSecond`: at least 1, at most an hour. */
export function retryAfterSeconds(excess: number, perSecond: number): number {
  if (!(perSecond > 0)) return MAX_RETRY_AFTER_SECONDS;
  return Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, Math.ceil(excess / perSecond)));
}

const ORDER: JobClass[] = ['BULK', 'STANDARD', 'INTERACTIVE'];

/**
 * The first limit of one scope that `depth + total` passes, lowest class first
 * (so the refusal names the class that sheds). A class may fill `share` of the
 * bound; INTERACTIVE (share 1) the whole of it.
 */
function passedLimit(a: AdmissionInput, depth: number, bound: number, total: number): { jobClass: JobClass; limit: number; share: number } | null {
  for (const jobClass of ORDER) {
    if ((a.incoming[jobClass] ?? 0) === 0) continue;
    const share = Math.min(1, a.classShare[jobClass] ?? 1);
    // A class with any share may always hold one job: with a tiny bound (1), floor(1 × 0.8) = 0
    // would make every STANDARD submission one that "can never fit".
    const limit = share > 0 ? Math.max(1, Math.floor(bound * share)) : 0;
    if (depth + total > limit) return { jobClass, limit, share };
  }
  return null;
}

/**
 * Admits or refuses one submission, whole. Tenant scope first (its own bound),
 * then the global one. A submission that passes a limit even into empty
 * queues can never fit: it is refused as not retryable, with no Retry-After.
 */
export function admit(a: AdmissionInput): AdmissionResult {
  const total = Object.values(a.incoming).reduce((s, n) => s + (n ?? 0), 0);
  const scopes = [
    { scope: 'TENANT' as const, depth: a.tenantDepth, bound: a.tenantBound },
    { scope: 'GLOBAL' as const, depth: a.globalDepth, bound: a.globalBound },
  ];
  for (const { scope, depth, bound } of scopes) {
    const passed = passedLimit(a, depth, bound, total);
    if (!passed) continue;
    // A global refusal always names the class that sheds; a tenant's only when a class share (not its whole bound) caused it.
    const jobClass = scope === 'GLOBAL' || passed.share < 1 ? passed.jobClass : null;
    const { limit } = passed;
    const what = passed.share < 1 ? `${passed.jobClass} work may fill ${limit} of ${bound}` : `the bound is ${limit}`;
    const where = scope === 'TENANT' ? 'your queues' : "the system's queues";
    if (total > limit) {
      return {
        ok: false, code: 'QUEUE_FULL', scope, jobClass, excess: total - limit, retryable: false,
        message: `${total} jobs can never fit in ${where}: ${what}; submit at most ${limit} at a time`,
      };
    }
    return {
      ok: false, code: 'QUEUE_FULL', scope, jobClass, excess: depth + total - limit, retryable: true,
      message: `${where} hold ${depth} waiting jobs; ${total} more would pass the limit (${what})`,
    };
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
