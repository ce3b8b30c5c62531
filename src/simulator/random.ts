/**
 * Seeded randomness for the simulator: a small PRNG (mulberry32) and the
 * log-normal latency model. Pure: the same seed gives the same sequence, so a
 * test run (or a demo) replays exactly. Nothing here uses Math.random.
 */

export type Rng = () => number;

/** mulberry32: 32-bit state, uniform floats in [0, 1). */
export function mulberry32(seed: number): Rng {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An independent stream per purpose, so e.g. turning on faults does not shift the latency sequence. */
export function deriveSeed(seed: number, stream: string): number {
  let h = (seed ^ 0x9e3779b9) >>> 0;
  for (let i = 0; i < stream.length; i++) {
    h = Math.imul(h ^ stream.charCodeAt(i), 0x01000193) >>> 0;
  }
  return (h ^ (h >>> 16)) >>> 0;
}

/** z-score of the 95th percentile of the standard normal. */
const Z95 = 1.6448536269514722;

/** A standard normal draw (Box–Muller); always consumes exactly two uniforms. */
export function normal(rng: Rng): number {
  const u1 = rng();
  const u2 = rng();
  return Math.sqrt(-2 * Math.log(1 - u1)) * Math.cos(2 * Math.PI * u2);
}

/**
 * A latency from the log-normal whose median is `medianMs` and whose 95th
 * percentile is `p95Ms` (mu = ln median, sigma = ln(p95/median)/z95). A p95 at
 * or below the median gives a constant latency. Always consumes two uniforms.
 */
export function sampleLatencyMs(rng: Rng, medianMs: number, p95Ms: number): number {
  const z = normal(rng);
  if (medianMs <= 0) return 0;
  if (p95Ms <= medianMs) return medianMs;
  const sigma = Math.log(p95Ms / medianMs) / Z95;
  return medianMs * Math.exp(sigma * z);
}

/** `n` latencies from a fresh stream of `seed` (for tests and docs). */
export function sampleLatencies(seed: number, n: number, medianMs: number, p95Ms: number): number[] {
  const rng = mulberry32(seed);
  return Array.from({ length: n }, () => sampleLatencyMs(rng, medianMs, p95Ms));
}

/** A stable 32-bit hash of a string (FNV-1a), for deterministic fake data. */
export function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h >>> 0;
}
