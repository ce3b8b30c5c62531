/**
 * What held a window or an API on this node, as intervals: a paused or stopped window, an open
 * breaker. A job's wait span gets the holds that overlapped its wait as wait-reason events, so
 * "why did this job wait 40 s" reads WINDOW_PAUSED or BREAKER_OPEN instead of only RATE. Kept in
 * memory by the node that leases (no write per job, no write at all): a hold another node saw
 * and this one did not is missing from this node's spans, and a short hold between two of this
 * node's looks is missed. Pure: no I/O.
 */

/** One hold: why, and from when until when (epoch ms). */
export interface Hold {
  reason: string;
  fromMs: number;
  untilMs: number;
}

/** A look that saw the same hold again within this long of its end extends it, instead of starting another. */
export const HOLD_MERGE_GAP_MS = 2_000;

/** Holds kept per key (a window or an API): the oldest go first. */
export const HOLDS_PER_KEY = 32;

/** The key of a window's holds, and of an API's. */
export const windowHoldKey = (window: string): string => `window:${window}`;
export const apiHoldKey = (api: string): string => `api:${api}`;

export class HoldLog {
  private readonly byKey = new Map<string, Hold[]>();

  /** A look saw `key` held for `reason` at `fromMs`, until `untilMs` when known (else `fromMs`). */
  note(key: string, reason: string, fromMs: number, untilMs: number = fromMs): void {
    let list = this.byKey.get(key);
    if (!list) this.byKey.set(key, (list = []));
    const last = list.at(-1);
    if (last && last.reason === reason && fromMs <= last.untilMs + HOLD_MERGE_GAP_MS) {
      last.untilMs = Math.max(last.untilMs, untilMs);
      return;
    }
    list.push({ reason, fromMs, untilMs: Math.max(fromMs, untilMs) });
    if (list.length > HOLDS_PER_KEY) list.shift();
  }

  /** The holds of these keys that overlap [fromMs, toMs], oldest first. */
  overlapping(keys: readonly string[], fromMs: number, toMs: number): Hold[] {
    const out: Hold[] = [];
    for (const k of keys) for (const h of this.byKey.get(k) ?? []) if (h.untilMs >= fromMs && h.fromMs <= toMs) out.push(h);
    return out.sort((a, b) => a.fromMs - b.fromMs);
  }
}
