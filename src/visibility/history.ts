/**
 * Chart history for the operator console, kept on the server so a reload is
 * not empty: a ring buffer per node. Each API process samples every window
 * every HISTORY_SAMPLE_MS (5 s) and keeps the last 24 hours (17,280 samples a
 * window, about 1 MB for three windows), in memory only:
 *
 *  - a restarted node starts empty again (the figures are a view of Postgres
 *    state that is shared, so any node's samples look alike; nothing is lost
 *    that the database or /metrics does not still have);
 *  - behind a load balancer each node answers from its own buffer; they differ
 *    only in when each started.
 *
 * Postgres would survive restarts but costs a write every few seconds per
 * node for a picture; Prometheus (/metrics) is the long-term record.
 */
/** One read of every window's figures (app.ts passes readWindows and windowCallRates). */
export type WindowSampleRead = () => Promise<Array<{ name: string; callsPerSecond: number; ratePerMinute: number | null; inFlight: number; poolSize: number }>>;

export interface HistoryPoint {
  /** Unix milliseconds. */
  at: number;
  callsPerSecond: number;
  /** The paced rate per second; null = unlimited. */
  pacedPerSecond: number | null;
  busy: number;
  poolSize: number;
}

export const HISTORY_RANGES = { MINUTES_15: 15 * 60_000, HOUR_1: 60 * 60_000, HOURS_24: 24 * 60 * 60_000 } as const;
export type HistoryRange = keyof typeof HISTORY_RANGES;
export const HISTORY_SAMPLE_MS = 5_000;
/** Points a range answers with at most: a chart a few hundred pixels wide shows no more. */
export const HISTORY_MAX_POINTS = 360;

/** A fixed-size ring of points, oldest overwritten first. */
export class Ring {
  private readonly items: Array<HistoryPoint | undefined>;
  private readonly capacity: number;
  private next = 0;
  private size = 0;
  constructor(capacity: number) {
    this.capacity = capacity;
    this.items = new Array(capacity);
  }
  push(p: HistoryPoint): void {
    this.items[this.next] = p;
    this.next = (this.next + 1) % this.capacity;
    this.size = Math.min(this.capacity, this.size + 1);
  }
  /** Points at or after `fromMs`, oldest first. */
  since(fromMs: number): HistoryPoint[] {
    const out: HistoryPoint[] = [];
    for (let i = 0; i < this.size; i++) {
      const p = this.items[(this.next - this.size + i + this.capacity) % this.capacity]!;
      if (p.at >= fromMs) out.push(p);
    }
    return out;
  }
}

/**
 * At most `max` points: consecutive points averaged in groups (the busiest
 * moment of a group keeps its busy peak, so a short spike still shows). Pure.
 */
export function downsample(points: readonly HistoryPoint[], max: number): HistoryPoint[] {
  if (points.length <= max) return [...points];
  const group = Math.ceil(points.length / max);
  const out: HistoryPoint[] = [];
  for (let i = 0; i < points.length; i += group) {
    const g = points.slice(i, i + group);
    const avg = (f: (p: HistoryPoint) => number) => g.reduce((s, p) => s + f(p), 0) / g.length;
    const paced = g.every((p) => p.pacedPerSecond === null) ? null : avg((p) => p.pacedPerSecond ?? 0);
    out.push({ at: g[g.length - 1]!.at, callsPerSecond: avg((p) => p.callsPerSecond), pacedPerSecond: paced, busy: Math.max(...g.map((p) => p.busy)), poolSize: Math.max(...g.map((p) => p.poolSize)) });
  }
  return out;
}

/** This node's samples of every window. */
export class WindowHistory {
  private readonly rings = new Map<string, Ring>();
  private timer: NodeJS.Timeout | null = null;
  private readonly capacity: number;
  private readonly readSample: WindowSampleRead;
  private readonly sampleMs: number;

  constructor(readSample: WindowSampleRead, sampleMs = HISTORY_SAMPLE_MS, keepMs: number = HISTORY_RANGES.HOURS_24) {
    this.readSample = readSample;
    this.sampleMs = sampleMs;
    this.capacity = Math.ceil(keepMs / sampleMs);
  }

  /** Adds one sample of each window (read from Postgres by `readSample`). */
  async sample(now = Date.now()): Promise<void> {
    for (const w of await this.readSample()) {
      let ring = this.rings.get(w.name);
      if (!ring) this.rings.set(w.name, (ring = new Ring(this.capacity)));
      ring.push({ at: now, callsPerSecond: w.callsPerSecond, pacedPerSecond: w.ratePerMinute === null ? null : w.ratePerMinute / 60, busy: w.inFlight, poolSize: w.poolSize });
    }
  }

  start(onError: (err: unknown) => void): void {
    if (this.timer) return;
    const tick = () => void this.sample().catch(onError);
    tick();
    this.timer = setInterval(tick, this.sampleMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** Each window's points over the range, oldest first, at most HISTORY_MAX_POINTS each. */
  read(range: HistoryRange, now = Date.now()): Array<{ window: string; points: HistoryPoint[] }> {
    const from = now - HISTORY_RANGES[range];
    return [...this.rings].sort(([a], [b]) => a.localeCompare(b)).map(([window, ring]) => ({ window, points: downsample(ring.since(from), HISTORY_MAX_POINTS) }));
  }
}
