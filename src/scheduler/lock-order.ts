/**
 * The lock order of multi-row writers, as pure orderings (docs/ARCHITECTURE.md, "Lock order"):
 * rows of one table are always taken in key order, so two transactions touching the same rows never
 * wait for each other crosswise. A settlement requeuing tenant A then B against a submission group
 * touching B then A deadlocked (SQLSTATE 40P01), as did two groups reacting on two windows, or on a
 * window and the account, in outcome order. (The SQL side: sluice_apply_depth_delta locks its
 * sched_queues rows by (tenant_id, class) before it updates them.)
 */

const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/**
 * sched_queues' key order: tenant id, then class. (Lower-case UUID text sorts as Postgres sorts the
 * uuid; the class names are upper-case ASCII.)
 */
export function compareQueueKeys(a: { tenantId: string; jobClass: string }, b: { tenantId: string; jobClass: string }): number {
  return cmp(a.tenantId, b.tenantId) || cmp(a.jobClass, b.jobClass);
}

/** Indices of a settlement's requeues in queue key order, then job id (each requeue moves its queue's depth). */
export function requeueOrder(items: ReadonlyArray<{ tenantId: string; jobClass: string; id: string }>): number[] {
  return items.map((_, i) => i).sort((i, k) => compareQueueKeys(items[i]!, items[k]!) || cmp(items[i]!.id, items[k]!.id));
}

/**
 * Indices of a settlement group's account reactions in lock order: the windows' rows by window name,
 * then account_state (a credits-exhausted stop) last; equal keys keep their order.
 */
export function reactionOrder(reactions: ReadonlyArray<{ window: string; account: boolean }>): number[] {
  return reactions.map((_, i) => i).sort((i, k) => {
    const a = reactions[i]!;
    const b = reactions[k]!;
    if (a.account !== b.account) return a.account ? 1 : -1;
    return a.account ? i - k : cmp(a.window, b.window) || i - k;
  });
}
