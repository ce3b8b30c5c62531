/**
 * Credit ledger rules: pure. Reservations are made at dispatch and settled
 * exactly once, by the attempt's outcome (scheduler/sql/reservations.ts and ledger.ts hold the SQL).
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
  /** node_lost: sent, the outcome unknown; never_sent: its node never marked it sent. */
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

/** The code of a job whose attempts kept being lost (its lease expired with the call sent) past its attempt limit. */
export const ATTEMPT_LOST_CODE = 'ATTEMPT_LOST';

export function attemptLostMessage(attempt: number): string {
  return `attempt ${attempt} was lost (its worker stopped or never settled it) and the job has no attempts left; it was billed as the provider may have billed it`;
}

/**
 * What becomes of the jobs of expired attempts: a sent attempt numbered past `retryLimit` (the
 * job's last allowed attempt, as planSettlement counts them) fails the job; every other one goes
 * back to its queue. An attempt never sent never fails the job (nothing reached the provider, and
 * a node dying before it sends says nothing about the job), though it keeps its number.
 */
export function lostAttemptFates<T extends { attempt: number; sent: boolean }>(expired: readonly T[], retryLimit: number): { release: T[]; fail: T[] } {
  const release: T[] = [];
  const fail: T[] = [];
  for (const r of expired) (r.sent && r.attempt > retryLimit ? fail : release).push(r);
  return { release, fail };
}
