/**
 * Fairness keys inside a queue: the rank rule, pure. A tenant is often a platform with customers
 * of its own; within the tenant's share and class, its keys (JobInput.fairnessKey; jobs without
 * one share the default key) are served round robin.
 *
 * Start-time fair queueing among a queue's keys with equal weights, decided when a job is
 * inserted, so the lease needs no change: a job's rank is
 *
 *     max(V, last rank of its key's waiting jobs + 1)   (+ its place among its key's jobs in one insert)
 *
 * where V is the rank of the queue's head (the lowest rank still waiting and ready; 0 when none).
 * A key that has waited is served once per round of ranks; a key arriving (or returning) starts
 * level with the head, with no credit for the time it was idle. The job's pg-boss priority is its
 * rank negated, so pg-boss's fetch order, which the lease uses (priority desc, created_on), serves
 * the ranks in order and ties (several keys at one rank) first come first served. A tenant that
 * never sets keys has one key: ranks rise one per job, FIFO as before.
 *
 * The same rule runs in SQL in src/jobs/store.ts insertJobsQueued (one statement per group
 * commit); test/fair-keys.test.ts checks it against this model.
 */

/** pg-boss's priority is int4: ranks stop here (jobs at the cap are served first come first served). */
export const FAIR_RANK_MAX = 2_147_483_647;

/** The ranks of `count` new jobs of one key: after the key's last waiting rank, never before the head. */
export function nextRanks(head: number | null, lastWaitingRank: number | null, count: number): number[] {
  const base = Math.max(head ?? 0, lastWaitingRank === null ? Number.NEGATIVE_INFINITY : lastWaitingRank + 1);
  return Array.from({ length: count }, (_, i) => Math.min(base + i, FAIR_RANK_MAX));
}

export interface RankedJob {
  id: string;
  key: string;
  rank: number;
  /** Insertion order (pg-boss's created_on, the tie break). */
  seq: number;
}

/** The lease's order over waiting jobs: rank, then insertion. */
export function serveOrder<T extends RankedJob>(jobs: readonly T[]): T[] {
  return [...jobs].sort((a, b) => a.rank - b.rank || a.seq - b.seq);
}

/**
 * A queue model: insert jobs of keys (ranked by nextRanks against the waiting jobs), serve some
 * in the lease's order. For tests and the docs' examples.
 */
export class FairKeyQueue {
  private waiting: RankedJob[] = [];
  private seq = 0;

  get head(): number | null {
    return this.waiting.length === 0 ? null : serveOrder(this.waiting)[0]!.rank;
  }

  insert(jobs: ReadonlyArray<{ id: string; key: string | null }>): RankedJob[] {
    const head = this.head;
    const out: RankedJob[] = [];
    const byKey = new Map<string, Array<{ id: string }>>();
    for (const j of jobs) {
      const k = j.key ?? '';
      byKey.set(k, [...(byKey.get(k) ?? []), j]);
    }
    const ranks = new Map<string, number[]>();
    for (const [k, js] of byKey) {
      const last = this.waiting.filter((w) => w.key === k).reduce<number | null>((m, w) => (m === null ? w.rank : Math.max(m, w.rank)), null);
      ranks.set(k, nextRanks(head, last, js.length));
    }
    const used = new Map<string, number>();
    for (const j of jobs) {
      const k = j.key ?? '';
      const i = used.get(k) ?? 0;
      used.set(k, i + 1);
      out.push({ id: j.id, key: k, rank: ranks.get(k)![i]!, seq: this.seq++ });
    }
    this.waiting.push(...out);
    return out;
  }

  serve(n: number): RankedJob[] {
    const order = serveOrder(this.waiting);
    const served = order.slice(0, n);
    this.waiting = order.slice(n);
    return served;
  }
}
