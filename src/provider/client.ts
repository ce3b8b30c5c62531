/**
 * The upstream client: one HTTP call per job (`call`) or per batch
 * (`callBatch`), every answer classified into an outcome (classify.ts), the
 * newest header status kept per key.
 *
 * Transport: node:http(s) with one keep-alive agent per client, so a worker
 * pool reuses warm connections instead of paying a TCP (and TLS) handshake
 * per call, and `close()` can drop them. The timeout covers the whole call
 * (connect, headers and body); on timeout the socket is destroyed, which is
 * also what a hung provider needs to free its slot.
 *
 * The answer is untrusted input (PROVIDER.md): the client reads at most
 * `maxResultBytes` of a body (a batch: that much per item it carries), stops
 * reading and drops the connection past it, and decodes the bytes as strict
 * UTF-8; either problem makes a 2xx a final `bad_response` (classify.ts).
 */
import http from 'node:http';
import https from 'node:https';
import type { ApiCatalog } from '../config/apis.ts';
import { batchPath, encodeBatchRequest, parseBatchResponse } from './batch-wire.ts';
import {
  badBodyMessage,
  classifyBatchItem,
  classifyFailure,
  classifyResponse,
  matchBatchResults,
  type FailureReason,
  type BodyProblem,
  type TimeoutBilling,
  decodeUtf8,
  storableText,
  DEFAULT_MAX_RESULT_BYTES,
  DEFAULT_RETRY_AFTER_SECONDS,
  MAX_RETRY_AFTER_SECONDS,
} from './classify.ts';
import { outcomeAttributes, type TraceAttributes } from '../tracing/attributes.ts';
import { endSpan, propagationHeaders, SpanKind, startSpan, tracing } from '../tracing/tracer.ts';
import { HEADER, parseProviderStatus } from './headers.ts';
import type { BatchItem, BatchOutcome, CallOutcome, CallRequest, ProviderClient, ProviderStatus } from './types.ts';

export interface ProviderClientOptions {
  /** e.g. `https://api.apiverve.com/v1` or a simulator's `url`; `/<api>` is appended. */
  baseUrl: string;
  /** Default per-call timeout (a CallRequest may override it). */
  timeoutMs: number;
  /** Cost map: what a billed call costs (see classify.ts for the billing rule). */
  catalog: ApiCatalog;
  /** What the ledger is told a call without an answer cost. Default 'billed' (worst case). */
  timeoutBilling?: TimeoutBilling;
  /** Seconds to wait after a rate-limit 429 that names no time. Default 60. */
  defaultRetryAfterSeconds?: number;
  /** RETRY_AFTER_MAX_SECONDS: the longest wait a provider's answer may impose. Default 300. */
  maxRetryAfterSeconds?: number;
  /** Max sockets per origin in the keep-alive pool. Default 256 (the pacer, not this, bounds the rate). */
  maxSockets?: number;
  /**
   * How long a pooled connection may sit idle before the client closes it (PROVIDER_IDLE_SOCKET_TIMEOUT_MS). Default 4 s (IDLE_SOCKET_MS):
   * below the 5 s idle timeout of common servers (Node's default), so the client, not the server,
   * ends an idle connection.
   */
  idleSocketMs?: number;
  /** Most bytes of one answer's body read (a batch: per item). Default 1 MiB (MAX_RESULT_BYTES). */
  maxResultBytes?: number;
  userAgent?: string;
}

type Raw =
  | { ok: true; httpStatus: number; headers: http.IncomingHttpHeaders; bodyText: string; bodyProblem: BodyProblem | null }
  | { ok: false; reason: FailureReason; message: string; requestSent: boolean };

/** A pooled connection idle this long is closed by the client (ProviderClientOptions.idleSocketMs). */
export const IDLE_SOCKET_MS = 4_000;

export function createProviderClient(opts: ProviderClientOptions): ProviderClient {
  const base = new URL(opts.baseUrl.endsWith('/') ? opts.baseUrl : `${opts.baseUrl}/`);
  const isHttps = base.protocol === 'https:';
  if (!isHttps && base.protocol !== 'http:') throw new Error(`baseUrl must be http(s), got ${opts.baseUrl}`);
  // `timeout` closes a pooled connection after it has been idle that long, and lets Node's agent
  // honour a shorter `Keep-Alive: timeout=N` hint from the server (without it the agent ignores the
  // hint and keeps idle sockets forever). A request written on a socket the server is closing for
  // idleness is reset after it was fully written: never received, but under the timeout rule billed
  // as a guess and retried, so one call billed twice in the ledger. Nothing listens for the
  // request's own 'timeout' event, so an answer slower than this is unaffected (the call's own timer
  // bounds it).
  const agentOptions = { keepAlive: true, maxSockets: opts.maxSockets ?? 256, scheduling: 'lifo' as const, timeout: opts.idleSocketMs ?? IDLE_SOCKET_MS };
  const agent = isHttps ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
  const timeoutBilling: TimeoutBilling = opts.timeoutBilling ?? 'billed';
  const defaultRetryAfterSeconds = opts.defaultRetryAfterSeconds ?? DEFAULT_RETRY_AFTER_SECONDS;
  const maxRetryAfterSeconds = opts.maxRetryAfterSeconds ?? MAX_RETRY_AFTER_SECONDS;
  const userAgent = opts.userAgent ?? 'sluice-provider-client';
  const maxResultBytes = opts.maxResultBytes ?? DEFAULT_MAX_RESULT_BYTES;
  const statuses = new Map<string, ProviderStatus>();
  let closed = false;

  // An API missing from the catalog is billed at the dearest catalog cost:
  // the ledger must never under-count (the app validates APIs at submit, so
  // this only guards a catalog edited under running jobs).
  const maxCost = Math.max(1, ...[...opts.catalog.values()].map((s) => s.creditCost));
  const costOf = (api: string) => opts.catalog.get(api)?.creditCost ?? maxCost;

  function remember(apiKey: string, status: ProviderStatus | null) {
    if (!status) return;
    const prev = statuses.get(apiKey);
    if (!prev || prev.observedAt.getTime() <= status.observedAt.getTime()) statuses.set(apiKey, status);
  }

  function send(
    method: 'GET' | 'POST',
    url: URL,
    apiKey: string,
    body: string | null,
    timeoutMs: number,
    signal: AbortSignal | undefined,
    maxBytes: number,
    onSent: (() => void) | undefined,
    traceHeaders: Record<string, string> | undefined,
  ): Promise<Raw> {
    return new Promise<Raw>((resolve) => {
      let settled = false;
      let requestSent = false;
      const headers: Record<string, string> = {
        ...traceHeaders,
        [HEADER.apiKey]: apiKey,
        accept: 'application/json',
        'user-agent': userAgent,
      };
      if (body !== null) {
        headers['content-type'] = 'application/json';
        headers['content-length'] = String(Buffer.byteLength(body));
      }
      const req = (isHttps ? https : http).request(url, { method, headers, agent });
      const finish = (raw: Raw) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        resolve(raw);
      };
      const fail = (reason: FailureReason, message: string) => {
        finish({ ok: false, reason, message, requestSent });
        req.destroy();
      };
      const onAbort = () => fail('aborted', 'aborted by the caller');
      const timer = setTimeout(() => fail('timeout', `no answer within ${timeoutMs} ms`), timeoutMs);
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('finish', () => {
        requestSent = true;
      });
      req.on('error', (err: NodeJS.ErrnoException) => fail('network', `connection error: ${err.code ?? err.message}`));
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        // Past the limit nothing more is read: the answer is settled as it stands and the socket dropped.
        const tooLarge = () => {
          finish({ ok: true, httpStatus: res.statusCode ?? 0, headers: res.headers, bodyText: '', bodyProblem: 'too_large' });
          req.destroy();
        };
        const declared = Number(res.headers['content-length']);
        if (Number.isFinite(declared) && declared > maxBytes) {
          tooLarge();
          return;
        }
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > maxBytes) tooLarge();
          else chunks.push(c);
        });
        res.on('error', (err) => fail('network', `connection error while reading: ${err.message}`));
        res.on('close', () => {
          if (!res.complete) fail('network', 'connection closed while reading the answer');
        });
        res.on('end', () => {
          const text = decodeUtf8(Buffer.concat(chunks));
          finish({ ok: true, httpStatus: res.statusCode ?? 0, headers: res.headers, bodyText: text ?? '', bodyProblem: text === null ? 'not_utf8' : null });
        });
      });
      // From here bytes may reach the provider (http.request writes nothing before end()).
      onSent?.();
      req.end(body ?? undefined);
    });
  }

  function assertOpen() {
    if (closed) throw new Error('provider client is closed');
  }

  /**
   * A traced call's CLIENT span (the caller's lease span its parent, or for a batch a trace of its
   * own linked to every job it carries), its traceparent sent to the provider; the answer's status,
   * classification and rate-limit headers on it. Never the key, the params or the answer's body.
   */
  async function traced<T>(
    req: Pick<CallRequest, 'trace'>,
    method: string,
    url: URL,
    attributes: TraceAttributes,
    run: (headers: Record<string, string>) => Promise<T>,
    outcomeOf: (r: T) => CallOutcome,
  ): Promise<T> {
    const t = req.trace!;
    const span = startSpan(`${method} ${url.pathname}`, {
      parent: t.parent ?? null,
      kind: SpanKind.CLIENT,
      links: t.links,
      attributes: { 'http.request.method': method, 'url.path': url.pathname, 'server.address': url.hostname, 'server.port': Number(url.port) || (isHttps ? 443 : 80), ...attributes },
    });
    try {
      const r = await run(propagationHeaders(span));
      const outcome = outcomeOf(r);
      endSpan(span, { attributes: outcomeAttributes(outcome), error: outcome.kind === 'billed' ? null : outcome.kind });
      return r;
    } catch (err) {
      endSpan(span, { error: 'exception' });
      throw err;
    }
  }

  return {
    call(req: CallRequest): Promise<CallOutcome> {
      if (!(tracing.on && req.trace)) return call(req, undefined);
      const method = opts.catalog.get(req.api)?.method ?? 'GET';
      return traced(req, method, new URL(encodeURIComponent(req.api), base), {}, (h) => call(req, h), (o) => o);
    },

    callBatch(req: Omit<CallRequest, 'params'> & { items: BatchItem[] }): Promise<BatchOutcome> {
      if (!(tracing.on && req.trace)) return callBatch(req, undefined);
      return traced(req, 'POST', new URL(batchPath(req.api), base), { 'sluice.job.count': req.items.length, 'sluice.job.api': req.api }, (h) => callBatch(req, h), (o) => o.call);
    },

    lastStatus(apiKey?: string): ProviderStatus | null {
      if (apiKey !== undefined) return statuses.get(apiKey) ?? null;
      let newest: ProviderStatus | null = null;
      for (const s of statuses.values()) {
        if (!newest || s.observedAt.getTime() > newest.observedAt.getTime()) newest = s;
      }
      return newest;
    },

    async close(): Promise<void> {
      closed = true;
      agent.destroy();
    },
  };

  async function call(req: CallRequest, traceHeaders: Record<string, string> | undefined): Promise<CallOutcome> {
    {
      assertOpen();
      const cost = costOf(req.api);
      const method = opts.catalog.get(req.api)?.method ?? 'GET';
      const url = new URL(encodeURIComponent(req.api), base);
      let body: string | null = null;
      if (method === 'GET') {
        for (const [k, v] of Object.entries(req.params)) {
          if (v === undefined || v === null) continue;
          url.searchParams.append(k, typeof v === 'object' ? JSON.stringify(v) : String(v));
        }
      } else {
        body = JSON.stringify(req.params);
      }
      const started = performance.now();
      const raw = await send(method, url, req.apiKey, body, req.timeoutMs ?? opts.timeoutMs, req.signal, maxResultBytes, req.onSent, traceHeaders);
      const latencyMs = performance.now() - started;
      if (!raw.ok) return classifyFailure({ ...raw, cost, timeoutBilling, latencyMs });
      const outcome = classifyResponse({
        httpStatus: raw.httpStatus,
        headers: raw.headers,
        bodyText: raw.bodyText,
        bodyProblem: raw.bodyProblem,
        maxResultBytes,
        cost,
        latencyMs,
        observedAt: new Date(),
        defaultRetryAfterSeconds,
        maxRetryAfterSeconds,
      });
      remember(req.apiKey, outcome.status);
      return outcome;
    }
  }

  async function callBatch(req: Omit<CallRequest, 'params'> & { items: BatchItem[] }, traceHeaders: Record<string, string> | undefined): Promise<BatchOutcome> {
    {
      assertOpen();
      const cost = costOf(req.api);
      const total = cost * req.items.length;
      const url = new URL(batchPath(req.api), base);
      const started = performance.now();
      const batchMaxBytes = maxResultBytes * req.items.length;
      const raw = await send('POST', url, req.apiKey, encodeBatchRequest(req.items), req.timeoutMs ?? opts.timeoutMs, req.signal, batchMaxBytes, req.onSent, traceHeaders);
      const latencyMs = performance.now() - started;
      if (!raw.ok) return { call: classifyFailure({ ...raw, cost: total, timeoutBilling, latencyMs }), items: [] };
      const observedAt = new Date();
      if (raw.httpStatus !== 200) {
        const call = classifyResponse({
          httpStatus: raw.httpStatus,
          headers: raw.headers,
          bodyText: raw.bodyText,
          bodyProblem: raw.bodyProblem,
          maxResultBytes: batchMaxBytes,
          cost: total,
          latencyMs,
          observedAt,
          defaultRetryAfterSeconds,
          maxRetryAfterSeconds,
        });
        remember(req.apiKey, call.status);
        return { call, items: [] };
      }
      const status = parseProviderStatus(raw.headers, observedAt);
      remember(req.apiKey, status);
      let decoded: unknown;
      try {
        decoded = raw.bodyProblem ? undefined : JSON.parse(raw.bodyText);
      } catch {
        decoded = undefined;
      }
      const parsed = parseBatchResponse(decoded);
      if (!parsed.ok) {
        // The provider answered 200, so it may have billed every item: worst case, like any unusable 200;
        // final for every item (each fails UPSTREAM_BAD_RESPONSE), never sent again to be billed again.
        const call: CallOutcome = {
          kind: 'bad_response',
          httpStatus: 200,
          creditsBilled: total,
          data: null,
          message: raw.bodyProblem ? badBodyMessage(200, raw.bodyProblem, batchMaxBytes) : `unreadable batch response: ${storableText(parsed.error)}`,
          status,
          retryAfterSeconds: null,
          latencyMs,
        };
        return { call, items: [] };
      }
      const matched = matchBatchResults(
        req.items.map((i) => i.id),
        parsed.value.results,
      );
      const items = req.items.map((item, i) =>
        classifyBatchItem(item.id, matched[i], cost, { timeoutBilling, defaultRetryAfterSeconds, maxRetryAfterSeconds, maxResultBytes }),
      );
      const call: CallOutcome = {
        kind: 'billed',
        httpStatus: 200,
        creditsBilled: items.reduce((sum, it) => sum + it.creditsBilled, 0),
        data: null,
        message: null,
        status,
        retryAfterSeconds: null,
        latencyMs,
      };
      return { call, items };
    }
  }
}
