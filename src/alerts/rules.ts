/**
 * Which alerts should be active, from the system's state: pure. The sweeper
 * compares this with the alerts table and raises or clears the difference.
 */
import type { JobClass } from '../config/classes.ts';

export type Severity = 'page' | 'warning';

export interface DesiredAlert {
  key: string;
  severity: Severity;
  message: string;
}

export interface AlertFacts {
  /** Age (s) of each class's oldest queued job. */
  oldestAgeSeconds: Partial<Record<JobClass, number>>;
  /** The promise (s) made for each class. */
  agePromiseSeconds: Partial<Record<JobClass, number>>;
  accountStop: { reason: string; until: Date } | null;
  windowsStopped: Array<{ name: string; reason: string }>;
  openBreakers: string[];
  /** Windows whose provider asked for a pause beyond RETRY_AFTER_MAX_SECONDS lately (it was capped). */
  cappedAsks?: Array<{ window: string; askedSeconds: number }>;
  /** Expired reservations whose settlement failed on its own (the sweeper skipped them). */
  failedExpiries?: { count: number; ids: string[] };
  /** Jobs that failed with ATTEMPT_LOST in the last hour (their calls kept losing their worker). */
  attemptLost?: { count: number; jobIds: string[] };
}

export function desiredAlerts(f: AlertFacts): DesiredAlert[] {
  const out: DesiredAlert[] = [];
  for (const [cls, age] of Object.entries(f.oldestAgeSeconds) as Array<[JobClass, number]>) {
    const promise = f.agePromiseSeconds[cls];
    if (promise !== undefined && age > promise) {
      out.push({ key: `AGE_PROMISE:${cls}`, severity: 'warning', message: `the oldest ${cls} job has waited ${Math.round(age)} s, past its promise of ${promise} s` });
    }
  }
  if (f.accountStop?.reason === 'CREDITS_EXHAUSTED') {
    out.push({
      key: 'CREDITS_EXHAUSTED',
      severity: 'page',
      message: `the upstream account is out of credits: all dispatch is stopped until ${f.accountStop.until.toISOString()} (renewal) or an admin's resumeDispatch; jobs wait, none is lost`,
    });
  }
  for (const w of f.windowsStopped) {
    if (w.reason === 'KEY_UNUSABLE') {
      out.push({ key: `KEY_UNUSABLE:${w.name}`, severity: 'page', message: `the upstream key of window ${w.name} was refused (401/403): the window is stopped until an admin's resumeDispatch; other windows carry on` });
    }
  }
  for (const api of f.openBreakers) {
    out.push({ key: `BREAKER_OPEN:${api}`, severity: 'warning', message: `${api} is failing (5xx or timeouts): its breaker is open and its jobs wait; other APIs carry on` });
  }
  for (const a of f.cappedAsks ?? []) {
    out.push({
      key: `PROVIDER_ASK_CAPPED:${a.window}`,
      severity: 'warning',
      message: `the provider asked window ${a.window} to pause ${a.askedSeconds} s, beyond RETRY_AFTER_MAX_SECONDS: the pause was capped and the next call decides again`,
    });
  }
  if (f.failedExpiries && f.failedExpiries.count > 0) {
    out.push({
      key: 'EXPIRY_FAILED',
      severity: 'page',
      message: `${f.failedExpiries.count} expired reservation(s) could not be settled and are skipped (their cap and pool slots stay held), e.g. ${f.failedExpiries.ids.join(', ')}: see reservations.expiry_error; the others are settled`,
    });
  }
  if (f.attemptLost && f.attemptLost.count > 0) {
    out.push({
      key: 'ATTEMPT_LOST',
      severity: 'warning',
      message: `${f.attemptLost.count} job(s) failed with ATTEMPT_LOST in the last hour (their calls kept losing their worker), e.g. ${f.attemptLost.jobIds.join(', ')}`,
    });
  }
  return out;
}
