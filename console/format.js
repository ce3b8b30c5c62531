// Small display helpers shared by both views.
export const num = (v, digits = 0) => (v === null || v === undefined ? '—' : Number(v).toLocaleString('en', { maximumFractionDigits: digits, minimumFractionDigits: 0 }));
export const ms = (v) => (v === null || v === undefined ? '—' : `${Math.round(v)} ms`);
export function secs(v) {
  if (v === null || v === undefined) return '—';
  if (v < 60) return `${v.toFixed(v < 10 ? 1 : 0)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min ${Math.round(v % 60)} s`;
  return `${Math.floor(v / 3600)} h ${Math.round((v % 3600) / 60)} min`;
}
export const time = (iso) => (iso ? new Date(iso).toLocaleString('en-GB', { dateStyle: 'medium', timeStyle: 'medium' }) : '—');
export const pct = (part, whole) => (whole > 0 ? Math.min(100, Math.round((part / whole) * 100)) : 0);
export const WAIT_REASONS = {
  CREDITS_EXHAUSTED: 'account out of credits',
  KEY_UNUSABLE: 'upstream key refused',
  WINDOW_PAUSED: 'window paused (rate limit)',
  BREAKER_OPEN: 'API breaker open',
  QUOTA: 'monthly quota reached',
  CAP: 'at concurrency cap',
  RATE: 'waiting its fair turn',
};
export const reason = (r) => (r ? WAIT_REASONS[r] ?? r : '—');
