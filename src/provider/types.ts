/**
 * The contract between Sluice and the upstream provider client: what a call
 * returns. Every response is classified into exactly one outcome kind, so the
 * worker, the pacer, the ledger and the breaker can each act on it without
 * reading HTTP details.
 */

/** What the provider's headers said about the account and the key's window. */
export interface ProviderStatus {
  /** x-api-remaining-credits; may be negative. */
  remainingCredits: number | null;
  /** x-api-max-credits */
  maxCredits: number | null;
  /** x-api-credits-used */
  creditsUsed: number | null;
  /** x-api-renewal, Unix seconds, as a Date. */
  renewalAt: Date | null;
  /** x-rate-limit-limit */
  rateLimitLimit: number | null;
  /** x-rate-limit-remaining */
  rateLimitRemaining: number | null;
  /** x-api-current-plan */
  plan: string | null;
  observedAt: Date;
}

export type OutcomeKind =
  | 'billed' // 200: the call succeeded and was billed
  | 'rate_limited' // 429 with credits left: the key's window is spent
  | 'credits_exhausted' // 429 with remaining credits <= 0, or 402
  | 'bad_input' // 400
  | 'key_unusable' // 401 / 403 (deactivated, suspended, out of scope)
  | 'unknown_api' // 404
  | 'bad_response' // 200 that is not the provider's envelope, not JSON/UTF-8, or over MAX_RESULT_BYTES: billed, final
  | 'server_error' // 5xx, or a 200 whose envelope says error: retryable
  | 'timeout'; // no answer within the client's timeout: retryable, may have been billed

interface OutcomeBase {
  kind: OutcomeKind;
  /** HTTP status, or null when no response arrived (timeout, connection error). */
  httpStatus: number | null;
  /**
   * Credits the ledger should count as billed for this call: the catalog cost
   * on `billed`; 0 on any other answer; on no answer (timeout, connection lost
   * after sending) the cost or 0 per the client's `timeoutBilling`; on an
   * unusable 2xx (bad_response, or an error envelope) the cost (the provider
   * billed it). Rule: src/provider/classify.ts.
   */
  creditsBilled: number;
  /**
   * True when `creditsBilled` is the timeout rule's guess (no answer to a
   * request that was sent); absent when the bill is known (an answer, or a
   * request never written). A late settlement corrects an expiry's bill only
   * with a known one.
   */
  billedIsGuess?: boolean;
  /**
   * Upstream data on success, storable as it is (no U+0000, no lone
   * surrogate: each became U+FFFD); null otherwise.
   */
  data: unknown;
  /** Upstream or client error message (storable, like `data`); null on success. */
  message: string | null;
  /** Parsed headers; null when no response arrived. */
  status: ProviderStatus | null;
  /**
   * Seconds to wait before this key may be used again (rate_limited, sometimes server_error), at
   * most RETRY_AFTER_MAX_SECONDS: the provider's ask is a hint, never an order to stop for long.
   */
  retryAfterSeconds: number | null;
  /** Set when the provider asked for longer than the cap: what it asked (for the alert naming it). */
  askedRetryAfterSeconds?: number;
  /** Wall time of the call. */
  latencyMs: number;
}

export type CallOutcome = OutcomeBase;

/** One item of a batch call, in request order. */
export interface BatchItem {
  /** Caller's id for the item, echoed back in the result. */
  id: string;
  params: Record<string, unknown>;
}

export interface BatchItemOutcome extends Omit<OutcomeBase, 'status' | 'latencyMs'> {
  id: string;
}

export interface BatchOutcome {
  /**
   * Outcome of the HTTP call as a whole (billed when the batch itself was
   * answered with 200). Its creditsBilled is the total of the items' (or, with
   * no usable answer, the worst case for all items): count either it or the
   * items, never both.
   */
  call: CallOutcome;
  /** Per-item outcomes, present only when the call as a whole got a 200. */
  items: BatchItemOutcome[];
}

export interface CallRequest {
  api: string;
  params: Record<string, unknown>;
  /** The upstream key (window) to call with. */
  apiKey: string;
  /** Overrides the client's default timeout. */
  timeoutMs?: number;
  signal?: AbortSignal;
  /**
   * Called once, just before the first byte of the request can leave (never after a throw that
   * came before it). The dispatcher settles a call that threw before it as "nothing sent"
   * (refunded, put back) and one that threw after it as "maybe billed" (the timeout rule), so a
   * client (or a wrapper) that sends must call it first.
   */
  onSent?: () => void;
  /**
   * Trace this call (tracing on): a CLIENT span under `parent` (a traceparent), or a trace of its
   * own linked to each of `links` (a batch's jobs); its traceparent goes to the provider.
   */
  trace?: { parent?: string | null; links?: Array<{ traceparent: string; attributes?: Record<string, string | number> }> };
}

export interface ProviderClient {
  call(req: CallRequest): Promise<CallOutcome>;
  callBatch(req: Omit<CallRequest, 'params'> & { items: BatchItem[] }): Promise<BatchOutcome>;
  /** The newest provider status seen on any response (account-wide fields) per key. */
  lastStatus(apiKey?: string): ProviderStatus | null;
  close(): Promise<void>;
}
