/**
 * Pure classification of provider answers into outcome kinds, and the
 * worker's reaction to each kind. No I/O: the client feeds it what came off
 * the wire (or what did not), tests feed it literals.
 *
 * Billing rule (what `creditsBilled` says):
 * - A 2xx answer bills the catalog cost of the API (the cost map), not a
 *   difference of `x-api-credits-used` headers: with concurrent calls on one
 *   account, the header delta between two responses mixes other calls' bills,
 *   and the provider sends no per-call figure. If a per-call header ever
 *   appears, this is the one place to read it.
 * - A 2xx is billed whatever its body (the provider did the work and billed
 *   it). One that is not the provider's envelope (HTML, truncated or not
 *   JSON at all), not UTF-8, over the size limit (MAX_RESULT_BYTES) or nested
 *   beyond MAX_DATA_DEPTH is `bad_response`: FINAL, the job fails with
 *   UPSTREAM_BAD_RESPONSE, never retried (the same call would most likely
 *   get the same answer and be billed again). A 2xx whose envelope says
 *   `"status":"error"` is `server_error`, billed, and retried.
 * - Untrusted text (PROVIDER.md): the upstream's data is whatever it scraped.
 *   Postgres refuses U+0000 in text and jsonb and lone surrogates in jsonb,
 *   so every string of `data` and `message` (keys included) is made storable
 *   here: each U+0000 and each unpaired surrogate becomes U+FFFD, as every
 *   UTF-8 decoder does with bytes it cannot read. The job succeeds with the
 *   rest of its data intact (it was paid for); docs/ARCHITECTURE.md says why.
 * - Any other answer (4xx, 429, 5xx) bills 0: only HTTP 200s are billed.
 * - No answer after the request was fully written to the provider's socket
 *   (timeout, connection reset mid-call, caller abort) is ambiguous:
 *   `timeoutBilling: 'billed'` (default) assumes the worst and bills the cost,
 *   so the ledger never lets the account over-spend; `'refunded'` bills 0.
 *   Such a bill is a guess (`billedIsGuess`): a late settlement that knows
 *   better corrects it (dispatch/late-settlement.ts).
 * - No answer before the request was fully written (a connect that hangs, an
 *   abort or a timeout while queued in the HTTP agent, a reset of a reused
 *   socket, a refused connection) bills 0 under both: the provider cannot
 *   have billed a request it never received, and every retry would bill again.
 */
import type { BatchResultRead } from './batch-wire.ts';
import { HEADER, headerValue, parseProviderStatus, parseRetryAfter, type HeaderSource } from './headers.ts';
import type { BatchItemOutcome, CallOutcome, OutcomeKind, ProviderStatus } from './types.ts';

export type TimeoutBilling = 'billed' | 'refunded';

/** What the worker does with the job after an outcome. */
export type Reaction =
  | 'complete' // store the result, settle the reservation as billed, ack the job
  | 'retry' // counts as an attempt; retry with backoff (server trouble, timeout)
  | 'put_back' // not an attempt: the job goes back to its queue; the window/account is the problem
  | 'fail'; // the job itself is wrong: fail it, refund the reservation

/** Used when a rate-limit 429 carries neither retry-after nor x-rate-limit-reset (the cooldown is ~50 s). */
export const DEFAULT_RETRY_AFTER_SECONDS = 60;

/** RETRY_AFTER_MAX_SECONDS' default: no pause or put-back delay the provider asks for lasts longer; then a call decides again. */
export const MAX_RETRY_AFTER_SECONDS = 300;

/**
 * The provider's ask for a wait, within the cap: the wait to keep, and the ask itself when it was
 * beyond the cap (an alert names it). Pure.
 */
export function boundedRetryAfter(asked: number | null, maxSeconds: number = MAX_RETRY_AFTER_SECONDS): Pick<CallOutcome, 'retryAfterSeconds' | 'askedRetryAfterSeconds'> {
  if (asked === null) return { retryAfterSeconds: null };
  return asked > maxSeconds ? { retryAfterSeconds: maxSeconds, askedRetryAfterSeconds: asked } : { retryAfterSeconds: asked };
}

/**
 * billed → complete; server_error, timeout → retry; rate_limited,
 * credits_exhausted, key_unusable → put_back (another window, the pacer's
 * pause, a renewal or an admin fixing the key lets the same job run later;
 * failing it would punish the tenant for the account's state); bad_input,
 * unknown_api → fail (no retry can succeed).
 */
export function reactionTo(outcome: Pick<CallOutcome, 'kind'>): Reaction {
  // bad_response → fail too: the answer came and was billed; asking again bills again for the same garbage.
  switch (outcome.kind) {
    case 'billed':
      return 'complete';
    case 'server_error':
    case 'timeout':
      return 'retry';
    case 'rate_limited':
    case 'credits_exhausted':
    case 'key_unusable':
      return 'put_back';
    case 'bad_input':
    case 'unknown_api':
    case 'bad_response':
      return 'fail';
  }
}

const CREDITS_WORDING = /credit|quota/i;

/**
 * The kind of a non-2xx status. `remainingCredits` is the parsed
 * `x-api-remaining-credits` (null when absent); `message` the error text.
 */
export function kindForErrorStatus(httpStatus: number, message: string | null, remainingCredits: number | null): OutcomeKind {
  const saysCredits = message !== null && CREDITS_WORDING.test(message);
  if (httpStatus === 429) {
    if (remainingCredits !== null) return remainingCredits <= 0 ? 'credits_exhausted' : 'rate_limited';
    return saysCredits ? 'credits_exhausted' : 'rate_limited';
  }
  if (httpStatus === 402) return 'credits_exhausted';
  if (httpStatus === 403) return saysCredits ? 'credits_exhausted' : 'key_unusable';
  if (httpStatus === 401) return 'key_unusable';
  if (httpStatus === 404) return 'unknown_api';
  if (httpStatus === 408) return 'server_error';
  if (httpStatus >= 400 && httpStatus < 500) return 'bad_input';
  return 'server_error';
}

/** The default of MAX_RESULT_BYTES: the most of one answer's body the client reads. */
export const DEFAULT_MAX_RESULT_BYTES = 1024 * 1024;

/**
 * The deepest nesting of `data` accepted: Postgres parses jsonb recursively and
 * refuses deep documents with "stack depth limit exceeded" (not a data
 * exception), and no API of the catalog nests beyond a handful of levels.
 */
export const MAX_DATA_DEPTH = 64;

/** What is wrong with a 2xx body before its JSON is read. */
export type BodyProblem = 'too_large' | 'not_utf8';

const FATAL_UTF8 = new TextDecoder('utf-8', { fatal: true });

/** The body's text, or null when its bytes are not UTF-8 (never replaced silently: a bad byte means a bad answer). */
export function decodeUtf8(bytes: Uint8Array): string | null {
  try {
    return FATAL_UTF8.decode(bytes);
  } catch {
    return null;
  }
}

// U+0000 and any surrogate (paired or not: the replace below keeps the pairs).
const SUSPECT = /[\u0000\ud800-\udfff]/;

/** `s` storable in Postgres text and jsonb: U+0000 and unpaired surrogates become U+FFFD. */
export function storableText(s: string): string {
  if (!SUSPECT.test(s)) return s;
  return s.replaceAll('\u0000', '\ufffd').toWellFormed();
}

/**
 * `value` (decoded JSON) with every string and key storable (storableText),
 * or null when it nests deeper than `maxDepth`. Returns the same object when
 * nothing needed a change (the common case costs one walk, no copy).
 */
export function storableJson(value: unknown, maxDepth = MAX_DATA_DEPTH): { ok: true; value: unknown } | { ok: false } {
  const walk = (v: unknown, depth: number): unknown => {
    if (typeof v === 'string') return storableText(v);
    if (v === null || typeof v !== 'object') return v;
    if (depth >= maxDepth) throw TOO_DEEP;
    if (Array.isArray(v)) {
      let out: unknown[] | null = null;
      for (let i = 0; i < v.length; i++) {
        const x = walk(v[i], depth + 1);
        if (x !== v[i]) (out ??= [...v])[i] = x;
      }
      return out ?? v;
    }
    let changed = false;
    const entries: [string, unknown][] = [];
    for (const [k, x] of Object.entries(v)) {
      const k2 = storableText(k);
      const x2 = walk(x, depth + 1);
      if (k2 !== k || x2 !== x) changed = true;
      entries.push([k2, x2]);
    }
    return changed ? Object.fromEntries(entries) : v;
  };
  try {
    return { ok: true, value: walk(value, 0) };
  } catch (err) {
    if (err === TOO_DEEP) return { ok: false };
    throw err;
  }
}

const TOO_DEEP = new Error('too deep');

interface Envelope {
  readable: boolean;
  ok: boolean;
  data: unknown;
  error: string | null;
}

/**
 * Reads the `{"status","error","data"}` envelope. `readable` only when it is
 * one: a JSON object whose `status` is "ok" or "error", or (older shapes)
 * without `status` but with `data`, `error` or `message`. Anything else (HTML,
 * truncated JSON, an array, `{"foo":1}`) is not.
 */
export function readEnvelope(bodyText: string): Envelope {
  let body: unknown;
  try {
    body = JSON.parse(bodyText);
  } catch {
    return { readable: false, ok: false, data: null, error: null };
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    return { readable: false, ok: false, data: null, error: null };
  }
  const b = body as Record<string, unknown>;
  const shaped = b.status === 'ok' || b.status === 'error' || (b.status === undefined && ('data' in b || 'error' in b || 'message' in b));
  if (!shaped) return { readable: false, ok: false, data: null, error: null };
  const raw = typeof b.error === 'string' ? b.error : typeof b.message === 'string' ? b.message : null;
  const error = raw === null ? null : storableText(raw);
  const ok = b.status === 'ok' || (b.status === undefined && error === null);
  return { readable: true, ok, data: b.data ?? null, error };
}

export interface ResponseFacts {
  httpStatus: number;
  headers: HeaderSource;
  /** The body as text ('' when `bodyProblem` says it could not be read). */
  bodyText: string;
  /** Set when the body was over the limit (not read whole) or not UTF-8. */
  bodyProblem?: BodyProblem | null;
  /** The limit the client read up to (for the message). */
  maxResultBytes?: number;
  /** Catalog cost of the call (for a batch: not used, see classifyBatchResponse). */
  cost: number;
  latencyMs: number;
  observedAt: Date;
  defaultRetryAfterSeconds?: number;
  /** RETRY_AFTER_MAX_SECONDS (default MAX_RETRY_AFTER_SECONDS). */
  maxRetryAfterSeconds?: number;
}

function secondsUntil(date: Date | null, nowMs: number): number | null {
  if (date === null) return null;
  return Math.max(0, Math.ceil((date.getTime() - nowMs) / 1000));
}

/** Any HTTP answer of a single call into its outcome. */
export function classifyResponse(f: ResponseFacts): CallOutcome {
  const status = parseProviderStatus(f.headers, f.observedAt);
  const env = f.bodyProblem ? { readable: false, ok: false, data: null, error: null } : readEnvelope(f.bodyText);
  const base = { httpStatus: f.httpStatus, status, latencyMs: f.latencyMs };
  if (f.httpStatus >= 200 && f.httpStatus < 300) {
    const bad = (why: string): CallOutcome => ({ ...base, kind: 'bad_response', creditsBilled: f.cost, data: null, message: why, retryAfterSeconds: null });
    if (f.bodyProblem) return bad(badBodyMessage(f.httpStatus, f.bodyProblem, f.maxResultBytes));
    if (!env.readable) return bad(`provider answered ${f.httpStatus} with a body that is not its JSON envelope`);
    if (!env.ok) {
      return {
        ...base,
        kind: 'server_error',
        creditsBilled: f.cost,
        data: null,
        message: `provider answered ${f.httpStatus} with an error: ${env.error ?? 'no message'}`,
        retryAfterSeconds: null,
      };
    }
    const data = storableJson(env.data);
    if (!data.ok) return bad(`provider answered ${f.httpStatus} with data nested deeper than ${MAX_DATA_DEPTH} levels`);
    return { ...base, kind: 'billed', creditsBilled: f.cost, data: data.value, message: null, retryAfterSeconds: null };
  }
  const message = env.error ?? (env.readable ? `HTTP ${f.httpStatus}` : `HTTP ${f.httpStatus} with unreadable body`);
  const kind = kindForErrorStatus(f.httpStatus, message, status.remainingCredits);
  return {
    ...base,
    kind,
    creditsBilled: 0,
    data: null,
    message,
    // Credits exhausted waits for the renewal: the account stop (dispatch/retry.ts creditsStopUntil)
    // bounds that wait, and the job it put back is ready as soon as the stop lifts.
    ...(kind === 'credits_exhausted'
      ? { retryAfterSeconds: retryAfterFor(kind, f.headers, status, f.observedAt.getTime(), f.defaultRetryAfterSeconds) }
      : boundedRetryAfter(retryAfterFor(kind, f.headers, status, f.observedAt.getTime(), f.defaultRetryAfterSeconds), f.maxRetryAfterSeconds)),
  };
}

/** The message of a 2xx whose body could not be read as text. */
export function badBodyMessage(httpStatus: number, problem: BodyProblem, maxResultBytes?: number): string {
  return problem === 'too_large'
    ? `provider answered ${httpStatus} with a body over ${maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES} bytes (MAX_RESULT_BYTES)`
    : `provider answered ${httpStatus} with a body that is not valid UTF-8`;
}

/**
 * rate_limited: retry-after, else x-rate-limit-reset, else the default.
 * credits_exhausted: retry-after if sent, else seconds until the renewal (when known).
 * server_error: retry-after if sent. Others: null.
 */
function retryAfterFor(
  kind: OutcomeKind,
  headers: HeaderSource,
  status: ProviderStatus,
  nowMs: number,
  defaultSeconds = DEFAULT_RETRY_AFTER_SECONDS,
): number | null {
  const retryAfter = parseRetryAfter(headerValue(headers, HEADER.retryAfter), nowMs);
  if (kind === 'rate_limited') {
    return retryAfter ?? parseRetryAfter(headerValue(headers, HEADER.rateLimitReset), nowMs) ?? defaultSeconds;
  }
  if (kind === 'credits_exhausted') return retryAfter ?? secondsUntil(status.renewalAt, nowMs);
  if (kind === 'server_error') return retryAfter;
  return null;
}

export type FailureReason =
  | 'timeout' // our timeout fired
  | 'aborted' // the caller's signal fired
  | 'network'; // connection error

export interface FailureFacts {
  reason: FailureReason;
  message: string;
  /** Whether the request was fully written to the provider before the failure. */
  requestSent: boolean;
  cost: number;
  timeoutBilling: TimeoutBilling;
  latencyMs: number;
}

/**
 * Whether a call that got no answer may have been billed: only when the
 * request was fully written. Whatever the reason (our timeout, the caller's
 * abort, a connection error), a request the provider never received cannot
 * have been billed.
 */
export function mayHaveBeenBilled(f: Pick<FailureFacts, 'reason' | 'requestSent'>): boolean {
  return f.requestSent;
}

/** No HTTP answer: timeout (ours or the caller's) or a connection error. */
export function classifyFailure(f: FailureFacts): CallOutcome {
  const sent = mayHaveBeenBilled(f);
  const creditsBilled = sent && f.timeoutBilling === 'billed' ? f.cost : 0;
  return {
    // Only a sent request's bill is a guess; an unsent one surely cost nothing.
    ...(sent ? { billedIsGuess: true } : {}),
    kind: f.reason === 'network' ? 'server_error' : 'timeout',
    httpStatus: null,
    creditsBilled,
    data: null,
    message: f.message,
    status: null,
    retryAfterSeconds: null,
    latencyMs: f.latencyMs,
  };
}

/** One item of a batch answered 200 as a whole. `result` undefined = the provider left it out. */
export function classifyBatchItem(
  id: string,
  result: BatchResultRead | undefined,
  cost: number,
  opts: { timeoutBilling: TimeoutBilling; defaultRetryAfterSeconds?: number; maxRetryAfterSeconds?: number; maxResultBytes?: number },
): BatchItemOutcome {
  if (result === undefined) {
    return {
      id,
      kind: 'server_error',
      httpStatus: null,
      billedIsGuess: true,
      creditsBilled: opts.timeoutBilling === 'billed' ? cost : 0,
      data: null,
      message: 'item missing from the batch response',
      retryAfterSeconds: null,
    };
  }
  if (result.status >= 200 && result.status < 300) {
    const data = storableJson(result.data ?? null);
    if (!data.ok) {
      const message = `provider answered item status ${result.status} with data nested deeper than ${MAX_DATA_DEPTH} levels`;
      return { id, kind: 'bad_response', httpStatus: result.status, creditsBilled: cost, data: null, message, retryAfterSeconds: null };
    }
    if (opts.maxResultBytes !== undefined && Buffer.byteLength(JSON.stringify(data.value) ?? '') > opts.maxResultBytes) {
      const message = `provider answered item status ${result.status} with data over ${opts.maxResultBytes} bytes (MAX_RESULT_BYTES)`;
      return { id, kind: 'bad_response', httpStatus: result.status, creditsBilled: cost, data: null, message, retryAfterSeconds: null };
    }
    return { id, kind: 'billed', httpStatus: result.status, creditsBilled: cost, data: data.value, message: null, retryAfterSeconds: null };
  }
  const message = storableText(result.error ?? `item status ${result.status}`);
  const kind = kindForErrorStatus(result.status, message, null);
  const asked =
    kind === 'rate_limited'
      ? (result.retryAfter !== undefined ? Math.ceil(result.retryAfter) : (opts.defaultRetryAfterSeconds ?? DEFAULT_RETRY_AFTER_SECONDS))
      : result.retryAfter !== undefined
        ? Math.ceil(result.retryAfter)
        : null;
  return { id, kind, httpStatus: result.status, creditsBilled: 0, data: null, message, ...boundedRetryAfter(asked, opts.maxRetryAfterSeconds) };
}

/**
 * Matches results to the request's items: by position when the ids agree
 * (the documented order), otherwise by id (first unused result with that id),
 * so a reordered answer still lands on the right items.
 */
export function matchBatchResults(
  ids: readonly string[],
  results: readonly BatchResultRead[],
): (BatchResultRead | undefined)[] {
  if (results.length === ids.length && results.every((r, i) => r.id === ids[i])) return [...results];
  const byId = new Map<string, BatchResultRead[]>();
  for (const r of results) {
    const list = byId.get(r.id);
    if (list) list.push(r);
    else byId.set(r.id, [r]);
  }
  return ids.map((id) => byId.get(id)?.shift());
}
