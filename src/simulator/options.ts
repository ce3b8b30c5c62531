/**
 * The simulator's configuration: start-up options, the run-time conditions
 * (what tests and the admin endpoint change mid-run), and the pure helpers
 * that resolve and patch them.
 */
import { z } from 'zod';
import type { ApiCatalog } from '../config/apis.ts';
import { PLANS, type PlanName } from '../config/plans.ts';
import { defaultBurst } from './limits.ts';

/** A hang: the simulator holds the request instead of answering it. */
export interface HangSpec {
  /** Share of calls that hang, 0..1. Default 1. */
  probability: number;
  /**
   * null: never answer (the call is not billed; the slot is held until the
   * client gives up). A number: answer normally after this many ms (the call
   * IS billed, at arrival, like a real server that finished the work after the
   * client timed out).
   */
  afterMs: number | null;
}

/**
 * How a bad answer is bad. Every one is an HTTP 200, billed like the success
 * it replaces (the upstream did the work; what came back is what it scraped):
 * - `nul`: a well-formed envelope whose data holds U+0000 (`\u0000` on the wire),
 * - `lone-surrogate`: the same with an unpaired surrogate (`\ud800` on the wire),
 * - `html`: an HTML page (a proxy's or a CDN's error page) with `content-type: text/html`,
 * - `truncated-json`: the envelope cut in the middle,
 * - `invalid-utf8`: the envelope with bytes that are not UTF-8 inside a string,
 * - `huge`: a well-formed envelope padded to `hugeBytes`.
 * In a batch, `nul` and `lone-surrogate` corrupt items (each billed item draws
 * on its own); the other kinds corrupt the batch's body as a whole.
 */
export type BadAnswerKind = 'nul' | 'lone-surrogate' | 'html' | 'truncated-json' | 'invalid-utf8' | 'huge';

export const BAD_ANSWER_KINDS: readonly BadAnswerKind[] = ['nul', 'lone-surrogate', 'html', 'truncated-json', 'invalid-utf8', 'huge'];

/** Answers that are unstorable or malformed, though answered 200 and billed. */
export interface BadAnswerSpec {
  /** Share of answers that would have been a 200 that come back bad, 0..1. Default 1. */
  probability: number;
  kind: BadAnswerKind;
  /** Size of a `huge` body in bytes. Default 4 MiB (DEFAULT_HUGE_BYTES). */
  hugeBytes?: number;
}

export const DEFAULT_HUGE_BYTES = 4 * 1024 * 1024;

/** Latency and faults; set account-wide and overridden per API. */
export interface FaultSpec {
  /** Median latency of an answered call (log-normal). 0 = answer at once. */
  latencyMs: number;
  /** 95th percentile latency; at or below the median = constant latency. */
  latencyP95Ms: number;
  /** Share of admitted calls answered with `errorStatus` (not billed), 0..1. */
  errorRate: number;
  errorStatus: 500 | 503;
  /** Every call to the API answers this status at once (not billed); null = no outage. */
  outage: 500 | 503 | null;
  hang: HangSpec | null;
  /** Bad answers (HTTP 200, billed) instead of good ones; null = every answer is well formed. */
  badAnswer: BadAnswerSpec | null;
}

export interface ConcurrencyLimitResponse {
  status: 429 | 503;
  retryAfterSeconds: number;
}

export interface Conditions extends FaultSpec {
  /** Per-API overrides of the fault fields. */
  apis: Record<string, Partial<FaultSpec>>;
  /** Per-key window limit; null = no per-minute ceiling (Mega). */
  ratePerMinute: number | null;
  /** Bucket capacity per key. */
  burst: number;
  /** Cooldown after a key trips its window; calls during it restart it. */
  cooldownSeconds: number;
  /** Account-wide limit on calls in flight. */
  concurrentCalls: number;
  concurrencyLimitResponse: ConcurrencyLimitResponse;
  /** What a deactivated key gets (undocumented upstream: either is plausible). */
  deactivatedKeyStatus: 401 | 403;
  /** How an account out of credits answers single calls (batch items always get 402). */
  creditsExhaustedMode: '429' | '402' | '403';
  /** Whether batch items refused for want of tokens also start the key's cooldown. */
  batchOverflowTripsCooldown: boolean;
  /** Whether answers state the window (`x-rate-limit-limit`, `-remaining`, `-reset`); false = a provider that never says. */
  rateLimitHeaders: boolean;
  /** A rate-limit 429 asks for this many seconds instead of the real wait (a provider asking too much); null = the real wait. */
  rateLimitRetryAfterSeconds: number | null;
}

/** A change of conditions: any subset; `apis.<api>: null` clears that API's overrides. */
export type ConditionsPatch = Partial<Omit<Conditions, 'apis'>> & {
  apis?: Record<string, Partial<FaultSpec> | null>;
};

export interface SubKeySpec {
  key: string;
  /** APIs this key may call; absent = all. */
  apis?: string[];
}

export interface SimulatorOptions {
  /** 0 (default) = a free port. */
  port?: number;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default PRO. */
  plan?: PlanName;
  /** Overrides the plan's per-minute limit; null = unlimited. */
  ratePerMinute?: number | null;
  /** Default max(1, round(ratePerMinute / 20)). */
  burst?: number;
  /** Default 50. */
  cooldownSeconds?: number;
  /** Overrides the plan's concurrent-call limit. */
  concurrentCalls?: number;
  /** Starting balance; default maxCredits. */
  credits?: number;
  /** The monthly allowance; default the plan's. */
  maxCredits?: number;
  /** Next renewal; default one month from now. */
  renewalAt?: Date;
  /** Primary key, must start `apv_`. Default `apv_demo_primary`. */
  apiKey?: string;
  /** Sub-keys (`apv_sbk_...`), at most the plan's sub-key count. */
  subKeys?: (string | SubKeySpec)[];
  /** Median latency in ms; default 0 (answer at once). */
  latencyMs?: number;
  /** 95th percentile latency; default 3 x median. */
  latencyP95Ms?: number;
  /** Seed of every random choice (latency, faults). Default 1. */
  seed?: number;
  catalog?: ApiCatalog;
  deactivatedKeyStatus?: 401 | 403;
  creditsExhaustedMode?: '429' | '402' | '403';
  concurrencyLimitResponse?: ConcurrencyLimitResponse;
  /** Any further initial conditions (faults, per-API overrides...). */
  conditions?: ConditionsPatch;
  /** Clock in ms (default Date.now): drives windows, cooldowns, renewal and the stats timeline, not latency timers. */
  now?: () => number;
  /**
   * Keep a log of every call a known key sent, with its params, status and credits billed
   * (`calls()`, `GET /admin/calls`), so a test or bench can attribute each call to the job that
   * made it. Default off: it grows with every call.
   */
  callLog?: boolean;
}

export const DEFAULT_API_KEY = 'apv_demo_primary';
export const DEFAULT_COOLDOWN_SECONDS = 50;

export function initialConditions(opts: SimulatorOptions): Conditions {
  const plan = PLANS[opts.plan ?? 'PRO'];
  const ratePerMinute = opts.ratePerMinute === undefined ? plan.ratePerMinute : opts.ratePerMinute;
  const latencyMs = opts.latencyMs ?? 0;
  const base: Conditions = {
    latencyMs,
    latencyP95Ms: opts.latencyP95Ms ?? latencyMs * 3,
    errorRate: 0,
    errorStatus: 503,
    outage: null,
    hang: null,
    badAnswer: null,
    apis: {},
    ratePerMinute,
    burst: opts.burst ?? defaultBurst(ratePerMinute),
    cooldownSeconds: opts.cooldownSeconds ?? DEFAULT_COOLDOWN_SECONDS,
    concurrentCalls: opts.concurrentCalls ?? plan.concurrentCalls,
    concurrencyLimitResponse: opts.concurrencyLimitResponse ?? { status: 429, retryAfterSeconds: 1 },
    deactivatedKeyStatus: opts.deactivatedKeyStatus ?? 401,
    creditsExhaustedMode: opts.creditsExhaustedMode ?? '429',
    batchOverflowTripsCooldown: false,
    rateLimitHeaders: true,
    rateLimitRetryAfterSeconds: null,
  };
  return opts.conditions ? applyConditionsPatch(base, opts.conditions) : base;
}

/**
 * A new Conditions with the patch applied. Changing `ratePerMinute` without
 * `burst` resets the burst to the default for the new rate; a median latency
 * without a p95 gets a p95 of 3 x the median (so does a per-API one); per-API
 * overrides merge field by field, and `null` clears an API's overrides.
 */
export function applyConditionsPatch(current: Conditions, patch: ConditionsPatch): Conditions {
  const { apis: apisPatch, ...rest } = patch;
  const defined = Object.fromEntries(Object.entries(rest).filter(([, v]) => v !== undefined)) as Partial<Conditions>;
  const next: Conditions = { ...current, ...defined, apis: { ...current.apis } };
  if (patch.ratePerMinute !== undefined && patch.burst === undefined) next.burst = defaultBurst(next.ratePerMinute);
  if (patch.latencyMs !== undefined && patch.latencyP95Ms === undefined) next.latencyP95Ms = patch.latencyMs * 3;
  for (const [api, override] of Object.entries(apisPatch ?? {})) {
    if (override === null) delete next.apis[api];
    else next.apis[api] = { ...next.apis[api], ...override };
  }
  return next;
}

/** The effective fault spec of one API. */
export function faultsFor(c: Conditions, api: string): FaultSpec {
  const o = c.apis[api] ?? {};
  return {
    latencyMs: o.latencyMs ?? c.latencyMs,
    latencyP95Ms: o.latencyP95Ms ?? (o.latencyMs !== undefined ? o.latencyMs * 3 : c.latencyP95Ms),
    errorRate: o.errorRate ?? c.errorRate,
    errorStatus: o.errorStatus ?? c.errorStatus,
    outage: o.outage !== undefined ? o.outage : c.outage,
    hang: o.hang !== undefined ? o.hang : c.hang,
    badAnswer: o.badAnswer !== undefined ? o.badAnswer : c.badAnswer,
  };
}

// ------------------------------------------------------------ zod schemas (admin endpoint)

const hangSchema = z.strictObject({
  probability: z.number().min(0).max(1).default(1),
  afterMs: z.number().int().nonnegative().nullable().default(null),
});

const badAnswerSchema = z.strictObject({
  probability: z.number().min(0).max(1).default(1),
  kind: z.enum(BAD_ANSWER_KINDS as [BadAnswerKind, ...BadAnswerKind[]]),
  hugeBytes: z.number().int().positive().max(256 * 1024 * 1024).default(DEFAULT_HUGE_BYTES),
});

const faultFields = {
  latencyMs: z.number().nonnegative(),
  latencyP95Ms: z.number().nonnegative(),
  errorRate: z.number().min(0).max(1),
  errorStatus: z.union([z.literal(500), z.literal(503)]),
  outage: z.union([z.literal(500), z.literal(503)]).nullable(),
  hang: hangSchema.nullable(),
  badAnswer: badAnswerSchema.nullable(),
};

const faultPatchSchema = z.strictObject(faultFields).partial();

export const conditionsPatchSchema = z
  .strictObject({
    ...faultFields,
    apis: z.record(z.string(), faultPatchSchema.nullable()),
    ratePerMinute: z.number().positive().nullable(),
    burst: z.number().positive(),
    cooldownSeconds: z.number().nonnegative(),
    concurrentCalls: z.number().int().positive(),
    concurrencyLimitResponse: z.strictObject({
      status: z.union([z.literal(429), z.literal(503)]),
      retryAfterSeconds: z.number().int().nonnegative(),
    }),
    deactivatedKeyStatus: z.union([z.literal(401), z.literal(403)]),
    creditsExhaustedMode: z.enum(['429', '402', '403']),
    batchOverflowTripsCooldown: z.boolean(),
    rateLimitHeaders: z.boolean(),
    rateLimitRetryAfterSeconds: z.number().int().positive().nullable(),
  })
  .partial();

// Compile-time check that the schema's output fits ConditionsPatch.
const _patchFits: (p: z.infer<typeof conditionsPatchSchema>) => ConditionsPatch = (p) => p;
void _patchFits;
