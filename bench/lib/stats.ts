/** Small numeric helpers. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[idx]!;
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const s = [...values].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function mean(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : values.reduce((a, b) => a + b, 0) / values.length;
}

export function round(x: number, digits = 3): number {
  if (!Number.isFinite(x)) return x;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/** A figure measured against a target, with its pass/fail flag. */
export interface Check {
  value: number | null;
  target: string;
  pass: boolean | null;
  note?: string;
}

export function check(value: number | null, target: string, pass: boolean | null, note?: string): Check {
  return note === undefined ? { value: value === null ? null : round(value, 4), target, pass } : { value: value === null ? null : round(value, 4), target, pass, note };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Runs `fn` over items with at most `concurrency` at a time. */
export async function mapLimit<T, R>(items: readonly T[], concurrency: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const workers = Array.from({ length: Math.min(concurrency, items.length) }, async () => {
    for (;;) {
      const i = next++;
      if (i >= items.length) return;
      out[i] = await fn(items[i]!, i);
    }
  });
  await Promise.all(workers);
  return out;
}

/**
 * Runs `slices` slices of each of two shapes in the order a b b a a b b a …, so that both see the
 * same minutes of the machine (a drift favours neither), and returns each shape's results in order.
 */
export async function interleaved<T>(slices: number, run: (first: boolean, index: number) => Promise<T>): Promise<{ first: T[]; second: T[] }> {
  const out = { first: [] as T[], second: [] as T[] };
  for (let i = 0; i < 2 * slices; i++) {
    const first = ((i + 1) >> 1) % 2 === 0;
    (first ? out.first : out.second).push(await run(first, i));
  }
  return out;
}
