/**
 * Start-time fair queueing's bound (I13 in ../shared/DESIGN.md), measured: pure, no I/O.
 *
 * For two tenants continuously backlogged over an interval, the normalised service difference
 * |ΔW_i/w_i − ΔW_j/w_j| should stay within u_i/w_i + u_j/w_j + P/W, where P is the most jobs
 * served at one instant while both were backlogged and W = w_i + w_j (an interval cannot cut an
 * instant: P/W covers the order inside it). An instant is a lease in the pure model, and a turn
 * in the database, where each job's startedAt is when its turn was decided. u is
 * the unit of service: one job (a paced window's batch turn is held to the fair limit like any
 * other); in an unpaced window a batch turn may take the API's minimum batch past its fair limit,
 * and a tenant whose jobs batch there is served in units of that size (SFQ's bound with jobs of
 * size u).
 *
 * The input is what the database knows after the fact: jobs served (when they started, whose)
 * and when each tenant was backlogged. The bench (`fairness`, phase `sfq`) and the live figures
 * (`system { fairness }`, metrics) both compute through `sfqLag`.
 */

export interface ServedJobs {
  /** When they were served (a lease in the model, a turn in the database: its jobs share the time). */
  at: number;
  tenantId: string;
  n: number;
}

export interface BackloggedTenant {
  tenantId: string;
  weight: number;
  /** The unit of service (see the module comment); default 1. */
  unit?: number;
  /**
   * Intervals [from, to) in which the tenant had work waiting throughout (sorted, disjoint):
   * `from` when its jobs became visible, `to` the instant of the lease that took its last
   * waiting job (that lease is not inside: the tenant's backlog ended during it).
   */
  backlogged: ReadonlyArray<readonly [number, number]>;
}

export interface PairLag {
  a: string;
  b: string;
  /** The interval both were backlogged in (of several, the one with the largest lag / bound). */
  from: number;
  to: number;
  /** Worst |ΔW_a/w_a − ΔW_b/w_b| over every sub-interval. */
  lag: number;
  bound: number;
  /** Most jobs one lease handed out in the interval (P). */
  leaseMost: number;
}

export interface SfqLagReport {
  pairs: PairLag[];
  /** The pair with the largest lag / bound (null: no two tenants were backlogged together). */
  worst: PairLag | null;
  /** Every pair within its bound. */
  withinBound: boolean;
  /** p99 of lag / bound over sub-intervals sampled on a grid of `gridStep` (all pairs). */
  p99LagOverBound: number | null;
  /** Per tenant: its worst lag against any other backlogged tenant, and that pair's bound. */
  byTenant: Record<string, { lag: number; bound: number }>;
  /**
   * Per tenant backlogged for at least `minShareSpan`: (service − fair share) / fair share over its
   * backlogged time, the fair share of each lease's jobs split by the weights of the tenants
   * backlogged at that moment.
   */
  shareError: Record<string, number>;
}

/** The SFQ bound for a pair (see the module comment). */
export function sfqBound(wa: number, wb: number, leaseMost: number, ua = 1, ub = 1): number {
  return ua / wa + ub / wb + leaseMost / (wa + wb);
}

const inside = (iv: ReadonlyArray<readonly [number, number]>, t: number) => iv.some(([f, to]) => t >= f && t < to);

/** Overlaps of two sorted disjoint interval lists. */
function overlaps(x: ReadonlyArray<readonly [number, number]>, y: ReadonlyArray<readonly [number, number]>): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (const [a0, a1] of x) for (const [b0, b1] of y) if (Math.max(a0, b0) < Math.min(a1, b1)) out.push([Math.max(a0, b0), Math.min(a1, b1)]);
  return out;
}

export function sfqLag(
  tenants: readonly BackloggedTenant[],
  served: readonly ServedJobs[],
  opts: { gridStep: number; minShareSpan: number },
): SfqLagReport {
  // One event per instant and tenant: an instant's jobs all start together, so no interval
  // can end between its turns.
  const merged = new Map<string, ServedJobs>();
  for (const e of served) {
    const k = `${e.at}\u0000${e.tenantId}`;
    const cur = merged.get(k);
    if (cur) cur.n += e.n;
    else merged.set(k, { ...e });
  }
  const events = [...merged.values()].sort((p, q) => p.at - q.at);
  // Lease sizes by instant (all tenants: P counts the whole lease).
  const leaseSize = new Map<number, number>();
  for (const e of events) leaseSize.set(e.at, (leaseSize.get(e.at) ?? 0) + e.n);
  const pairs: PairLag[] = [];
  const ratios: number[] = [];
  for (let i = 0; i < tenants.length; i++) {
    for (let j = i + 1; j < tenants.length; j++) {
      const a = tenants[i]!;
      const b = tenants[j]!;
      let best: PairLag | null = null;
      for (const [from, to] of overlaps(a.backlogged, b.backlogged)) {
        // D(t) = W_a/w_a − W_b/w_b after each instant's jobs; the worst lag is max D − min D (D(from) = 0).
        let d = 0;
        let lo = 0;
        let hi = 0;
        let most = 0;
        const points: Array<[number, number]> = [[from, 0]];
        for (let x = 0; x < events.length; x++) {
          const e = events[x]!;
          if (e.at < from || e.at >= to) continue;
          most = Math.max(most, leaseSize.get(e.at)!);
          if (e.tenantId === a.tenantId) d += e.n / a.weight;
          else if (e.tenantId === b.tenantId) d -= e.n / b.weight;
          // D is observed between instants only.
          if (events[x + 1]?.at === e.at) continue;
          lo = Math.min(lo, d);
          hi = Math.max(hi, d);
          points.push([e.at, d]);
        }
        const bound = sfqBound(a.weight, b.weight, most, a.unit ?? 1, b.unit ?? 1);
        // Grid samples of D (its value at each grid point), then every sub-interval between them.
        const grid: number[] = [];
        let k = 0;
        for (let t = from; t < to; t += opts.gridStep) {
          while (k + 1 < points.length && points[k + 1]![0] <= t) k++;
          grid.push(points[k]![1]);
        }
        for (let x = 0; x < grid.length; x++) for (let y = x + 1; y < grid.length; y++) ratios.push(Math.abs(grid[y]! - grid[x]!) / bound);
        const lag = hi - lo;
        if (!best || lag / bound > best.lag / best.bound) best = { a: a.tenantId, b: b.tenantId, from, to, lag, bound, leaseMost: most };
      }
      if (best) pairs.push(best);
    }
  }
  const byTenant: Record<string, { lag: number; bound: number }> = {};
  let worst: PairLag | null = null;
  for (const p of pairs) {
    if (!worst || p.lag / p.bound > worst.lag / worst.bound) worst = p;
    for (const t of [p.a, p.b]) {
      const cur = byTenant[t];
      if (!cur || p.lag / p.bound > cur.lag / cur.bound) byTenant[t] = { lag: p.lag, bound: p.bound };
    }
  }
  ratios.sort((x, y) => x - y);
  const p99 = ratios.length === 0 ? null : ratios[Math.min(ratios.length - 1, Math.floor(0.99 * ratios.length))]!;
  // Share error: each lease's jobs split by the weights backlogged at its instant.
  const shareError: Record<string, number> = {};
  for (const t of tenants) {
    const span = t.backlogged.reduce((s, [f, to]) => s + (to - f), 0);
    if (span < opts.minShareSpan) continue;
    let got = 0;
    let fair = 0;
    for (const [at, size] of leaseSize) {
      if (!inside(t.backlogged, at)) continue;
      const total = tenants.filter((x) => inside(x.backlogged, at)).reduce((s, x) => s + x.weight, 0);
      fair += (size * t.weight) / total;
    }
    for (const e of events) if (e.tenantId === t.tenantId && inside(t.backlogged, e.at)) got += e.n;
    if (fair > 0) shareError[t.tenantId] = (got - fair) / fair;
  }
  return { pairs, worst, withinBound: pairs.every((p) => p.lag <= p.bound + 1e-9), p99LagOverBound: p99, byTenant, shareError };
}

export interface LiveFairness {
  /** The span measured, seconds. */
  seconds: number;
  /** The pair with the largest lag / bound, or null with fewer than two tenants backlogged. */
  worst: { tenantA: string; tenantB: string; lag: number; bound: number } | null;
  /** Each backlogged tenant's worst lag against another, and that pair's bound. */
  tenants: Array<{ tenantId: string; lag: number; bound: number }>;
}

/**
 * The live figures (`system { fairness }`, metrics) from what the database shows: the recent
 * leases, and the tenants served in them that still have work waiting now, taken as backlogged
 * from their first lease in the span to now. An approximation of the bench's measure (it does not
 * know when a tenant's backlog began): a tenant served, then idle, then busy again within the
 * span counts as backlogged throughout.
 */
export function liveFairness(r: {
  served: readonly ServedJobs[];
  tenants: ReadonlyArray<{ tenantId: string; weight: number; waiting: boolean }>;
  from: number;
  now: number;
}): LiveFairness {
  const first = new Map<string, number>();
  for (const e of r.served) first.set(e.tenantId, Math.min(first.get(e.tenantId) ?? Number.POSITIVE_INFINITY, e.at));
  const backlogged = r.tenants
    .filter((t) => t.waiting && t.weight > 0 && first.has(t.tenantId))
    .map((t) => ({ tenantId: t.tenantId, weight: t.weight, backlogged: [[first.get(t.tenantId)!, r.now + 1] as const] }));
  const report = sfqLag(backlogged, r.served, { gridStep: Number.POSITIVE_INFINITY, minShareSpan: Number.POSITIVE_INFINITY });
  return {
    seconds: Math.max(0, (r.now - r.from) / 1000),
    worst: report.worst && { tenantA: report.worst.a, tenantB: report.worst.b, lag: report.worst.lag, bound: report.worst.bound },
    tenants: Object.entries(report.byTenant).map(([tenantId, v]) => ({ tenantId, ...v })),
  };
}
