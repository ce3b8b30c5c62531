/**
 * Limits before authentication: what a caller without a valid credential may
 * cost the process before it is refused.
 *
 *  - The key is checked from the request's headers before its body is read; a
 *    body without a valid credential may be at most UNAUTHENTICATED_MAX_BODY_BYTES
 *    (MAX_BODY_BYTES needs a key), and a wrong key is answered 401 unread.
 *  - A graphql-ws socket reads messages of at most the same small size until its
 *    connection_init is accepted (`limitSocketPayload`).
 *  - Failed authentications are counted per client address
 *    (AUTH_FAILURES_PER_MINUTE; the address as seen through the proxies
 *    TRUST_PROXY trusts, http/client-address.ts). The budget punishes only the
 *    failing caller: a credential that authenticates is always served, whatever
 *    others did from its address; past the budget, a failing credential is
 *    answered 429 TOO_MANY_AUTH_FAILURES with Retry-After instead of 401 (over
 *    graphql-ws: closed 4429 at connection_init). What makes the budget cheap is
 *    the key's checksum (tenants/keys.ts): a forged or malformed token is
 *    refused without a database lookup, under or over budget; only keys of the
 *    shape issued before checksums are looked up (through the key cache and its
 *    negative cache). Requests without a credential are not failures.
 */
import type { Server } from 'node:http';

export interface FailureWindow {
  /** When the address's current minute began. */
  startedAt: number;
  failures: number;
}

export const AUTH_FAILURE_WINDOW_MS = 60_000;

/** Seconds until `w` lets the address try again, or null when it may. Pure. */
export function authRetryAfter(w: FailureWindow | undefined, now: number, limit: number, windowMs = AUTH_FAILURE_WINDOW_MS): number | null {
  if (!w || now - w.startedAt >= windowMs || w.failures < limit) return null;
  return Math.max(1, Math.ceil((w.startedAt + windowMs - now) / 1000));
}

/** The window after one more failure at `now`. Pure. */
export function recordFailure(w: FailureWindow | undefined, now: number, windowMs = AUTH_FAILURE_WINDOW_MS): FailureWindow {
  if (!w || now - w.startedAt >= windowMs) return { startedAt: now, failures: 1 };
  return { startedAt: w.startedAt, failures: w.failures + 1 };
}

/** Failed authentications per client address, in fixed one-minute windows; at most `maxAddresses` remembered (oldest forgotten first). */
export class AuthFailureBudget {
  private readonly windows = new Map<string, FailureWindow>();
  private readonly limit: number;
  private readonly maxAddresses: number;
  private readonly now: () => number;

  constructor(opts: { perMinute: number; maxAddresses?: number; now?: () => number }) {
    this.limit = opts.perMinute;
    this.maxAddresses = opts.maxAddresses ?? 100_000;
    this.now = opts.now ?? Date.now;
  }

  /** Seconds the address must wait, or null when it may authenticate now. */
  retryAfter(address: string): number | null {
    return authRetryAfter(this.windows.get(address), this.now(), this.limit);
  }

  fail(address: string): void {
    const next = recordFailure(this.windows.get(address), this.now());
    this.windows.delete(address); // re-insert at the end: the Map's order is the eviction order
    this.windows.set(address, next);
    while (this.windows.size > this.maxAddresses) this.windows.delete(this.windows.keys().next().value!);
  }
}

/** The coded refusal of an address past its budget (HTTP 429, Retry-After). */
export function tooManyFailures(retryAfterSeconds: number): { message: string; extensions: Record<string, unknown> } {
  return {
    message: `too many failed authentications from this address: retry in ${retryAfterSeconds} s`,
    extensions: { code: 'TOO_MANY_AUTH_FAILURES', retryAfterSeconds },
  };
}

/** Whether a listening host is a loopback address (only this machine can connect). Pure. */
export function isLoopbackHost(host: string): boolean {
  const h = host.trim().toLowerCase().replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h) || /^::ffff:127\./.test(h);
}

export interface HttpTimeouts {
  /** All request headers must arrive within this (slowloris). */
  headersMs: number;
  /** The whole request (headers and body) must arrive within this. */
  requestMs: number;
  /** An idle keep-alive connection is closed after this. */
  keepAliveMs: number;
}

/** How often Node checks its connections against headersTimeout and requestTimeout (its default, 30 s, would let a slow client hold a socket that long past them). */
export const CONNECTIONS_CHECK_MS = 1_000;

export function applyTimeouts(server: Server, t: HttpTimeouts): void {
  server.headersTimeout = t.headersMs;
  server.requestTimeout = t.requestMs;
  server.keepAliveTimeout = t.keepAliveMs;
}

interface PayloadLimited {
  _receiver?: { _maxPayload?: number } | null;
  on(event: 'message', fn: (data: Buffer | ArrayBuffer | Buffer[]) => void): unknown;
  close(code: number, reason: string): void;
}

const tooBigCode = 1009; // RFC 6455: message too big

/**
 * ws reports a message past the limit as an 'error' on the socket (and closes it with 1009 itself);
 * graphql-ws prints every socket error with its stack to the console. An oversize message is a
 * client's mistake, answered by the close code: not an error of ours to print.
 */
function quietOversize(socket: { emit(event: string | symbol, ...args: unknown[]): boolean; sluiceQuiet?: true }): void {
  if (socket.sluiceQuiet) return;
  socket.sluiceQuiet = true;
  const emit = socket.emit.bind(socket);
  socket.emit = (event, ...args) => (event === 'error' && (args[0] as { code?: string } | undefined)?.code === 'WS_ERR_UNSUPPORTED_MESSAGE_LENGTH' ? false : emit(event, ...args));
}

/**
 * The largest message this socket reads from now on. ws's `maxPayload` is one
 * value per server, so the socket's own receiver is set: frames past it close
 * the socket with 1009 as their header arrives, before their payload is
 * buffered. If ws ever stops exposing it, messages past the limit still close
 * the socket (after they were read).
 */
export function limitSocketPayload(socket: PayloadLimited, bytes: number): void {
  quietOversize(socket as unknown as { emit(event: string | symbol, ...args: unknown[]): boolean; sluiceQuiet?: true });
  const receiver = socket._receiver;
  if (receiver && typeof receiver._maxPayload === 'number') {
    receiver._maxPayload = bytes;
    return;
  }
  const limited = socket as PayloadLimited & { sluiceMaxPayload?: number };
  if (limited.sluiceMaxPayload === undefined) {
    socket.on('message', (data) => {
      const size = Array.isArray(data) ? data.reduce((n, b) => n + b.length, 0) : data.byteLength;
      if (size > limited.sluiceMaxPayload!) socket.close(tooBigCode, 'message too big');
    });
  }
  limited.sluiceMaxPayload = bytes;
}

export type Admission<A> =
  | { admitted: true; auth: A; maxBodyBytes: number }
  | { admitted: false; status: 401 | 429; error: { message: string; extensions: Record<string, unknown> }; headers: Record<string, string> };

/**
 * What a failed authentication is answered, given the address's budget before
 * this failure: 401, or 429 with Retry-After once the address is past it. Pure.
 */
export function failedAuthRefusal(retryAfterSeconds: number | null): Exclude<Admission<never>, { admitted: true }> {
  if (retryAfterSeconds !== null) return { admitted: false, status: 429, error: tooManyFailures(retryAfterSeconds), headers: { 'retry-after': String(retryAfterSeconds) } };
  return {
    admitted: false,
    status: 401,
    error: { message: 'invalid credential: send Authorization: Bearer <api key>', extensions: { code: 'UNAUTHENTICATED' } },
    headers: { 'www-authenticate': 'Bearer' },
  };
}

/**
 * The front door of one HTTP request, from its headers alone: the credential
 * is checked (a forged or malformed one without any lookup: `authenticate`),
 * one that authenticates is admitted whatever the address's budget, a failing
 * one is counted and refused (401, or 429 past the budget), and the body limit
 * follows from who is calling.
 */
export async function admit<A extends { kind: string }>(
  req: { authorization: string | undefined; address: string },
  o: { budget: AuthFailureBudget; authenticate: (authorization: string | undefined) => Promise<A>; maxBodyBytes: number; unauthenticatedMaxBodyBytes: number },
): Promise<Admission<A>> {
  const auth = await o.authenticate(req.authorization);
  if (auth.kind === 'invalid') {
    const wait = o.budget.retryAfter(req.address);
    o.budget.fail(req.address);
    return failedAuthRefusal(wait);
  }
  return { admitted: true, auth, maxBodyBytes: auth.kind === 'anonymous' ? Math.min(o.unauthenticatedMaxBodyBytes, o.maxBodyBytes) : o.maxBodyBytes };
}
