/**
 * Is this error "the database is not there right now"? Pure: it reads the
 * error (and its causes: drizzle and pg-boss wrap the driver's error), never
 * the network. Such errors are answered with 503 DATABASE_UNAVAILABLE and a
 * Retry-After, never a 500: the request did not fail, the database was away.
 */
import { SluiceError } from '../errors.ts';

/** postgres.js and Node socket error codes that mean no usable connection. */
const CONNECTION_CODES = new Set([
  'CONNECTION_CLOSED',
  'CONNECTION_ENDED',
  'CONNECTION_DESTROYED',
  'CONNECT_TIMEOUT',
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
]);

/**
 * SQLSTATEs of a server going away or not yet back: class 08 (connection
 * exception), admin/crash shutdown, "the database system is starting up",
 * too many connections.
 */
const SQLSTATES = new Set(['57P01', '57P02', '57P03', '53300']);

/** Seconds a client should wait before retrying while the database is away. */
export const DATABASE_RETRY_AFTER_SECONDS = 2;

export function isDatabaseUnavailable(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof SluiceError) return e.code === 'DATABASE_UNAVAILABLE';
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && (CONNECTION_CODES.has(code) || SQLSTATES.has(code) || code.startsWith('08'))) return true;
    // Errors gathered from several connection attempts (Node's AggregateError for happy-eyeballs connects).
    if (e instanceof AggregateError && e.errors.some(isDatabaseUnavailable)) return true;
  }
  return false;
}

/** The pool was ended by this process (it is stopping): not an outage to wait out. Pure. */
export function isPoolEnded(err: unknown): boolean {
  return (err as { code?: unknown } | null)?.code === 'CONNECTION_ENDED';
}

/** An outage worth waiting out in a loop (a subscription's poll, a resync read): unavailable, and not our own stop. */
export function isTransientOutage(err: unknown): boolean {
  return isDatabaseUnavailable(err) && !isPoolEnded(err);
}

export function databaseUnavailable(detail = 'the database is unreachable'): SluiceError {
  return new SluiceError(
    'DATABASE_UNAVAILABLE',
    `${detail}; retry in a few seconds (a submission with an idempotencyKey is safe to retry: it is stored at most once)`,
    { retryAfterSeconds: DATABASE_RETRY_AFTER_SECONDS },
    503,
    { 'Retry-After': String(DATABASE_RETRY_AFTER_SECONDS) },
  );
}
