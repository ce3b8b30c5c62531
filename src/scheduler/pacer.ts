/**
 * Token-bucket arithmetic for a window's pacer: pure. The bucket itself lives
 * in Postgres (one row per window, shared by every worker on every node) and
 * is taken from with a single conditional UPDATE that applies the same
 * formula (sluice_window_tokens, read by the lease and its window update; scheduler/sql/windows.ts pauses and stops it); this module is what the dispatcher
 * uses to decide how long to wait and how many tokens to ask for.
 */
export interface BucketState {
  /** Paced limit in calls per minute; null = unlimited (no pacer). */
  ratePerMinute: number | null;
  burst: number;
  tokens: number;
  refilledAt: number;
  pausedUntil: number | null;
}

/** The paced rate: a fraction of the window's limit, leaving room for others on the key. */
export function pacedRate(limitPerMinute: number | null, fraction: number): number | null {
  return limitPerMinute === null ? null : limitPerMinute * fraction;
}

/** Default burst: max(1, rate / 20), i.e. three seconds' worth at that rate (windows.ts passes the paced rate). */
export function defaultBurst(ratePerMinute: number | null): number {
  return ratePerMinute === null ? 0 : Math.max(1, Math.floor(ratePerMinute / 20));
}

/** Tokens in the bucket at `now`: continuous refill, capped at the burst. */
export function tokensAt(b: BucketState, now: number): number {
  if (b.ratePerMinute === null) return Number.POSITIVE_INFINITY;
  const elapsed = Math.max(0, now - b.refilledAt);
  return Math.min(b.burst, b.tokens + (elapsed * b.ratePerMinute) / 60_000);
}

/** Milliseconds until `n` tokens are there and the pause is over (0 = now). */
export function msUntilTokens(b: BucketState, now: number, n = 1): number {
  const pause = b.pausedUntil !== null && b.pausedUntil > now ? b.pausedUntil - now : 0;
  if (b.ratePerMinute === null) return pause;
  const at = Math.max(now, b.pausedUntil ?? now);
  // A paused bucket is empty (a 429 empties it), so count from zero after the pause.
  const have = pause > 0 ? 0 : tokensAt(b, now);
  const missing = Math.max(0, Math.min(n, b.burst) - have);
  return at - now + Math.ceil((missing * 60_000) / b.ratePerMinute);
}

/** Whole tokens that can be taken at `now` (none during a pause). */
export function takeable(b: BucketState, now: number): number {
  if (b.pausedUntil !== null && b.pausedUntil > now) return 0;
  const t = tokensAt(b, now);
  return t === Number.POSITIVE_INFINITY ? Number.MAX_SAFE_INTEGER : Math.floor(t + 1e-9);
}
