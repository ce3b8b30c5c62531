/**
 * Weighted fair order over the queues that have ready work: pure, no I/O.
 *
 * Each (tenant, class) queue carries a virtual time. Serving a queue advances
 * its virtual time by items / weight, and the next pick is the eligible queue
 * with the smallest virtual time, so over time each busy tenant's share of
 * calls converges to its weight's share (weighted fair queueing, in its
 * start-time form). A queue that becomes busy again starts at
 * max(its own virtual time, the class's virtual clock): it gets no credit for
 * the time it was idle, and it does not wait behind anyone's backlog either.
 *
 * Classes are served strictly in order (INTERACTIVE, STANDARD, BULK), except
 * that a lower class whose oldest ready job has waited longer than its
 * maximum wait is served first, so nothing starves.
 */
import { CLASSES, type JobClass } from '../config/classes.ts';

export interface QueueCandidate {
  tenantId: string;
  jobClass: JobClass;
  vtime: number;
  /** The tenant's effective weight (> 0). */
  weight: number;
  /** The tenant's in-flight calls across all nodes, and its cap. */
  inFlight: number;
  cap: number;
  /** The tenant waits for quota (its next job would pass its quota). */
  quotaBlocked: boolean;
}

/**
 * Classes in the order to serve them: starving classes first (oldest first),
 * then the rest by rank. `oldestWaitMs` is the age of each class's oldest
 * ready job (absent = no ready job).
 */
export function classOrder(
  classes: readonly JobClass[],
  oldestWaitMs: Partial<Record<JobClass, number>>,
  maxWaitMs: Partial<Record<JobClass, number>>,
): JobClass[] {
  const rank = (c: JobClass) => CLASSES.indexOf(c);
  const starving = classes
    .filter((c) => (oldestWaitMs[c] ?? -1) > (maxWaitMs[c] ?? Number.POSITIVE_INFINITY))
    .sort((a, b) => (oldestWaitMs[b] ?? 0) - (oldestWaitMs[a] ?? 0) || rank(a) - rank(b));
  const rest = classes.filter((c) => !starving.includes(c)).sort((a, b) => rank(a) - rank(b));
  return [...starving, ...rest];
}

export function eligible(q: QueueCandidate): boolean {
  return !q.quotaBlocked && q.inFlight < q.cap && q.weight > 0;
}

export interface Pick {
  queue: QueueCandidate;
  /** How many jobs to take from it now (at least 1). */
  take: number;
}

/**
 * The next queue to serve and how many jobs to take: the first class in
 * `order` that has an eligible queue, and in it the smallest virtual time
 * (ties broken by tenant id, so every node makes the same choice). `take` is
 * bounded by `maxTake` and the tenant's free cap, and by a quantum that keeps
 * interleaving smooth: a queue takes no more than one weight's worth beyond
 * the next queue's virtual time.
 */
export function pickQueue(candidates: readonly QueueCandidate[], order: readonly JobClass[], maxTake: number): Pick | null {
  if (maxTake < 1) return null;
  for (const jobClass of order) {
    const inClass = candidates.filter((q) => q.jobClass === jobClass && eligible(q));
    if (inClass.length === 0) continue;
    inClass.sort((a, b) => a.vtime - b.vtime || (a.tenantId < b.tenantId ? -1 : a.tenantId > b.tenantId ? 1 : 0));
    const queue = inClass[0]!;
    const next = inClass[1];
    // Items this queue may take before its virtual time passes the next queue's (at least one).
    const quantum = next ? Math.max(1, Math.floor((next.vtime - queue.vtime) * queue.weight) + 1) : maxTake;
    const take = Math.max(1, Math.min(maxTake, queue.cap - queue.inFlight, quantum));
    return { queue, take };
  }
  return null;
}

/** Virtual time after serving `items` calls of a queue with this weight. */
export function advance(vtime: number, items: number, weight: number): number {
  return vtime + items / weight;
}

/** A queue becoming busy starts no earlier than the class's clock: no credit for idle time. */
export function activationVtime(ownVtime: number, classClock: number): number {
  return Math.max(ownVtime, classClock);
}
