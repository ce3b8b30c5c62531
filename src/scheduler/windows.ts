/**
 * Which windows exist and which classes use them: pure, from configuration.
 *
 * A window is one upstream key (the primary key, or a sub-key), with its own
 * rate limit upstream and so its own pacer here. By default INTERACTIVE gets
 * the first sub-key to itself when one exists (a bulk import cannot spend the
 * window live requests depend on), and everything else shares the primary.
 */
import { PLANS, type PlanName } from '../config/plans.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';
import { defaultBurst, pacedRate } from './pacer.ts';

export interface WindowSpec {
  /** `primary`, `sub1`, `sub2`, … */
  name: string;
  apiKey: string;
  /** The key's limit upstream (calls/min); null = no per-minute ceiling. */
  limitPerMinute: number | null;
  /** What Sluice paces to: limit × PACE_FRACTION. */
  pacedPerMinute: number | null;
  burst: number;
  /** This window's share of the plan's concurrent-call limit. */
  concurrentLimit: number;
  classes: JobClass[];
}

export interface WindowConfig {
  plan: PlanName;
  ratePerMinute?: number | undefined;
  concurrentCalls?: number | undefined;
  paceFraction: number;
  burst?: number | undefined;
  primaryKey: string;
  subKeys: readonly string[];
  /** `CLASS=window` pairs; absent classes take the default. */
  classWindows: Partial<Record<JobClass, string>>;
}

export function windowNames(subKeys: readonly string[]): string[] {
  return ['primary', ...subKeys.map((_, i) => `sub${i + 1}`)];
}

export function defaultClassWindows(subKeys: readonly string[]): Record<JobClass, string> {
  return {
    INTERACTIVE: subKeys.length > 0 ? 'sub1' : 'primary',
    STANDARD: 'primary',
    BULK: 'primary',
  };
}

/** Parses `INTERACTIVE=sub1,BULK=sub2`; throws naming a bad class or window. */
export function parseClassWindows(text: string, subKeys: readonly string[]): Partial<Record<JobClass, string>> {
  const names = windowNames(subKeys);
  const out: Partial<Record<JobClass, string>> = {};
  for (const part of text.split(',').map((s) => s.trim()).filter(Boolean)) {
    const [cls, win] = part.split('=').map((s) => s.trim());
    if (!(CLASSES as readonly string[]).includes(cls ?? '')) throw new Error(`unknown class "${cls}" (use ${CLASSES.join(', ')})`);
    if (!names.includes(win ?? '')) throw new Error(`unknown window "${win}" (have ${names.join(', ')})`);
    out[cls as JobClass] = win!;
  }
  return out;
}

export function planWindows(c: WindowConfig): WindowSpec[] {
  const plan = PLANS[c.plan];
  const limit = c.ratePerMinute ?? plan.ratePerMinute;
  const map = { ...defaultClassWindows(c.subKeys), ...c.classWindows };
  const keys = [c.primaryKey, ...c.subKeys];
  const used = windowNames(c.subKeys)
    .map((name, i) => ({ name, apiKey: keys[i]!, classes: CLASSES.filter((cls) => map[cls] === name) }))
    .filter((w) => w.classes.length > 0);
  // The plan's concurrent-call limit is per account: split it between the windows in use.
  const concurrent = c.concurrentCalls ?? plan.concurrentCalls;
  const share = Math.max(1, Math.floor(concurrent / used.length));
  return used.map((w) => ({
    ...w,
    limitPerMinute: limit,
    pacedPerMinute: pacedRate(limit, c.paceFraction),
    // Three seconds at the PACED rate, not at the limit: the provider counts a call when it
    // arrives, Sluice when it leases it, and transit jitter J between the two lets up to
    // paced rate x J calls land in a shorter span than they were leased in. Over long spans the
    // pace's headroom absorbs that; right after a burst has emptied both buckets only burst
    // headroom can (seen: 2 rate-limit 429s in 2 of 4 fairness runs with the provider's full burst,
    // each pausing every node). Also, the provider's bucket size is not published (PROVIDER.md).
    burst: c.burst ?? defaultBurst(pacedRate(limit, c.paceFraction)),
    concurrentLimit: share,
  }));
}
