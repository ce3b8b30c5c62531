/**
 * The provider's limit arithmetic as pure functions: the per-key token bucket
 * and cooldown, and the account's credit balance and renewal. No clocks, no
 * I/O: every function takes `nowMs` and returns new state, so the engine (and
 * tests) drive time explicitly.
 */

export interface Bucket {
  /** Tokens available at `atMs` (fractional: the bucket refills continuously). */
  tokens: number;
  atMs: number;
}

export interface RateConfig {
  /** null = no per-minute ceiling (Mega): no bucket, no cooldown. */
  ratePerMinute: number | null;
  /** Bucket capacity (also its content at start). */
  burst: number;
  /** How long a key that tripped the limit is refused; each refused call restarts it. */
  cooldownMs: number;
}

/** One key's rate window. */
export interface Window {
  bucket: Bucket;
  /** Refuse everything before this instant (0 = not in cooldown). */
  cooldownUntilMs: number;
}

/**
 * Default burst: three seconds' worth of refill, at least 1 (the lesson's
 * pacer uses the same, `max(1, round(perMinute / 20))`). The real provider's
 * burst is not published; this is an assumption and is configurable.
 */
export function defaultBurst(ratePerMinute: number | null): number {
  if (ratePerMinute === null) return 0;
  return Math.max(1, Math.round(ratePerMinute / 20));
}

export function newWindow(cfg: RateConfig, nowMs: number): Window {
  return { bucket: { tokens: cfg.burst, atMs: nowMs }, cooldownUntilMs: 0 };
}

/** The bucket at `nowMs`: refilled at ratePerMinute/60000 tokens per ms, capped at burst. */
export function refill(b: Bucket, nowMs: number, cfg: RateConfig): Bucket {
  if (cfg.ratePerMinute === null) return { tokens: cfg.burst, atMs: nowMs };
  const elapsed = Math.max(0, nowMs - b.atMs);
  const tokens = Math.min(cfg.burst, b.tokens + (elapsed * cfg.ratePerMinute) / 60_000);
  return { tokens, atMs: Math.max(b.atMs, nowMs) };
}

/** Milliseconds until a (refilled) bucket holds `n` tokens; 0 if it already does, Infinity if never. */
export function msUntilTokens(b: Bucket, n: number, cfg: RateConfig): number {
  if (b.tokens >= n) return 0;
  if (cfg.ratePerMinute === null) return 0;
  if (cfg.ratePerMinute <= 0 || n > cfg.burst) return Number.POSITIVE_INFINITY;
  return ((n - b.tokens) * 60_000) / cfg.ratePerMinute;
}

function toRetrySeconds(ms: number): number {
  return Number.isFinite(ms) ? Math.max(1, Math.ceil(ms / 1000)) : 3600;
}

export type CooldownCheck =
  | { inCooldown: false }
  | { inCooldown: true; window: Window; retryAfterSeconds: number };

/** A call while the key is cooling down is refused and restarts the cooldown. */
export function checkCooldown(w: Window, nowMs: number, cfg: RateConfig): CooldownCheck {
  if (cfg.ratePerMinute === null || nowMs >= w.cooldownUntilMs) return { inCooldown: false };
  const until = Math.max(w.cooldownUntilMs, nowMs + cfg.cooldownMs);
  return { inCooldown: true, window: { ...w, cooldownUntilMs: until }, retryAfterSeconds: toRetrySeconds(until - nowMs) };
}

export type TakeResult =
  | { ok: true; window: Window; remaining: number | null }
  | { ok: false; window: Window; retryAfterSeconds: number };

/**
 * Takes one token. Without one, the key trips: it enters the cooldown and the
 * caller is told to wait for the longer of the cooldown and the next token.
 */
export function takeToken(w: Window, nowMs: number, cfg: RateConfig): TakeResult {
  if (cfg.ratePerMinute === null) return { ok: true, window: w, remaining: null };
  const bucket = refill(w.bucket, nowMs, cfg);
  if (bucket.tokens >= 1) {
    const next = { tokens: bucket.tokens - 1, atMs: bucket.atMs };
    return { ok: true, window: { ...w, bucket: next }, remaining: Math.floor(next.tokens) };
  }
  const waitMs = Math.max(cfg.cooldownMs, msUntilTokens(bucket, 1, cfg));
  return { ok: false, window: { bucket, cooldownUntilMs: nowMs + cfg.cooldownMs }, retryAfterSeconds: toRetrySeconds(waitMs) };
}

export interface BatchTake {
  window: Window;
  /** How many of the n items got a token (always the first ones, in request order). */
  granted: number;
  /** For each refused item (in order), seconds until a token would be there for it. */
  retryAfterSeconds: number[];
  remaining: number | null;
}

/**
 * Takes one token per item of a batch. Items beyond the bucket's content are
 * refused, each told when its token would come (the k-th refused item waits
 * for k more tokens). With `tripCooldown` a refusal also starts the cooldown
 * and every refused item waits at least that long.
 */
export function takeTokens(w: Window, n: number, nowMs: number, cfg: RateConfig, tripCooldown: boolean): BatchTake {
  if (cfg.ratePerMinute === null) return { window: w, granted: n, retryAfterSeconds: [], remaining: null };
  const bucket = refill(w.bucket, nowMs, cfg);
  const granted = Math.min(n, Math.floor(bucket.tokens));
  const after: Bucket = { tokens: bucket.tokens - granted, atMs: bucket.atMs };
  const refused = n - granted;
  const retryAfterSeconds: number[] = [];
  for (let k = 1; k <= refused; k++) {
    const ms = cfg.ratePerMinute > 0 ? ((k - after.tokens) * 60_000) / cfg.ratePerMinute : Number.POSITIVE_INFINITY;
    retryAfterSeconds.push(toRetrySeconds(tripCooldown ? Math.max(ms, cfg.cooldownMs) : ms));
  }
  const cooldownUntilMs = refused > 0 && tripCooldown ? nowMs + cfg.cooldownMs : w.cooldownUntilMs;
  return { window: { bucket: after, cooldownUntilMs }, granted, retryAfterSeconds, remaining: Math.floor(after.tokens) };
}

/**
 * A rate change refills at the old rate up to now, then caps at the new
 * burst; a running cooldown is cut to the new cooldown length if that is shorter.
 */
export function reconfigureWindow(w: Window, nowMs: number, oldCfg: RateConfig, newCfg: RateConfig): Window {
  const bucket = refill(w.bucket, nowMs, oldCfg);
  const tokens = newCfg.ratePerMinute === null ? newCfg.burst : Math.min(newCfg.burst, bucket.tokens);
  const cooldownUntilMs = newCfg.ratePerMinute === null ? 0 : Math.min(w.cooldownUntilMs, nowMs + newCfg.cooldownMs);
  return { bucket: { tokens, atMs: nowMs }, cooldownUntilMs };
}

// ---------------------------------------------------------------- credits

export interface Credits {
  /** Remaining credits; may go negative (a call is let through while the balance is > 0 and billed in full). */
  balance: number;
  /** Credits billed since the last renewal. */
  used: number;
  /** The plan's monthly allowance (what a renewal restores). */
  max: number;
  renewalAtMs: number;
}

/** Same day of month, one month on, in UTC; clamped to the month's last day (Jan 31 → Feb 28/29). */
export function addMonthUtc(ms: number): number {
  const d = new Date(ms);
  const day = d.getUTCDate();
  const next = new Date(ms);
  next.setUTCDate(1);
  next.setUTCMonth(next.getUTCMonth() + 1);
  const lastDay = new Date(Date.UTC(next.getUTCFullYear(), next.getUTCMonth() + 1, 0)).getUTCDate();
  next.setUTCDate(Math.min(day, lastDay));
  return next.getTime();
}

/** Renewal: once `nowMs` reaches the renewal instant, the balance resets to max and the next renewal is a month on. */
export function renewIfDue(c: Credits, nowMs: number): Credits {
  if (nowMs < c.renewalAtMs) return c;
  let renewalAtMs = c.renewalAtMs;
  while (nowMs >= renewalAtMs) renewalAtMs = addMonthUtc(renewalAtMs);
  return { ...c, balance: c.max, used: 0, renewalAtMs };
}

/** A call may run while the balance is above zero (so a dear call can take it negative, e.g. 1 - 5 = -4). */
export function canSpend(c: Credits): boolean {
  return c.balance > 0;
}

export function bill(c: Credits, cost: number): Credits {
  return { ...c, balance: c.balance - cost, used: c.used + cost };
}
