/**
 * Simulator options from environment variables, validated with zod. Used by
 * `npm run simulator` (main.ts) and reusable by the app's demo mode. A bad
 * value throws a SimulatorConfigError whose message names the variable.
 * An empty variable counts as unset.
 */
import { z } from 'zod';
import { buildCatalog } from '../config/apis.ts';
import { PLAN_NAMES, PLANS } from '../config/plans.ts';
import { SimulatorConfigError } from './engine.ts';
import { DEFAULT_API_KEY, type SimulatorOptions } from './options.ts';

/** Defaults of the standalone simulator (in-process `startSimulator` defaults differ: port 0, no latency). */
export const ENV_DEFAULTS = {
  SIMULATOR_PORT: 4100,
  SIMULATOR_HOST: '127.0.0.1',
  SIMULATOR_API_KEY: DEFAULT_API_KEY,
  SIMULATOR_PLAN: 'PRO',
  SIMULATOR_LATENCY_MS: 120,
  SIMULATOR_SEED: 1,
} as const;

const int = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  z.coerce.number({ error: 'must be a number' }).int('must be an integer').min(min, `must be >= ${min}`).max(max, `must be <= ${max}`);
const positive = () => z.coerce.number({ error: 'must be a number' }).positive('must be > 0');
const nonNegative = () => z.coerce.number({ error: 'must be a number' }).nonnegative('must be >= 0');

const VARS = {
  SIMULATOR_PORT: int(0, 65535),
  SIMULATOR_HOST: z.string().min(1),
  SIMULATOR_API_KEY: z
    .string()
    .regex(/^apv_/, 'must start with "apv_"')
    .refine((k) => !k.startsWith('apv_sbk_'), 'a primary key must not start with "apv_sbk_"'),
  SIMULATOR_SUB_KEYS: z
    .string()
    .transform((s) => s.split(',').map((k) => k.trim()).filter(Boolean))
    .refine((keys) => keys.every((k) => k.startsWith('apv_sbk_')), 'every sub-key must start with "apv_sbk_"'),
  SIMULATOR_PLAN: z
    .string()
    .transform((s) => s.toUpperCase())
    .pipe(z.enum(PLAN_NAMES, { error: `must be one of ${PLAN_NAMES.join(', ')}` })),
  SIMULATOR_RATE_PER_MINUTE: z.union([z.enum(['unlimited', 'none']).transform(() => null), positive()]),
  SIMULATOR_BURST: positive(),
  SIMULATOR_COOLDOWN_SECONDS: nonNegative(),
  SIMULATOR_CONCURRENT_CALLS: int(1),
  SIMULATOR_CREDITS: int(Number.MIN_SAFE_INTEGER),
  SIMULATOR_MAX_CREDITS: int(1),
  SIMULATOR_LATENCY_MS: nonNegative(),
  SIMULATOR_LATENCY_P95_MS: nonNegative(),
  SIMULATOR_SEED: int(0, 0xffffffff),
  SIMULATOR_DEACTIVATED_KEY_STATUS: z.enum(['401', '403']).transform((s) => (s === '401' ? 401 : 403) as 401 | 403),
  SIMULATOR_CREDITS_EXHAUSTED_MODE: z.enum(['429', '402', '403']),
} as const;

type VarName = keyof typeof VARS;
export const SIMULATOR_ENV_VARS = [...Object.keys(VARS), 'API_COSTS'] as readonly string[];

/**
 * Reads SIMULATOR_* (and API_COSTS, the same cost overrides the app reads, so
 * the simulator bills what the ledger expects) into SimulatorOptions.
 */
export function simulatorOptionsFromEnv(env: Readonly<Record<string, string | undefined>> = process.env): SimulatorOptions {
  const errors: string[] = [];
  const values: Partial<Record<VarName, unknown>> = {};
  for (const name of Object.keys(VARS) as VarName[]) {
    const raw = env[name]?.trim();
    if (raw === undefined || raw === '') continue;
    const r = VARS[name].safeParse(raw);
    if (r.success) values[name] = r.data;
    else errors.push(`${name}: ${r.error.issues[0]?.message ?? 'invalid'} (got "${raw}")`);
  }
  let catalog;
  try {
    catalog = buildCatalog(env.API_COSTS ?? '');
  } catch (err) {
    errors.push(`API_COSTS: ${err instanceof Error ? err.message : String(err)}`);
  }
  const plan = PLANS[(values.SIMULATOR_PLAN as (typeof PLAN_NAMES)[number] | undefined) ?? ENV_DEFAULTS.SIMULATOR_PLAN];
  const subKeyCount = (values.SIMULATOR_SUB_KEYS as string[] | undefined)?.length ?? 0;
  if (subKeyCount > plan.subKeys) errors.push(`SIMULATOR_SUB_KEYS: plan ${plan.name} allows ${plan.subKeys} sub-keys, got ${subKeyCount}`);
  if (errors.length) throw new SimulatorConfigError(`invalid simulator configuration: ${errors.join('; ')}`);

  const v = values as {
    SIMULATOR_PORT?: number;
    SIMULATOR_HOST?: string;
    SIMULATOR_API_KEY?: string;
    SIMULATOR_SUB_KEYS?: string[];
    SIMULATOR_PLAN?: (typeof PLAN_NAMES)[number];
    SIMULATOR_RATE_PER_MINUTE?: number | null;
    SIMULATOR_BURST?: number;
    SIMULATOR_COOLDOWN_SECONDS?: number;
    SIMULATOR_CONCURRENT_CALLS?: number;
    SIMULATOR_CREDITS?: number;
    SIMULATOR_MAX_CREDITS?: number;
    SIMULATOR_LATENCY_MS?: number;
    SIMULATOR_LATENCY_P95_MS?: number;
    SIMULATOR_SEED?: number;
    SIMULATOR_DEACTIVATED_KEY_STATUS?: 401 | 403;
    SIMULATOR_CREDITS_EXHAUSTED_MODE?: '429' | '402' | '403';
  };
  const opts: SimulatorOptions = {
    port: v.SIMULATOR_PORT ?? ENV_DEFAULTS.SIMULATOR_PORT,
    host: v.SIMULATOR_HOST ?? ENV_DEFAULTS.SIMULATOR_HOST,
    apiKey: v.SIMULATOR_API_KEY ?? ENV_DEFAULTS.SIMULATOR_API_KEY,
    subKeys: v.SIMULATOR_SUB_KEYS ?? [],
    plan: v.SIMULATOR_PLAN ?? ENV_DEFAULTS.SIMULATOR_PLAN,
    latencyMs: v.SIMULATOR_LATENCY_MS ?? ENV_DEFAULTS.SIMULATOR_LATENCY_MS,
    seed: v.SIMULATOR_SEED ?? ENV_DEFAULTS.SIMULATOR_SEED,
  };
  if (catalog) opts.catalog = catalog;
  if (v.SIMULATOR_RATE_PER_MINUTE !== undefined) opts.ratePerMinute = v.SIMULATOR_RATE_PER_MINUTE;
  if (v.SIMULATOR_BURST !== undefined) opts.burst = v.SIMULATOR_BURST;
  if (v.SIMULATOR_COOLDOWN_SECONDS !== undefined) opts.cooldownSeconds = v.SIMULATOR_COOLDOWN_SECONDS;
  if (v.SIMULATOR_CONCURRENT_CALLS !== undefined) opts.concurrentCalls = v.SIMULATOR_CONCURRENT_CALLS;
  if (v.SIMULATOR_CREDITS !== undefined) opts.credits = v.SIMULATOR_CREDITS;
  if (v.SIMULATOR_MAX_CREDITS !== undefined) opts.maxCredits = v.SIMULATOR_MAX_CREDITS;
  if (v.SIMULATOR_LATENCY_P95_MS !== undefined) opts.latencyP95Ms = v.SIMULATOR_LATENCY_P95_MS;
  if (v.SIMULATOR_DEACTIVATED_KEY_STATUS !== undefined) opts.deactivatedKeyStatus = v.SIMULATOR_DEACTIVATED_KEY_STATUS;
  if (v.SIMULATOR_CREDITS_EXHAUSTED_MODE !== undefined) opts.creditsExhaustedMode = v.SIMULATOR_CREDITS_EXHAUSTED_MODE;
  return opts;
}
