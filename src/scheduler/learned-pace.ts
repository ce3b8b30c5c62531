/**
 * A pace learned from the provider: pure. The configured plan is what Sluice was told; the
 * provider's headers are what the key's window is now (a plan changed, or other traffic on the
 * key: ../shared/PROVIDER.md "Headers"). A pacer that never listens trips the provider's cooldown
 * again and again, so the window's shared rate (`windows.rate_per_minute`, what every node's
 * leases refill by) follows the answers:
 *
 * - **lower at once** to what the answers show × PACE_FRACTION: a window smaller than configured
 *   (`x-rate-limit-limit`), or the provider's bucket (`x-rate-limit-remaining`) falling faster than
 *   Sluice's own spend and the refill explain (others spend on the key: `otherTraffic`);
 * - **multiplicative decrease** on a rate-limit 429 (the first of a pause: one 429 episode halves
 *   once, however many calls were in flight when it tripped): `rateAfterRateLimit`;
 * - **additive increase** while answers allow more: one PACE_STEP of the configured rate per
 *   PACE_STEP_MS, never above configuration nor above the stated window × PACE_FRACTION. Any answer
 *   that is not a 429 (or a failure of the provider's own) confirms the room, with rate-limit
 *   headers or without: a provider that never states its window is found by 429s alone (AIMD), and
 *   a rate lowered by a 429 drifts back toward the configured one unless the provider confirms the
 *   lower one (a stated window, a low bucket, another 429);
 * - **slow start**: a window starts (first start, a changed configuration, or a start after
 *   SLOW_START_IDLE_MS without a lease) at PACE_START of its configured rate, with the burst
 *   scaled down, and doubles once per sample while answers confirm the room, until the ceiling or
 *   the first 429; a limit lower than configured is stated (or tripped gently) before a burst at
 *   the configured rate can trip the provider's cooldown. A pause the provider asked beyond
 *   RETRY_AFTER_MAX_SECONDS ends in a **probe**: the floor rate with a bucket of one, so one call
 *   decides whether the window opens (it then starts slowly) or pauses again;
 * - never below PACE_MIN of the configured rate, so a window always keeps probing.
 *
 * The bucket keeps its seconds' worth: the burst scales with the rate (`burstFor`), else a window
 * learned at half its configured rate would still spend a configured burst after idle.
 *
 * The provider's bucket size is estimated from the highest `remaining` seen, decaying with a
 * half-life of BUCKET_HALF_LIFE_MS (`decayedBucketSize`): one inflated answer does not make the
 * bucket look low (holding the climb) or the refill look like others' traffic for ever.
 *
 * The I/O (dispatch/pace-learner.ts) samples answers per node and applies a decision with one
 * conditional statement (scheduler/sql/windows.ts); the 429 rule is applied by the settlement's
 * pause statement, which mirrors `rateAfterRateLimit` (as sluice_lease mirrors pacer.ts).
 */

export interface PaceRules {
  /** PACE_FRACTION: the share of the provider's window Sluice uses. */
  fraction: number;
  /** PACE_STEP: one additive increase, as a share of the configured rate. */
  step: number;
  /** PACE_STEP_MS: at least this long between two changes before an increase. */
  stepMs: number;
  /** PACE_DECREASE: the rate's factor after a rate-limit 429. */
  decrease: number;
  /** PACE_MIN: the floor, as a share of the configured rate. */
  min: number;
  /** PACE_START: a slow start's first rate, as a share of the configured rate (1 = no slow start). */
  start: number;
  /** At least this long between two doublings of a slow start (PACE_SAMPLE_MS: one sample's answers). */
  startStepMs: number;
}

/** The window's rates now (calls per minute, paced). */
export interface PaceNow {
  configured: number;
  current: number;
  /** Since the rate last changed (any node); null = never. */
  sinceChangeMs: number | null;
  /** The window ramps up (pace reason START or PROBE): the rate doubles per sample, not one step. */
  starting: boolean;
}

/** What one sample of answers (on this node, since its last sample) says. */
export interface PaceEvidence {
  /** The lowest `x-rate-limit-limit` seen (calls per minute); null = none stated. */
  limit: number | null;
  /** Calls per minute others spent on the key (otherTraffic); null = not measurable. */
  otherPerMinute: number | null;
  /** The provider's bucket is low (under LOW_WATER of its size): no increase now, and a drain counts. */
  low: boolean;
  /**
   * Answers in the sample that confirm the room: any answer but a 429 or a provider failure (5xx),
   * headers or not. No increase without one.
   */
  confirmed: boolean;
}

export type PaceDecision =
  | { kind: 'hold' }
  | { kind: 'lower'; rate: number; reason: 'LIMIT' | 'DRAIN' }
  | { kind: 'raise'; rate: number; reason: 'START' | 'CLIMB' };

/**
 * Others' traffic below this share of the stated window is noise (header rounding, Sluice's calls
 * leased in one span and answered in the next), not a reason to slow down.
 */
export const DRAIN_NOISE = 0.1;
/** The provider's bucket under this share of its size is low: the pace does not climb. */
export const LOW_WATER = 0.25;
/**
 * Others' traffic is measured over spans of at least this: Sluice's own calls are counted when
 * leased and the provider's remaining when answered, so a span is off by about one lease's worth
 * of calls; over 5 s that is well under DRAIN_NOISE of any window.
 */
export const DRAIN_SPAN_MS = 5_000;

/** The provider's bucket estimate halves over this without a remaining as high (decayedBucketSize). */
export const BUCKET_HALF_LIFE_MS = 30_000;
/** A window with no lease for this long starts slowly at the next node start: the provider's window may have changed. */
export const SLOW_START_IDLE_MS = 60_000;

/** Rates closer than this (calls/min) are equal: no write for rounding. */
const EPS = 1e-6;

/** The rate never goes below this: configured × PACE_MIN. */
export function paceFloor(configured: number, r: PaceRules): number {
  return configured * r.min;
}

/** The highest rate the answers allow: the configured rate, or the stated window × PACE_FRACTION when smaller. */
export function paceCeiling(configured: number, limit: number | null, r: PaceRules): number {
  return limit === null ? configured : Math.max(paceFloor(configured, r), Math.min(configured, limit * r.fraction));
}

/** A rate-limit 429: the rate × PACE_DECREASE, not below the floor (mirrored by pauseWindow's statement). */
export function rateAfterRateLimit(current: number, configured: number, r: PaceRules): number {
  return Math.min(current, Math.max(paceFloor(configured, r), current * r.decrease));
}

/** A slow start's first rate: PACE_START of the configured rate, not below the floor. */
export function slowStartRate(configured: number, r: Pick<PaceRules, 'start' | 'min'>): number {
  return configured * Math.min(1, Math.max(r.min, r.start));
}

/**
 * The provider's bucket size as seen: the highest remaining of this sample, or the estimate so far
 * halved every BUCKET_HALF_LIFE_MS, whichever is higher (null until a remaining is seen).
 */
export function decayedBucketSize(estimate: number | null, seenMax: number | null, elapsedMs: number): number | null {
  const decayed = estimate === null ? null : estimate * 0.5 ** (Math.max(0, elapsedMs) / BUCKET_HALF_LIFE_MS);
  if (decayed === null) return seenMax;
  return seenMax === null ? decayed : Math.max(decayed, seenMax);
}

/** The bucket at a learned rate: the configured burst's seconds' worth at that rate, at least 1. */
export function burstFor(configuredBurst: number, configured: number, rate: number): number {
  if (!(configured > 0)) return configuredBurst;
  return Math.max(1, (configuredBurst * Math.min(rate, configured)) / configured);
}

/** Remaining as the provider stated it at two answers, and what Sluice itself spent between them. */
export interface RemainingSample {
  /** `x-rate-limit-remaining` at the first and the last answer. */
  from: number;
  to: number;
  spanMs: number;
  /** The stated window (calls per minute), which refills the provider's bucket. */
  limit: number;
  /** Calls Sluice (every node) took from the window's bucket over the same span. */
  ownCalls: number;
  /** The provider's bucket size as seen: the highest remaining stated so far. */
  bucketSize: number;
}

/**
 * Calls per minute the provider's bucket lost beyond Sluice's own calls: what others spend on the
 * key. The bucket refills at the stated limit, so over a span
 *   to = from + limit × span − own − others,
 * which holds while the bucket is not full (a full bucket drops its refill, which would read as
 * others' calls). Null when not measurable: a span under DRAIN_SPAN_MS, or the bucket full at either end.
 * Never negative (a bucket refilling faster than expected is Sluice's own calls counted late).
 */
export function otherTraffic(s: RemainingSample): number | null {
  if (!(s.spanMs >= DRAIN_SPAN_MS) || !(s.limit > 0)) return null;
  // Full at either end: it may have been full in between, dropping refill that would read as others' calls.
  if (s.from >= s.bucketSize - 1 || s.to >= s.bucketSize - 1) return null;
  const others = s.from - s.to + (s.limit * s.spanMs) / 60_000 - s.ownCalls;
  return Math.max(0, (others * 60_000) / s.spanMs);
}

/** Whether the provider's bucket is low: under LOW_WATER of the biggest remaining seen. */
export function bucketLow(remaining: number | null, bucketSize: number | null): boolean {
  return remaining !== null && bucketSize !== null && bucketSize > 0 && remaining < bucketSize * LOW_WATER;
}

/**
 * The decision of one sample: lower to the stated window × fraction when above it; lower to what
 * others leave × fraction when others drain the key; else, with answers that confirm the room and
 * the rate below what they allow, double it while starting (once per startStepMs; reaching the
 * ceiling ends the start) or climb one step once the last change is PACE_STEP_MS old; else hold.
 */
export function planPace(now: PaceNow, ev: PaceEvidence, r: PaceRules): PaceDecision {
  const floor = paceFloor(now.configured, r);
  const ceiling = paceCeiling(now.configured, ev.limit, r);
  if (now.current > ceiling + EPS) return { kind: 'lower', rate: ceiling, reason: 'LIMIT' };
  // Others' traffic is an estimate from headers that lag by the call's latency: it lowers the pace
  // only once the provider's bucket is low too, i.e. when the drain is real and near a 429.
  if (ev.limit !== null && ev.otherPerMinute !== null && ev.low && ev.otherPerMinute > ev.limit * DRAIN_NOISE) {
    const target = Math.max(floor, Math.min(ceiling, (ev.limit - ev.otherPerMinute) * r.fraction));
    if (target < now.current - EPS) return { kind: 'lower', rate: target, reason: 'DRAIN' };
    return { kind: 'hold' };
  }
  if (ev.low || !ev.confirmed) return { kind: 'hold' };
  const since = (ms: number) => now.sinceChangeMs === null || now.sinceChangeMs >= ms;
  if (now.starting && since(r.startStepMs)) {
    const rate = Math.min(ceiling, Math.max(now.current * 2, floor));
    // At the ceiling the start is over (CLIMB: what the answers allow), even without a change of rate.
    return { kind: 'raise', rate, reason: rate >= ceiling - EPS ? 'CLIMB' : 'START' };
  }
  if (!now.starting && now.current < ceiling - EPS && since(r.stepMs)) {
    return { kind: 'raise', rate: Math.min(ceiling, now.current + now.configured * r.step), reason: 'CLIMB' };
  }
  return { kind: 'hold' };
}
