/**
 * Validation of submitted jobs: pure, no I/O. A bulk submission is accepted
 * whole or refused whole, so the first bad item refuses all of them and the
 * error names the item's index.
 */
import type { ApiCatalog } from '../config/apis.ts';
import { SluiceError } from '../errors.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';
import { badString } from '../http/input.ts';

export interface JobInput {
  api: string;
  params?: Record<string, unknown> | null | undefined;
  priority?: string | null | undefined;
  idempotencyKey?: string | null | undefined;
  /** Who inside the tenant the job is for: keys share the tenant's turn round robin; absent = the default key. */
  fairnessKey?: string | null | undefined;
  /** Not before this instant (pg-boss startAfter). */
  runAt?: Date | null | undefined;
  /** Set by retryJob only (not part of the GraphQL input): the job this one is submitted again from. */
  retryOf?: string | null | undefined;
}

export interface ValidJob {
  api: string;
  params: Record<string, string | number | boolean>;
  priority: JobClass;
  idempotencyKey: string | null;
  /** null: the tenant's default key (every job without one shares it). */
  fairnessKey?: string | null;
  /** null or absent: as soon as its turn comes. */
  runAt?: Date | null;
  /** The job this one is submitted again from (retryJob); absent for a new submission. */
  retryOf?: string | null;
}

/** When a submission is checked, and how far ahead runAt may be (JOB_RUN_AT_MAX_SECONDS). */
export interface Schedule {
  now: Date;
  maxAheadSeconds: number;
}

/** A runAt this far in the past is a mistake (a wrong clock or time zone), not "now": refused. */
export const RUN_AT_PAST_TOLERANCE_SECONDS = 300;
export const DEFAULT_SCHEDULE_MAX_AHEAD_SECONDS = 30 * 24 * 3600;

/** A job's runAt, checked: null when absent or already due; BAD_RUN_AT when far past or too far ahead. Pure. */
export function checkRunAt(runAt: Date | null | undefined, schedule: Schedule, index: number | null = null): Date | null {
  if (runAt === null || runAt === undefined) return null;
  const ahead = (runAt.getTime() - schedule.now.getTime()) / 1000;
  if (!Number.isFinite(ahead)) refuse('BAD_RUN_AT', index, 'runAt must be a valid timestamp', { field: 'runAt' });
  if (ahead < -RUN_AT_PAST_TOLERANCE_SECONDS) {
    refuse('BAD_RUN_AT', index, `runAt is more than ${RUN_AT_PAST_TOLERANCE_SECONDS} s in the past`, { field: 'runAt', earliest: new Date(schedule.now.getTime() - RUN_AT_PAST_TOLERANCE_SECONDS * 1000).toISOString() });
  }
  if (ahead > schedule.maxAheadSeconds) {
    refuse('BAD_RUN_AT', index, `runAt is more than ${schedule.maxAheadSeconds} s ahead (JOB_RUN_AT_MAX_SECONDS)`, { field: 'runAt', latest: new Date(schedule.now.getTime() + schedule.maxAheadSeconds * 1000).toISOString() });
  }
  return ahead > 0 ? runAt : null;
}

export const MAX_IDEMPOTENCY_KEY_LENGTH = 200;
export const MAX_FAIRNESS_KEY_LENGTH = 64;
const MAX_PARAM_LENGTH = 2_048;

/** One job's params: key count and total JSON size (MAX_PARAM_KEYS, MAX_PARAMS_BYTES). */
export interface ParamLimits {
  maxKeys: number;
  maxBytes: number;
}
export const DEFAULT_PARAM_LIMITS: ParamLimits = { maxKeys: 50, maxBytes: 16 * 1024 };

function refuse(code: ConstructorParameters<typeof SluiceError>[0], index: number | null, message: string, ext: Record<string, unknown> = {}): never {
  const where = index === null ? '' : `jobs[${index}]: `;
  throw new SluiceError(code, where + message, index === null ? ext : { index, ...ext });
}

/** Refuses a string Postgres cannot store (NUL, lone surrogate), naming the field. */
function storable(value: string, field: string, index: number | null): void {
  const reason = badString(value);
  if (reason) refuse('BAD_USER_INPUT', index, `${field} ${reason}`, { field });
}

/** An optional key the client chooses (idempotencyKey, fairnessKey): null when absent, else storable and 1 to `max` characters. */
function optionalKey(value: string | null | undefined, field: string, max: number, index: number | null): string | null {
  if (value === null || value === undefined) return null;
  storable(value, field, index);
  if (value.length === 0 || value.length > max) refuse('BAD_USER_INPUT', index, `${field} must be 1 to ${max} characters`, { field });
  return value;
}

export function validateJob(
  input: JobInput,
  catalog: ApiCatalog,
  index: number | null = null,
  limits: ParamLimits = DEFAULT_PARAM_LIMITS,
  schedule: Schedule = { now: new Date(), maxAheadSeconds: DEFAULT_SCHEDULE_MAX_AHEAD_SECONDS },
): ValidJob {
  storable(input.api, 'api', index);
  const spec = catalog.get(input.api);
  if (!spec) {
    refuse('UNKNOWN_API', index, `unknown api "${input.api}"; known: ${[...catalog.keys()].join(', ')}`, { api: input.api });
  }
  const priority = input.priority ?? 'STANDARD';
  if (!(CLASSES as readonly string[]).includes(priority)) {
    refuse('BAD_PRIORITY', index, `priority must be one of ${CLASSES.join(', ')}, got "${priority}"`, { priority });
  }
  const raw = input.params ?? {};
  if (typeof raw !== 'object' || Array.isArray(raw)) {
    refuse('BAD_USER_INPUT', index, 'params must be a JSON object', { field: 'params' });
  }
  const entries = Object.entries(raw);
  if (entries.length > limits.maxKeys) {
    refuse('BAD_USER_INPUT', index, `params has ${entries.length} keys; at most ${limits.maxKeys} (MAX_PARAM_KEYS)`, { field: 'params', maxKeys: limits.maxKeys });
  }
  const bytes = Buffer.byteLength(JSON.stringify(raw));
  if (bytes > limits.maxBytes) {
    refuse('BAD_USER_INPUT', index, `params is ${bytes} bytes as JSON; at most ${limits.maxBytes} (MAX_PARAMS_BYTES)`, { field: 'params', maxBytes: limits.maxBytes });
  }
  const params: Record<string, string | number | boolean> = {};
  for (const [key, value] of entries) {
    storable(key, 'params (a key)', index);
    if (value === null || value === undefined) continue;
    if (typeof value === 'string') storable(value, `params.${key}`, index);
    if (!['string', 'number', 'boolean'].includes(typeof value)) {
      refuse('BAD_USER_INPUT', index, `params.${key} must be a string, number or boolean`, { field: `params.${key}` });
    }
    if (typeof value === 'string' && value.length > MAX_PARAM_LENGTH) {
      refuse('BAD_USER_INPUT', index, `params.${key} is longer than ${MAX_PARAM_LENGTH} characters`, { field: `params.${key}` });
    }
    params[key] = value as string | number | boolean;
  }
  const missing = spec.requiredParams.filter((p) => params[p] === undefined || String(params[p]).trim() === '');
  if (missing.length > 0) {
    refuse('MISSING_PARAMS', index, `${spec.name} needs ${missing.join(', ')}`, { api: spec.name, missing });
  }
  const key = optionalKey(input.idempotencyKey, 'idempotencyKey', MAX_IDEMPOTENCY_KEY_LENGTH, index);
  const fairnessKey = optionalKey(input.fairnessKey, 'fairnessKey', MAX_FAIRNESS_KEY_LENGTH, index);
  const runAt = checkRunAt(input.runAt, schedule, index);
  return { api: spec.name, params, priority: priority as JobClass, idempotencyKey: key, ...(fairnessKey !== null ? { fairnessKey } : {}), ...(runAt ? { runAt } : {}), ...(input.retryOf ? { retryOf: input.retryOf } : {}) };
}

export function validateSubmission(
  inputs: readonly JobInput[],
  catalog: ApiCatalog,
  maxItems: number,
  limits: ParamLimits = DEFAULT_PARAM_LIMITS,
  schedule: Schedule = { now: new Date(), maxAheadSeconds: DEFAULT_SCHEDULE_MAX_AHEAD_SECONDS },
): ValidJob[] {
  if (inputs.length === 0) throw new SluiceError('BAD_USER_INPUT', 'jobs must not be empty');
  if (inputs.length > maxItems) {
    throw new SluiceError('TOO_MANY_ITEMS', `at most ${maxItems} jobs per submission, got ${inputs.length}`, {
      max: maxItems,
      got: inputs.length,
    });
  }
  const valid = inputs.map((input, i) => validateJob(input, catalog, i, limits, schedule));
  // The same key twice in one submission is ambiguous (which one is "the" job?): refuse it, naming both.
  const firstIndex = new Map<string, number>();
  valid.forEach((job, i) => {
    if (job.idempotencyKey === null) return;
    const first = firstIndex.get(job.idempotencyKey);
    if (first !== undefined) {
      throw new SluiceError('BAD_USER_INPUT', `jobs[${first}] and jobs[${i}] have the same idempotencyKey; each key may appear once per submission`, {
        field: 'idempotencyKey',
        indices: [first, i],
      });
    }
    firstIndex.set(job.idempotencyKey, i);
  });
  return valid;
}
