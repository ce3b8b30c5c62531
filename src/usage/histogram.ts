/**
 * Latency histograms of usage history: fixed buckets, so hourly rows add up
 * element-wise into days and months and a percentile can still be read from
 * the sum. The SQL function `sluice_latency_bucket` (drizzle/functions/) uses the
 * same bounds.
 */

/** Upper bounds (ms) of the buckets; the last bucket is open (above 30 s). */
export const LATENCY_BOUNDS_MS = [25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000] as const;
export const BUCKETS = LATENCY_BOUNDS_MS.length + 1;

/** Element-wise sum of histograms (missing entries count 0). */
export function addHistograms(a: readonly number[], b: readonly number[]): number[] {
  return Array.from({ length: BUCKETS }, (_, i) => (a[i] ?? 0) + (b[i] ?? 0));
}

/**
 * The q-th percentile (0 < q ≤ 1) read from a histogram: the upper bound of
 * the bucket holding it, which never understates latency. The open bucket
 * reports its lower bound (30 s: "at least"). Null with no samples.
 */
export function percentileMs(hist: readonly number[], q: number): number | null {
  const total = hist.reduce((s, n) => s + n, 0);
  if (total === 0) return null;
  const rank = Math.ceil(q * total);
  let seen = 0;
  for (let i = 0; i < BUCKETS; i++) {
    seen += hist[i] ?? 0;
    if (seen >= rank) return LATENCY_BOUNDS_MS[Math.min(i, LATENCY_BOUNDS_MS.length - 1)]!;
  }
  return LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.length - 1]!;
}
