// Small display helpers shared by both views.
export const num = (v, digits = 0) => (v === null || v === undefined ? '—' : Number(v).toLocaleString('en', { maximumFractionDigits: digits, minimumFractionDigits: 0 }));
export const ms = (v) => (v === null || v === undefined ? '—' : `${Math.round(v)} ms`);
export function secs(v) {
  if (v === null || v === undefined) return '—';
  if (v < 60) return `${v.toFixed(v < 10 ? 1 : 0)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min ${Math.round(v % 60)} s`;
  return `${Math.floor(v / 3600)} h ${Math.round((v % 3600) / 60)} min`;
}
/** Every time on the console in one format and one zone, said: 2026-12-04 09:38:34 UTC (the charts' axes are UTC too). */
export const time = (iso) => (iso ? new Date(iso).toISOString().replace('T', ' ').replace(/\.\d{3}Z$/, ' UTC') : '—');
export const pct = (part, whole) => (whole > 0 ? Math.min(100, Math.round((part / whole) * 100)) : 0);
/** A quota meter's level: amber ('warn') from 75 %, red ('bad') from 90 %. */
export const level = (part, whole) => {
  const share = whole > 0 ? part / whole : part > 0 ? 1 : 0;
  return share >= 0.9 ? 'bad' : share >= 0.75 ? 'warn' : 'ok';
};
export const WAIT_REASONS = {
  CREDITS_EXHAUSTED: 'account out of credits',
  KEY_UNUSABLE: 'upstream key refused',
  WINDOW_PAUSED: 'window paused (rate limit)',
  BREAKER_OPEN: 'API breaker open',
  QUOTA: 'monthly quota reached',
  CAP: 'at concurrency cap',
  RATE: 'waiting its fair turn',
  SUSPENDED: 'tenant suspended',
};
export const reason = (r) => (r ? WAIT_REASONS[r] ?? r : '—');
export const FINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);
export const RETRYABLE = new Set(['FAILED', 'CANCELLED']);
export const JOB_STATES = ['QUEUED', 'WAITING_QUOTA', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'];
export const errorText = (e) => `${e.code ? `${e.code}: ` : ''}${e.message}`;

/** Why the pacer runs a window below its configured rate (Window.paceReason), in words. */
export const PACE_REASONS = {
  LIMIT: 'the provider states a smaller window',
  DRAIN: 'others spend on the same key',
  RATE_LIMITED: 'the provider answered 429',
  CLIMB: 'climbing back as answers allow',
};

/** "pace used 42% (0.7 of 1.7 calls/s)" against the learned rate in use; for an unlimited window, just the calls. */
export function paceText(w) {
  if (w.paceUsed === null || w.ratePerMinute === null) return `unlimited (${num(w.callsPerSecond, 1)} calls/s)`;
  return `pace used ${Math.round(w.paceUsed * 100)}% (${num(w.callsPerSecond, 1)} of ${num(w.ratePerMinute / 60, 2)} calls/s)`;
}

/**
 * When the learned rate is below the configured one: both rates and why, e.g. "learned 0.45 calls/s,
 * below the configured 0.9 calls/s: the provider states a smaller window (30/min), since 2026-…";
 * null while the window runs at its configured rate.
 */
export function learnedText(w) {
  if (w.ratePerMinute === null || w.configuredRatePerMinute === null || w.configuredRatePerMinute === undefined) return null;
  if (w.ratePerMinute >= w.configuredRatePerMinute - 1e-9) return null;
  const why = w.paceReason ? PACE_REASONS[w.paceReason] ?? w.paceReason : 'learned from the provider';
  const stated = w.observedLimitPerMinute !== null && w.observedLimitPerMinute !== undefined ? ` (stated ${num(w.observedLimitPerMinute)}/min)` : '';
  return `learned ${num(w.ratePerMinute / 60, 2)} calls/s, below the configured ${num(w.configuredRatePerMinute / 60, 2)} calls/s: ${why}${stated}${w.pacedAt ? `, since ${time(w.pacedAt)}` : ''}`;
}

/** SFQ lag against its bound, in words: "lag 1.2 of bound 3.0 (40%)", flagged past the bound. */
export function lagText(lag, bound) {
  const share = bound > 0 ? Math.round((lag / bound) * 100) : 0;
  return `lag ${num(lag, 2)} of bound ${num(bound, 2)} (${share}%${lag > bound ? ', over the bound' : ''})`;
}
