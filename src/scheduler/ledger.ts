/**
 * Credit ledger rules: pure. Reservations are made at dispatch and settled
 * exactly once, by the attempt's outcome (store.ts holds the SQL).
 */
import type { OutcomeKind } from '../provider/types.ts';

/**
 * Credits a settled attempt bills the tenant. Only billed successes cost
 * credits upstream, and so does a bad response (a 200 the provider billed
 * whose body was unusable); a timeout is billed by the client's documented
 * rule (TIMEOUT_BILLING, reflected in `creditsBilled`); everything else (400,
 * 401/403, 404, 429, 402, 5xx) is refunded.
 */
export function billedCredits(kind: OutcomeKind, creditsBilled: number, reserved: number): number {
  if (kind === 'billed' || kind === 'timeout' || kind === 'bad_response') return Math.min(reserved, Math.max(0, creditsBilled));
  return 0;
}

/**
 * How many of `costs` (in order) fit in the quota on top of what is billed
 * and reserved: a prefix, so jobs never jump the queue to fit.
 */
export function fitCount(billed: number, reserved: number, quota: number, costs: readonly number[]): number {
  let used = billed + reserved;
  let n = 0;
  for (const cost of costs) {
    if (used + cost > quota) break;
    used += cost;
    n++;
  }
  return n;
}
