/**
 * What a worker does with an attempt's outcome, as pure functions.
 */
import type { Reaction } from '../provider/classify.ts';
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

/** A job's result (on its jobs row; written with the state change that ends an attempt: jobs/store.ts and the settlement's functions). */
export interface ResultRecord {
  data: unknown;
  errorCode: string | null;
  errorMessage: string | null;
  httpStatus: number | null;
}

/** The result an outcome stores on its job's row (its bill is added by the settlement itself, sluice_settle). */
export function resultOf(outcome: CallOutcome, errorCode?: string): ResultRecord {
  return {
    data: outcome.kind === 'billed' ? outcome.data : null,
    errorCode: errorCode ?? errorCodeFor(outcome.kind),
    errorMessage: outcome.message,
    httpStatus: outcome.httpStatus,
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

/** The longest a plan's credit period runs (a month, and a day of slack): a renewal later than this is not believed. */
export const MAX_RENEWAL_SECONDS = 32 * 86_400;

/**
 * Until when credits exhausted stops dispatch: the provider's renewal time when it gave a
 * believable one (in the future, within MAX_RENEWAL_SECONDS: a monthly plan renews within a
 * month), else `fallbackSeconds` (CREDITS_STOP_SECONDS). A renewal header decades away must not
 * stop the account for decades. Pure.
 */
export function creditsStopUntil(renewalAt: Date | null, nowMs: number, fallbackSeconds: number): Date {
  const renewal = renewalAt?.getTime();
  if (renewal !== undefined && renewal > nowMs && renewal <= nowMs + MAX_RENEWAL_SECONDS * 1000) return new Date(renewal);
  return new Date(nowMs + fallbackSeconds * 1000);
}
