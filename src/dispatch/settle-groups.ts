/**
 * Which waiting settlements one settlement flusher takes, and what it does when a settlement fails
 * (pure; the dispatcher's flush loop is the I/O around it).
 *
 * A settlement transaction locks its tenants' sched_tenants rows (the lock order). Two flushers of
 * the same process settling the same tenant would only queue behind each other on those rows, each
 * holding a pool connection idle in transaction meanwhile: with 10 tenants and 12 flushers, about
 * half of the sampled busy backends of bench dispatch waited on row locks. So a flusher takes, in
 * queue order, only units none of whose tenants another flusher of this process is settling, up to
 * `max` attempts (a first unit always fits). A unit it skips waits for the flusher that holds its
 * tenant, which looks at the queue again when its transaction ends.
 */
import { isDatabaseUnavailable } from '../db/availability.ts';

export interface SettleUnitShape {
  tenants: readonly string[];
  size: number;
  /** Settled alone, never in a group: a unit split off a group the database refused (see planSettleFailure). */
  solo?: boolean;
}

/** Indices (ascending) of the units to take; `one`: a single unit (a flusher after a failure). */
export function pickSettleUnits(units: readonly SettleUnitShape[], busy: ReadonlySet<string>, max: number, one: boolean): number[] {
  const picked: number[] = [];
  let count = 0;
  for (let i = 0; i < units.length; i++) {
    const u = units[i]!;
    if (u.tenants.some((t) => busy.has(t))) continue;
    if (picked.length > 0 && (one || u.solo || count + u.size > max)) break;
    if (u.solo) return [i];
    picked.push(i);
    count += u.size;
  }
  return picked;
}

/**
 * What a settlement error says about the settlement, from its SQLSTATE:
 * - `outage`: the database is not there right now (db/availability.ts
 *   isDatabaseUnavailable: connection errors, class 08, 57P01-03, 53300), or
 *   it lacks resources (the rest of class 53, class 58). Retried until the
 *   database is back: nothing is wrong with the settlement itself.
 * - `data`: class 22 (data exception: a value Postgres cannot store, e.g.
 *   U+0000 in jsonb) or 23 (integrity constraint violation). The same rows
 *   fail the same way every time: retrying them as they are is pointless.
 * - `other`: anything else (a deadlock, a lock or statement timeout, an error
 *   raised by a function, a bug in our code): perhaps passing, perhaps not,
 *   so retried a bounded number of times (planSettleFailure).
 */
export type SettleErrorClass = 'data' | 'outage' | 'other';

/** The SQLSTATE of a Postgres error (or of the error it wraps), or null. */
export function sqlState(err: unknown): string | null {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
  }
  return null;
}

export function classifySettleError(err: unknown): SettleErrorClass {
  if (isDatabaseUnavailable(err)) return 'outage';
  const state = sqlState(err);
  if (state === null) return 'other';
  if (state.startsWith('22') || state.startsWith('23')) return 'data';
  if (state.startsWith('53') || state.startsWith('58')) return 'outage';
  return 'other';
}

/** Non-outage failures a unit may have before it is settled as a failure instead of retried. */
export const SETTLE_MAX_FAULTS = 5;

/**
 * The next step for settlement units that just failed together:
 * - `retry`: the same units back on the queue (with backoff);
 * - `split`: several units failed together: each goes back alone (solo), so
 *   the one at fault fails alone and the rest land;
 * - `split_attempts`: one unit of several attempts (a batch call's) failed:
 *   one solo unit per attempt, for the same reason;
 * - `fail_final`: one attempt that the database refuses (a data error at
 *   once, another error after `maxFaults`): settled again as a final failure
 *   without its data (RESULT_NOT_STORED), billed as the provider billed;
 * - `leave_to_lease`: even that failure is refused: this process lets the
 *   attempt go (stops refreshing its lease), and the sweeper settles it when
 *   the lease expires, by the timeout rule.
 * Outages are retried for as long as they last; everything else is bounded.
 */
export type SettleFailureStep = 'retry' | 'split' | 'split_attempts' | 'fail_final' | 'leave_to_lease';

export function planSettleFailure(
  f: { error: SettleErrorClass; units: number; attempts: number; faults: number; final: boolean },
  maxFaults = SETTLE_MAX_FAULTS,
): SettleFailureStep {
  if (f.error === 'outage') return 'retry';
  if (f.units > 1) return 'split';
  // `faults` counts this failure too.
  const exhausted = f.error === 'data' || f.faults >= maxFaults;
  if (!exhausted) return 'retry';
  if (f.attempts > 1) return 'split_attempts';
  return f.final ? 'leave_to_lease' : 'fail_final';
}
