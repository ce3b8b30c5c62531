/**
 * Circuit breakers per upstream API (cockatiel): when an API's calls fail
 * with 5xx or time out above a threshold, its breaker opens and its jobs wait
 * (put back, not failed) while every other API keeps its throughput; after
 * `halfOpenAfterMs` one probe call goes, and its success closes the breaker.
 *
 * Each worker process keeps its own breakers (every node sees the same
 * failing API, so each trips on its own within a few calls); the sweeper
 * publishes their states for the admin view and the alerts.
 */
import { CircuitState, CountBreaker, circuitBreaker, handleWhenResult, isBrokenCircuitError, type CircuitBreakerPolicy } from 'cockatiel';
import type { CallOutcome } from '../provider/types.ts';

export type BreakerState = 'CLOSED' | 'OPEN' | 'HALF_OPEN';

export interface BreakerConfig {
  /** Share of failed calls (0..1) in the window that opens the breaker. */
  threshold: number;
  /** Calls in the sliding window. */
  size: number;
  /** Fewer calls than this never open it. */
  minimumCalls: number;
  halfOpenAfterMs: number;
}

/** The outcomes that count against an API's health. Rate limits and credits are the account's, not the API's. */
export function isApiFailure(o: Pick<CallOutcome, 'kind'>): boolean {
  return o.kind === 'server_error' || o.kind === 'timeout';
}

function toState(s: CircuitState): BreakerState {
  return s === CircuitState.Open || s === CircuitState.Isolated ? 'OPEN' : s === CircuitState.HalfOpen ? 'HALF_OPEN' : 'CLOSED';
}

/** Thrown instead of calling when the API's breaker is open. */
export class BreakerOpen extends Error {
  override name = 'BreakerOpen';
  readonly api: string;
  constructor(api: string) {
    super(`the circuit breaker for ${api} is open`);
    this.api = api;
  }
}

export class Breakers {
  private readonly policies = new Map<string, CircuitBreakerPolicy>();
  private readonly openedAt = new Map<string, number>();
  private readonly config: BreakerConfig;
  constructor(config: BreakerConfig) {
    this.config = config;
  }

  private policy(api: string): CircuitBreakerPolicy {
    let p = this.policies.get(api);
    if (!p) {
      p = circuitBreaker(handleWhenResult((r) => isApiFailure(r as CallOutcome)), {
        halfOpenAfter: this.config.halfOpenAfterMs,
        breaker: new CountBreaker({ threshold: this.config.threshold, size: this.config.size, minimumNumberOfCalls: this.config.minimumCalls }),
      });
      p.onBreak(() => this.openedAt.set(api, Date.now()));
      p.onReset(() => this.openedAt.delete(api));
      this.policies.set(api, p);
    }
    return p;
  }

  /** Runs the call through the API's breaker; throws BreakerOpen instead of calling when it is open. */
  async run(api: string, call: () => Promise<CallOutcome>): Promise<CallOutcome> {
    try {
      return await this.policy(api).execute(call);
    } catch (err) {
      if (isBrokenCircuitError(err)) throw new BreakerOpen(api);
      throw err;
    } finally {
      this.probing.delete(api);
    }
  }

  private readonly probing = new Set<string>();

  /**
   * Whether to dispatch a job for `api` now. Closed: yes. Open: no, until
   * its half-open time; then exactly one job goes as the probe, and the rest
   * wait for its verdict, so a failing API never spends more than one pacer
   * token per probe interval.
   */
  admit(api: string): 'go' | 'probe' | 'hold' {
    const p = this.policies.get(api);
    if (!p || p.state === CircuitState.Closed) return 'go';
    if (p.state === CircuitState.Open && Date.now() - (this.openedAt.get(api) ?? 0) < this.config.halfOpenAfterMs) return 'hold';
    if (this.probing.has(api)) return 'hold';
    this.probing.add(api);
    return 'probe';
  }

  /** A probe that was admitted but never sent (its lease rolled back): let another go. */
  release(api: string): void {
    this.probing.delete(api);
  }

  /** Whether jobs for `api` are being held back (open, or half-open with its probe out). */
  isOpen(api: string): boolean {
    const p = this.policies.get(api);
    if (!p || p.state === CircuitState.Closed) return false;
    if (p.state === CircuitState.Open && Date.now() - (this.openedAt.get(api) ?? 0) < this.config.halfOpenAfterMs) return true;
    return this.probing.has(api);
  }

  /** When an open breaker lets its probe through (ms epoch), or null. */
  retryAt(api: string): number | null {
    const since = this.openedAt.get(api);
    return since === undefined ? null : since + this.config.halfOpenAfterMs;
  }

  states(): Array<{ api: string; state: BreakerState }> {
    return [...this.policies].map(([api, p]) => ({ api, state: toState(p.state) }));
  }
}
