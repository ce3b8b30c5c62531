/**
 * One verdict of the system's health for the operator console's strip, and how
 * much of each window's pace is used. Pure: they read a systemStatus answer.
 *
 *  - STOPPED: nothing is dispatched (the account is out of credits, or every
 *    window with a pace is paused);
 *  - DEGRADED: something holds part of the work back or needs a look (a paused
 *    window, a breaker that is not closed, an active alert);
 *  - HEALTHY: none of these.
 */
import type { SystemStatus } from './status.ts';

export const HEALTH_STATUSES = ['HEALTHY', 'DEGRADED', 'STOPPED'] as const;
export type HealthStatus = (typeof HEALTH_STATUSES)[number];

export interface Health {
  status: HealthStatus;
  /** Why, most fundamental first; for HEALTHY, what was checked. */
  reasons: string[];
}

const when = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');

export function systemHealth(s: Pick<SystemStatus, 'account' | 'windows' | 'breakers' | 'alerts'>): Health {
  const stopped: string[] = [];
  const degraded: string[] = [];
  if (s.account.dispatchStoppedUntil !== null) {
    stopped.push(`Dispatch stopped until ${when(s.account.dispatchStoppedUntil.getTime())}${s.account.stopReason ? ` (${s.account.stopReason})` : ''}`);
  }
  const paused = s.windows.filter((w) => w.pausedUntil !== null && w.pausedUntil > w.dbNow);
  if (paused.length > 0 && paused.length === s.windows.length) stopped.push(`Every window is paused (${paused.map((w) => `${w.name}: ${w.pauseReason ?? 'paused'}`).join(', ')})`);
  else for (const w of paused) degraded.push(`Window ${w.name} paused (${w.pauseReason ?? 'paused'}) until ${when(w.pausedUntil!)}`);
  for (const b of s.breakers) if (b.state !== 'CLOSED') degraded.push(`Breaker of ${b.api} is ${b.state}`);
  for (const a of s.alerts) degraded.push(`Alert ${a.key}: ${a.message}`);
  if (stopped.length > 0) return { status: 'STOPPED', reasons: [...stopped, ...degraded] };
  if (degraded.length > 0) return { status: 'DEGRADED', reasons: degraded };
  return { status: 'HEALTHY', reasons: [`${s.windows.length} window${s.windows.length === 1 ? '' : 's'} open, no breaker open, no active alert`] };
}

/** Share of a window's paced rate its calls use now (0.5 = half); null for an unlimited window. */
export function paceUsed(w: { ratePerMinute: number | null; callsPerSecond: number }): number | null {
  if (w.ratePerMinute === null || w.ratePerMinute <= 0) return null;
  return w.callsPerSecond / (w.ratePerMinute / 60);
}
