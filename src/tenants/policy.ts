/**
 * A tenant's effective limits: its tier's defaults with its own overrides on
 * top, and its quota period. Pure functions: the scheduler, admission and the
 * API all read limits through here so they never disagree.
 */
import { TIERS, type TierName } from '../config/tiers.ts';

export interface TenantRecord {
  id: string;
  name: string;
  tier: TierName;
  weight: number | null;
  concurrencyCap: number | null;
  monthlyQuota: number | null;
  queueBound: number | null;
  /** Request budget overrides (cost points; null: the tier's). Absent in records built before they existed. */
  requestBurst?: number | null;
  requestRate?: number | null;
  quotaPolicy: 'WAIT' | 'FAIL';
  periodAnchor: Date;
  createdAt: Date;
  /** Set while suspended (submissions refused, dispatch skips it); absent or null: active. */
  suspendedAt?: Date | null;
  /** Fraction (0 to 1) of a window's dispatches guaranteed while backlogged; null or absent: none. */
  reservedShare?: number | null;
}

export interface EffectiveLimits {
  weight: number;
  concurrencyCap: number;
  monthlyQuota: number;
  queueBound: number;
}

export interface RequestBudgetLimits {
  /** Cost points the bucket holds when full. */
  burst: number;
  /** Cost points restored per second. */
  rate: number;
}

export function requestBudgetLimits(t: Pick<TenantRecord, 'tier' | 'requestBurst' | 'requestRate'>): RequestBudgetLimits {
  const tier = TIERS[t.tier];
  return { burst: t.requestBurst ?? tier.requestBurst, rate: t.requestRate ?? tier.requestRate };
}

export function effectiveLimits(t: Pick<TenantRecord, 'tier' | 'weight' | 'concurrencyCap' | 'monthlyQuota' | 'queueBound'>): EffectiveLimits {
  const tier = TIERS[t.tier];
  return {
    weight: t.weight ?? tier.weight,
    concurrencyCap: t.concurrencyCap ?? tier.concurrencyCap,
    monthlyQuota: t.monthlyQuota ?? tier.monthlyQuota,
    queueBound: t.queueBound ?? tier.queueBound,
  };
}

/**
 * Adds calendar months in UTC, clamping to the month's last day, so an anchor
 * on the 31st renews on the 30th in April and on the 28th/29th in February.
 */
function addMonthsClamped(anchor: Date, months: number): Date {
  const y = anchor.getUTCFullYear();
  const m = anchor.getUTCMonth() + months;
  const lastDay = new Date(Date.UTC(y, m + 1, 0)).getUTCDate();
  const day = Math.min(anchor.getUTCDate(), lastDay);
  return new Date(
    Date.UTC(y, m, day, anchor.getUTCHours(), anchor.getUTCMinutes(), anchor.getUTCSeconds(), anchor.getUTCMilliseconds()),
  );
}

/** The monthly period containing `now`, starting on the anchor's anniversary. */
export function quotaPeriod(anchor: Date, now: Date): { start: Date; end: Date } {
  let months = (now.getUTCFullYear() - anchor.getUTCFullYear()) * 12 + (now.getUTCMonth() - anchor.getUTCMonth());
  if (addMonthsClamped(anchor, months) > now) months -= 1;
  months = Math.max(0, months);
  return { start: addMonthsClamped(anchor, months), end: addMonthsClamped(anchor, months + 1) };
}
