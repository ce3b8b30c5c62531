/**
 * Fairness keys inside a queue: the rank rule, pure. A tenant is often a platform with customers
 * of its own; within the tenant's share and class, its keys (JobInput.fairnessKey; jobs without
 * one share the default key) are served round robin.
 *
 * Start-time fair queueing among a queue's keys with equal weights, decided when a job is
 * inserted, so the lease needs no change. A job's rank is its start tag, in rounds:
 *
 *     max(V + 1, last rank of its key's waiting jobs + 1)   (+ its place among its key's jobs in one insert)
 *
 * where V, the queue's virtual time, is the rank of its head (the lowest rank still waiting and
 * ready: the round being served); an empty queue starts again at rank 0. A key with jobs waiting
 * carries on from its last rank (always past V); a key arriving or returning starts at V + 1, the
 * round after the one being served, with no credit for the time it was idle. The job's pg-boss
 * priority is its rank negated, so pg-boss's fetch order, which the lease uses (priority desc,
 * created_on), serves the ranks in order and ties (several keys at one rank) first come first
 * served. A tenant that never sets keys has one key: ranks rise one per job, FIFO as before.
 *
 * Why V + 1 and not V: a key that joined the round being served went ahead of every waiting key's
 * next job, and the round ended only when no job of its rank was left. Keys arriving at least as
 * fast as the queue is served (new users of a busy tenant, one job each) kept the head's rank from
 * ever moving, and a key with a backlog, the default key included, waited without bound. With
 * V + 1, a job at the front of its key is never overtaken by a later arrival, which gives the
 * bound (waitBound): counted from when a job is at the front of its key (its submission, or its
 * key's previous job's dispatch, whichever is later), at most two jobs of each other key with jobs
 * waiting then are dispatched before it (the rest of the head's round and the earlier arrivals of
 * the next), and nothing that arrives later. So with N keys waiting, a backlogged key gets at least
 * one job in every 2N - 1 dispatches of its queue, however fast new keys arrive (what arrives
 * meanwhile counts in the next N), and a new key's first job waits for at most 2(N - 1). The
 * price: a key arriving before the head's round has begun waits for it too (one job of each key).
 *
 * The same rule runs in SQL in src/jobs/store.ts insertJobsQueued (one statement per group
 * commit; the default key's last rank is kept on its queue's row by the depth trigger,
 * sluice_queues_add_jobs, the other keys' in sched_fair_keys); test/fair-keys.test.ts checks it
 * against this model.
 */

/** pg-boss's priority is int4: ranks stop here (jobs at the cap are served first come first served). */
export const FAIR_RANK_MAX = 2_147_483_647;

/**
 * The ranks of `count` new jobs of one key: after the key's last waiting rank, and after the head's
 * round (`head`, the lowest rank waiting and ready; null when nothing is), so never in it.
 */
export function nextRanks(head: number | null, lastWaitingRank: number | null, count: number): number[] {
  const base = Math.max(head === null ? 0 : head + 1, lastWaitingRank === null ? 0 : lastWaitingRank + 1);
  return Array.from({ length: count }, (_, i) => Math.min(base + i, FAIR_RANK_MAX));
}

/**
 * The most jobs of other keys dispatched before a job once it is at the front of its key (see the
 * rule above): two for each other key with jobs waiting at that moment, `keysWaiting` counting
 * its own key.
 */
export function waitBound(keysWaiting: number): number {
  return 2 * Math.max(0, keysWaiting - 1);
}

/**
 * One job of a dispatch log: when it arrived (was inserted) and when it was dispatched, on one
 * clock. Where the moment of arrival is only known to lie in a span (a live run: a transaction's
 * start, the answer's receipt), `arrivedAt` is its start and `arrivedBy` its end: the job counts
 * as waiting from the earliest, and its own wait is judged from the latest, so neither can make a
 * job look served worse than it was.
 */
export interface Dispatched {
  key: string;
  arrivedAt: number;
  arrivedBy?: number;
  startedAt: number;
}

export interface KeyWait<T extends Dispatched> {
  job: T;
  /** When it was at the front of its key: its arrival, or its key's previous dispatch if later. */
  since: number;
  /** Keys with a job waiting at `since` (arrived by then, dispatched after), its own included. */
  keysWaiting: number;
  /** Jobs of other keys dispatched after `since` and before it. */
  servedAhead: number;
  bound: number;
}

/**
 * Judges a dispatch log (a queue's jobs, each dispatched once) against waitBound, job by job: how
 * many jobs of other keys went ahead of each once it was at the front of its key, against the
 * bound for the keys waiting at that moment. Pure, so the model's runs and a live run's
 * `jobs.created_at`/`started_at` are judged by the same code. Quadratic: for tests.
 */
export function keyWaits<T extends Dispatched>(log: readonly T[]): Array<KeyWait<T>> {
  const order = [...log].sort((a, b) => a.startedAt - b.startedAt);
  const previous = new Map<string, number>();
  const out: Array<KeyWait<T>> = [];
  for (const job of order) {
    const since = Math.max(job.arrivedBy ?? job.arrivedAt, previous.get(job.key) ?? Number.NEGATIVE_INFINITY);
    previous.set(job.key, job.startedAt);
    const waiting = new Set<string>();
    let servedAhead = 0;
    for (const other of order) {
      if (other.arrivedAt <= since && other.startedAt > since) waiting.add(other.key);
      if (other.key !== job.key && other.startedAt > since && other.startedAt < job.startedAt) servedAhead++;
    }
    out.push({ job, since, keysWaiting: waiting.size, servedAhead, bound: waitBound(waiting.size) });
  }
  return out;
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
 * in the lease's order. For tests and the docs' examples; `ranks` swaps the rule (a test keeps the
 * rule that joined the head's round, to show what it did).
 */
export class FairKeyQueue {
  private waiting: RankedJob[] = [];
  private seq = 0;

  private readonly ranks: typeof nextRanks;

  constructor(ranks: typeof nextRanks = nextRanks) {
    this.ranks = ranks;
  }

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
      ranks.set(k, this.ranks(head, last, js.length));
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
