/**
 * Credit ledger rules: pure. Reservations are made at dispatch and settled
 * exactly once, by the attempt's outcome (store.ts holds the SQL).
 */
/**
 * Credits a settled attempt bills the tenant: what the client's
 * classification says the provider billed (provider/classify.ts holds the one
 * billing rule), within [0, reserved]. That is the cost for a billed success,
 * for an unusable 2xx (bad_response: the provider billed it) and, by the
 * timeout rule (TIMEOUT_BILLING), for a sent request that got no answer,
 * whatever kind it is classified as (a timeout, or a reset mid-call); and 0
 * for every refusal (400, 401/403, 404, 429, 402, 5xx) and for a request that
 * was never written. `kind` no longer decides: zeroing every kind but billed
 * and timeout refunded an unreadable 2xx and a reset after sending, which the
 * provider had billed; the outcome's kind is not an argument any more.
 */
export function billedCredits(creditsBilled: number, reserved: number): number {
  return Math.min(reserved, Math.max(0, creditsBilled));
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

/** How the sweeper settles an attempt whose lease expired without a settlement. */
export interface ExpirySettlement {
  billed: number;
  /** node_lost: sent, the outcome unknown; never_sent: its node never marked it sent (0028). */
  outcome: 'node_lost' | 'never_sent';
}

/**
 * An expired attempt's bill. Never marked sent (the lease's rows never reached
 * its node, or the node died before sending): nothing went upstream, refunded.
 * Sent: the outcome is unknown, billed by the timeout rule.
 */
export function expirySettlement(credits: number, sent: boolean, timeoutBilling: 'billed' | 'refunded'): ExpirySettlement {
  if (!sent) return { billed: 0, outcome: 'never_sent' };
  return { billed: billedCredits(timeoutBilling === 'billed' ? credits : 0, credits), outcome: 'node_lost' };
}
