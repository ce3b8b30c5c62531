/**
 * The provider's response headers: their names (shared with the simulator, so
 * both sides spell them once) and a pure parser into a ProviderStatus.
 *
 * Parsing is lenient on purpose: a missing or unreadable header becomes null,
 * never an exception, because the headers are advisory (the ledger bills from
 * the cost map, the pacer paces from configuration) and one odd response must
 * not fail a call that otherwise succeeded.
 */
import type { ProviderStatus } from './types.ts';

export const HEADER = {
  apiKey: 'x-api-key',
  rateLimitLimit: 'x-rate-limit-limit',
  rateLimitRemaining: 'x-rate-limit-remaining',
  rateLimitReset: 'x-rate-limit-reset',
  retryAfter: 'retry-after',
  remainingCredits: 'x-api-remaining-credits',
  maxCredits: 'x-api-max-credits',
  creditsUsed: 'x-api-credits-used',
  renewal: 'x-api-renewal',
  currentPlan: 'x-api-current-plan',
} as const;

/** Anything that carries headers: a fetch `Headers`, or node's `IncomingHttpHeaders`-like record. */
export type HeaderSource =
  | { get(name: string): string | null }
  | Readonly<Record<string, string | readonly string[] | number | undefined>>;

/** One header's value (first one if repeated), case-insensitive, or null when absent/empty. */
export function headerValue(headers: HeaderSource, name: string): string | null {
  const lower = name.toLowerCase();
  let raw: unknown;
  if (typeof (headers as { get?: unknown }).get === 'function') {
    raw = (headers as { get(name: string): string | null }).get(lower);
  } else {
    const record = headers as Readonly<Record<string, unknown>>;
    raw = record[lower];
    if (raw === undefined) {
      const key = Object.keys(record).find((k) => k.toLowerCase() === lower);
      raw = key === undefined ? undefined : record[key];
    }
  }
  if (Array.isArray(raw)) raw = raw[0];
  if (typeof raw === 'number') return String(raw);
  if (typeof raw !== 'string') return null;
  const trimmed = raw.trim();
  return trimmed === '' ? null : trimmed;
}

const NUMBER = /^[+-]?\d+(\.\d+)?$/;

/** A decimal number (negative allowed, e.g. `-4`), or null for anything else. */
export function parseNumber(value: string | null): number | null {
  if (value === null) return null;
  const v = value.trim();
  if (!NUMBER.test(v)) return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : null;
}

/** A date string (HTTP-date or ISO); bare numbers are not dates here (V8 would read "7" as a year). */
function parseDate(value: string): number | null {
  if (!/[a-z]/i.test(value)) return null;
  const ms = Date.parse(value);
  return Number.isNaN(ms) ? null : ms;
}

/**
 * `x-api-renewal` is documented as Unix seconds. Values above 10^11 are taken
 * as milliseconds (a seconds value that large is the year 5138), and a
 * non-numeric value is tried as a date string, so a format change degrades to
 * a still-correct reading instead of null.
 */
export function parseRenewal(value: string | null): Date | null {
  if (value === null) return null;
  const n = parseNumber(value);
  if (n !== null) {
    if (n <= 0) return null;
    return new Date(n > 1e11 ? n : n * 1000);
  }
  const ms = parseDate(value);
  return ms === null ? null : new Date(ms);
}

/** A number at least this large is not a delay in seconds (31 years) but an epoch time: seconds, or ms past EPOCH_MS_FROM. */
export const EPOCH_SECONDS_FROM = 1e9;
const EPOCH_MS_FROM = 1e12;

/**
 * `retry-after` (and `x-rate-limit-reset`) as seconds to wait: delta-seconds
 * (possibly fractional, rounded up) or an HTTP-date relative to `nowMs`. A
 * number from EPOCH_SECONDS_FROM up is read as an epoch time (seconds, or
 * milliseconds from 10^12), the shape some providers send for a reset, so it
 * is never a wait of decades. Returns null when absent or unreadable; never
 * negative. What this returns is still only the provider's ask: the caller
 * caps it (RETRY_AFTER_MAX_SECONDS, provider/classify.ts).
 */
export function parseRetryAfter(value: string | null, nowMs: number = Date.now()): number | null {
  if (value === null) return null;
  const n = parseNumber(value);
  if (n !== null && n >= EPOCH_SECONDS_FROM) return Math.max(0, Math.ceil((n >= EPOCH_MS_FROM ? n : n * 1000) / 1000 - nowMs / 1000));
  if (n !== null) return n < 0 ? null : Math.ceil(n);
  const ms = parseDate(value);
  if (ms === null) return null;
  return Math.max(0, Math.ceil((ms - nowMs) / 1000));
}

/** Every documented header into a ProviderStatus; missing or unreadable fields are null. */
export function parseProviderStatus(headers: HeaderSource, observedAt: Date = new Date()): ProviderStatus {
  const num = (name: string) => parseNumber(headerValue(headers, name));
  return {
    remainingCredits: num(HEADER.remainingCredits),
    maxCredits: num(HEADER.maxCredits),
    creditsUsed: num(HEADER.creditsUsed),
    renewalAt: parseRenewal(headerValue(headers, HEADER.renewal)),
    rateLimitLimit: num(HEADER.rateLimitLimit),
    rateLimitRemaining: num(HEADER.rateLimitRemaining),
    plan: headerValue(headers, HEADER.currentPlan),
    observedAt,
  };
}
