/**
 * Why a queue's head job is waiting, and when work will be done: pure.
 */
export const WAIT_REASONS = ['SUSPENDED', 'SCHEDULED', 'CREDITS_EXHAUSTED', 'KEY_UNUSABLE', 'WINDOW_PAUSED', 'BREAKER_OPEN', 'QUOTA', 'CAP', 'RATE'] as const;
export type WaitReason = (typeof WAIT_REASONS)[number];

export interface WaitFacts {
  depth: number;
  /** The tenant is suspended: its jobs are held until it is resumed. */
  suspended?: boolean;
  /** Every queued job is not due yet (its runAt, or a retry's delay, is ahead). */
  scheduled?: boolean;
  /** The account is stopped (credits exhausted) until later. */
  accountStopped: boolean;
  /** The class's window is stopped because its key is unusable. */
  keyUnusable: boolean;
  /** The class's window is paused (rate limit). */
  windowPaused: boolean;
  /** The breaker of the head job's API is open. */
  breakerOpen: boolean;
  quotaBlocked: boolean;
  inFlight: number;
  cap: number;
}

/**
 * The most fundamental reason first: a suspension, then jobs not due yet
 * (SCHEDULED: nothing else matters before then), nothing account-wide, then the window,
 * the API, the tenant's quota, its cap; otherwise it waits its turn in the
 * pace (RATE). null when nothing waits.
 */
export function waitReason(f: WaitFacts): WaitReason | null {
  if (f.depth <= 0) return null;
  if (f.suspended) return 'SUSPENDED';
  if (f.scheduled) return 'SCHEDULED';
  if (f.accountStopped) return 'CREDITS_EXHAUSTED';
  if (f.keyUnusable) return 'KEY_UNUSABLE';
  if (f.windowPaused) return 'WINDOW_PAUSED';
  if (f.breakerOpen) return 'BREAKER_OPEN';
  if (f.quotaBlocked) return 'QUOTA';
  if (f.inFlight >= f.cap) return 'CAP';
  return 'RATE';
}

/** Drain time (Little's law): backlog / rate, in seconds; null when nothing drains it. */
export function drainSeconds(depth: number, perSecond: number): number | null {
  if (depth <= 0) return 0;
  if (!(perSecond > 0)) return null;
  return depth / perSecond;
}
