/**
 * What a worker does with an attempt's outcome, as pure functions.
 */
import type { Reaction } from '../provider/classify.ts';
import type { ResultRecord } from '../jobs/store.ts';
import type { CallOutcome, OutcomeKind } from '../provider/types.ts';

/** Delay before retry number `attempt` (1-based): exponential, capped. */
export function retryDelaySeconds(attempt: number, baseSeconds: number, maxSeconds = 300): number {
  return Math.min(maxSeconds, baseSeconds * 2 ** Math.max(0, attempt - 1));
}

/**
 * The error code stored on a job that ends or waits because of this outcome.
 * A bad response says whose answer was bad: UPSTREAM_BAD_RESPONSE.
 */
export function errorCodeFor(kind: OutcomeKind): string | null {
  if (kind === 'bad_response') return 'UPSTREAM_BAD_RESPONSE';
  return kind === 'billed' ? null : kind.toUpperCase();
}

/** The result row an outcome stores (its bill is added by the settlement itself, sluice_settle). */
export function resultOf(outcome: CallOutcome, attempts: number, errorCode?: string): ResultRecord {
  return {
    data: outcome.kind === 'billed' ? outcome.data : null,
    errorCode: errorCode ?? errorCodeFor(outcome.kind),
    errorMessage: outcome.message,
    httpStatus: outcome.httpStatus,
    attempts,
  };
}

export interface SettlePlan {
  /** complete → SUCCEEDED, fail → FAILED, requeue → QUEUED again after `delaySeconds`. */
  action: 'succeed' | 'fail' | 'requeue';
  delaySeconds: number;
  /** A put-back is not the job's fault: it does not use up one of its attempts. */
  countsAsAttempt: boolean;
}

/**
 * Decides the job's next state from the client's reaction and how many
 * attempts it has had. Retryable failures retry with backoff until
 * `retryLimit` retries are used, then fail; put-backs wait out the provider's
 * retry-after and never exhaust the job.
 */
export function planSettlement(reaction: Reaction, outcome: CallOutcome, attempts: number, retryLimit: number, baseDelaySeconds: number): SettlePlan {
  switch (reaction) {
    case 'complete':
      return { action: 'succeed', delaySeconds: 0, countsAsAttempt: true };
    case 'fail':
      return { action: 'fail', delaySeconds: 0, countsAsAttempt: true };
    case 'retry':
      return attempts > retryLimit
        ? { action: 'fail', delaySeconds: 0, countsAsAttempt: true }
        : { action: 'requeue', delaySeconds: retryDelaySeconds(attempts, baseDelaySeconds), countsAsAttempt: true };
    case 'put_back':
      return { action: 'requeue', delaySeconds: Math.max(1, Math.ceil(outcome.retryAfterSeconds ?? baseDelaySeconds)), countsAsAttempt: false };
  }
}
