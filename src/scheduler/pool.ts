/**
 * Worker pools sized by Little's law: pure, plus a small latency tracker.
 *
 * L = λ × W: to sustain a paced rate λ when each call holds its slot for W, L
 * slots must be in use. W is a high percentile (p95) of the measured hold, from
 * the lease through the call to its settlement's commit (not the call's latency
 * alone: slow commits must grow the pool, not slow the drain), so the pool
 * holds the rate on a bad day too; the pacer, not the pool, enforces the rate.
 */
export interface PoolLimits {
  /** The plan's concurrent-call limit available to this window. */
  concurrentLimit: number;
  /** A configured ceiling. */
  max: number;
}

/** ceil(rate/s × p95 hold s), at least 1, at most the limits. Unlimited rate: the limits. */
export function poolSize(pacedPerMinute: number | null, p95Ms: number, limits: PoolLimits): number {
  const ceiling = Math.max(1, Math.min(limits.concurrentLimit, limits.max));
  if (pacedPerMinute === null) return ceiling;
  const needed = Math.ceil((pacedPerMinute / 60) * (p95Ms / 1000));
  return Math.max(1, Math.min(ceiling, needed));
}

/** Percentiles over the last `capacity` latencies (a ring buffer). */
export class LatencyTracker {
  private readonly samples: number[] = [];
  private next = 0;
  private readonly capacity: number;
  private readonly initialMs: number;

  constructor(capacity = 500, initialMs = 1_000) {
    this.capacity = capacity;
    this.initialMs = initialMs;
  }

  record(ms: number): void {
    if (this.samples.length < this.capacity) this.samples.push(ms);
    else this.samples[this.next] = ms;
    this.next = (this.next + 1) % this.capacity;
  }

  get count(): number {
    return this.samples.length;
  }

  /** The p-th percentile (0..100); before any sample, the initial estimate. */
  percentile(p: number): number {
    if (this.samples.length === 0) return this.initialMs;
    const sorted = [...this.samples].sort((a, b) => a - b);
    const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
    return sorted[idx]!;
  }
}
