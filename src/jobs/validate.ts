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
  /** Set by retryJob only (not part of the GraphQL input): the job this one is submitted again from. */
  retryOf?: string | null | undefined;
}

export interface ValidJob {
  api: string;
  params: Record<string, string | number | boolean>;
  priority: JobClass;
  idempotencyKey: string | null;
  /** The job this one is submitted again from (retryJob); absent for a new submission. */
  retryOf?: string | null;
}

export const MAX_IDEMPOTENCY_KEY_LENGTH = 200;
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

export function validateJob(input: JobInput, catalog: ApiCatalog, index: number | null = null, limits: ParamLimits = DEFAULT_PARAM_LIMITS): ValidJob {
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
  const key = input.idempotencyKey ?? null;
  if (key !== null) storable(key, 'idempotencyKey', index);
  if (key !== null && (key.length === 0 || key.length > MAX_IDEMPOTENCY_KEY_LENGTH)) {
    refuse('BAD_USER_INPUT', index, `idempotencyKey must be 1 to ${MAX_IDEMPOTENCY_KEY_LENGTH} characters`, { field: 'idempotencyKey' });
  }
  return { api: spec.name, params, priority: priority as JobClass, idempotencyKey: key, ...(input.retryOf ? { retryOf: input.retryOf } : {}) };
}

export function validateSubmission(inputs: readonly JobInput[], catalog: ApiCatalog, maxItems: number, limits: ParamLimits = DEFAULT_PARAM_LIMITS): ValidJob[] {
  if (inputs.length === 0) throw new SluiceError('BAD_USER_INPUT', 'jobs must not be empty');
  if (inputs.length > maxItems) {
    throw new SluiceError('TOO_MANY_ITEMS', `at most ${maxItems} jobs per submission, got ${inputs.length}`, {
      max: maxItems,
      got: inputs.length,
    });
  }
  const valid = inputs.map((input, i) => validateJob(input, catalog, i, limits));
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
