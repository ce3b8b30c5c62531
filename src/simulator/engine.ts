/**
 * The simulated account: keys, windows, credits, conditions and stats, and
 * the decision for every request. In-memory state but no I/O: the HTTP server
 * (server.ts) parses requests, asks the engine for a Reply, waits
 * `delayMs` and writes it. The arithmetic lives in limits.ts (windows,
 * credits) and random.ts (latency, seeded draws).
 *
 * Order of checks for a request (single call or batch), first match answers:
 *   1. key: missing/unknown → 401; deactivated → 401 or 403 (configurable)
 *   2. API unknown → 404; API outside the key's scope → 403
 *   3. (batch) malformed body or not 1..200 items → 400
 *   4. key in cooldown → 429 and the cooldown restarts
 *   5. account at its concurrent-call limit → 429 retry-after 1 (configurable)
 *   6. token: none → 429, the key enters its cooldown
 *      (batch: one token per item; items without one → per-item 429)
 *   7. API outage → 500/503
 *   8. credits: balance <= 0 → 429 (or 402/403) (batch: per-item 402)
 *   9. required params missing / invalid → 400 (batch: per-item 400)
 *  10. hang (never answer / answer late), injected 500/503 by error rate
 *  11. 200, billed at the catalog cost; with a bad-answer fault, its body
 *      unstorable or malformed (bad-answers.ts), billed all the same.
 * 1-8 are the edge's answers and come at once; 9-11 come after the sampled latency.
 */
import { DEFAULT_CATALOG, type ApiCatalog, type ApiSpec } from '../config/apis.ts';
import { PLANS, type Plan } from '../config/plans.ts';
import { encodeBatchResponse, parseBatchRequest, type BatchResultWire } from '../provider/batch-wire.ts';
import { dedupKey } from '../dispatch/batching.ts';
import { HEADER } from '../provider/headers.ts';
import { badBody, corruptData, VALUE_KINDS } from './bad-answers.ts';
import { generateData } from './data.ts';
import {
  addMonthUtc,
  bill,
  canSpend,
  checkCooldown,
  newWindow,
  reconfigureWindow,
  refill,
  renewIfDue,
  takeToken,
  takeTokens,
  type Credits,
  type RateConfig,
  type Window,
} from './limits.ts';
import {
  DEFAULT_API_KEY,
  applyConditionsPatch,
  faultsFor,
  initialConditions,
  type BadAnswerSpec,
  type Conditions,
  type ConditionsPatch,
  type FaultSpec,
  type SimulatorOptions,
  type SubKeySpec,
} from './options.ts';
import { deriveSeed, mulberry32, sampleLatencyMs } from './random.ts';

/** What to send back. */
export interface Reply {
  status: number;
  headers: Record<string, string>;
  /** Bytes when the body is not UTF-8 text (the `invalid-utf8` bad answer). */
  body: string | Buffer;
  /** Wait this long before answering; null = never answer (hang). */
  delayMs: number | null;
  /** Held against the concurrent-call limit until the server calls release(). */
  slot: Slot | null;
  /** The server calls it as it writes the answer (the call log stamps answeredAtMs). */
  answered?: () => void;
}

export interface Slot {
  readonly key: string;
  released: boolean;
}

export interface KeyStats {
  key: string;
  kind: 'primary' | 'sub';
  active: boolean;
  /** APIs the key may call; null = all. */
  apis: string[] | null;
  /** Calls received: a single call counts 1, a batch counts its items (1 if its body is unreadable). */
  calls: number;
  httpRequests: number;
  /** Calls received per second since the stats epoch: `{"0": 9, "1": 10, ...}`. */
  timeline: Record<string, number>;
  /** HTTP statuses answered (a batch counts once, by its HTTP status). */
  responses: Record<string, number>;
  /** Per-item statuses inside batches answered 200. */
  batchItems: Record<string, number>;
  /** Calls refused for the window: empty bucket or cooldown (batch items count one each). */
  rateLimited: number;
  /** Calls refused for the account's concurrent-call limit. */
  concurrencyLimited: number;
  /** Calls refused for credits (429/402/403 and per-item 402). */
  creditsExhausted: number;
  /** Calls received while the key was in cooldown (all refused; each restarted it). */
  callsInCooldown: number;
  billedCalls: number;
  creditsBilled: number;
  /** Answers (or batch items) sent bad by the bad-answer fault; each is also billed. */
  badAnswers: number;
  inFlight: number;
  maxConcurrency: number;
  /** ISO time the cooldown ends, if cooling down. */
  cooldownUntil: string | null;
  /** Tokens in the bucket now (null = unlimited). */
  tokens: number | null;
}

export interface AccountStats {
  plan: string;
  creditsRemaining: number;
  maxCredits: number;
  creditsUsed: number;
  renewalAt: string;
  inFlight: number;
  maxConcurrency: number;
  concurrentCallsLimit: number;
}

export interface SimulatorStats {
  /** Start of the stats period (start or last reset), ms; timeline seconds count from here. */
  epochMs: number;
  nowMs: number;
  account: AccountStats;
  keys: Record<string, KeyStats>;
  /** Requests with a missing or unknown key. */
  unknownKeyCalls: number;
  /**
   * Credits billed per input (`billedInputKey(api, params)`), all keys together: the ground truth
   * a test holds one job's creditsBilled against when every job has its own params.
   */
  creditsByInput: Record<string, number>;
  totals: {
    calls: number;
    httpRequests: number;
    rateLimited: number;
    concurrencyLimited: number;
    creditsExhausted: number;
    callsInCooldown: number;
    billedCalls: number;
    creditsBilled: number;
    badAnswers: number;
  };
}

/** One call in the call log: a single call, or one item of a batch. */
export interface CallRecord {
  /** 1, 2, 3... in arrival order; never reused, not even after resetStats. */
  seq: number;
  /** When the simulator decided the answer (a call is billed then, at arrival). */
  atMs: number;
  /** When the server wrote the answer, after its latency (null until then, and for a hang). */
  answeredAtMs: number | null;
  key: string;
  api: string;
  params: Record<string, unknown>;
  /** What it answered (a batch item: its item status, or the batch's when the batch was refused whole); null = a hang that never answers. */
  status: number | null;
  /** Credits billed for it (0 when not billed). */
  credits: number;
  batch: boolean;
}

export interface CallLogPage {
  /** Whether the log is on (SimulatorOptions.callLog). */
  enabled: boolean;
  calls: CallRecord[];
  /** Pass as `since` to read on from here. */
  next: number;
}

export interface KeyInfo {
  key: string;
  kind: 'primary' | 'sub';
  active: boolean;
  apis: string[] | null;
}

export interface AccountInfo {
  plan: string;
  credits: number;
  maxCredits: number;
  creditsUsed: number;
  renewalAt: Date;
  keys: KeyInfo[];
}

interface KeyState {
  key: string;
  kind: 'primary' | 'sub';
  active: boolean;
  apis: Set<string> | null;
  window: Window;
  inFlight: number;
  stats: Counters;
}

interface Counters {
  calls: number;
  httpRequests: number;
  timeline: Map<number, number>;
  responses: Map<number, number>;
  batchItems: Map<number, number>;
  rateLimited: number;
  concurrencyLimited: number;
  creditsExhausted: number;
  callsInCooldown: number;
  billedCalls: number;
  creditsBilled: number;
  badAnswers: number;
  maxConcurrency: number;
}

function newCounters(inFlight = 0): Counters {
  return {
    calls: 0,
    httpRequests: 0,
    timeline: new Map(),
    responses: new Map(),
    batchItems: new Map(),
    rateLimited: 0,
    concurrencyLimited: 0,
    creditsExhausted: 0,
    callsInCooldown: 0,
    billedCalls: 0,
    creditsBilled: 0,
    badAnswers: 0,
    maxConcurrency: inFlight,
  };
}

const bump = (m: Map<number, number>, k: number, n = 1) => m.set(k, (m.get(k) ?? 0) + n);

export class SimulatorConfigError extends Error {
  override name = 'SimulatorConfigError';
}

export const MESSAGES = {
  keyRequired: 'API key is required. Send it in the x-api-key header.',
  keyInvalid: 'Invalid API key.',
  keySuspended: 'API key is suspended or has insufficient permissions.',
  notInScope: (api: string) => `API "${api}" is not enabled for this API key.`,
  unknownApi: (api: string) => `API "${api}" not found.`,
  rateLimited: (limit: number) => `Rate limit exceeded. Max ${limit} requests per minute. Slow down and retry after the time in retry-after.`,
  concurrency: (n: number, plan: string) => `Too many concurrent requests. Max ${n} concurrent calls on the ${plan} plan.`,
  credits: 'Monthly credit limit reached. Upgrade your plan or wait for your credits to renew.',
  missingParam: (names: string[]) => `Missing required parameter${names.length > 1 ? 's' : ''}: ${names.join(', ')}`,
  serverError: 'Internal server error. Please retry.',
  unavailable: 'Service temporarily unavailable. Please retry.',
} as const;

const okBody = (data: unknown) => JSON.stringify({ status: 'ok', error: null, data });
export const errorBody = (message: string) => JSON.stringify({ status: 'error', error: message, data: null });

export interface Engine {
  handleCall(req: { apiKey: string | null; api: string; params: Record<string, unknown> }): Reply;
  /** `body` is the decoded JSON, or `undefined` when it was not JSON. */
  handleBatch(req: { apiKey: string | null; api: string; body: unknown }): Reply;
  release(slot: Slot): void;
  stats(): SimulatorStats;
  /** The call log after `since` (a seq), at most `limit` entries. */
  calls(since?: number, limit?: number): CallLogPage;
  resetStats(): void;
  conditions(): Conditions;
  setConditions(patch: ConditionsPatch): Conditions;
  account(): AccountInfo;
  setCredits(credits: number): void;
  renew(): void;
  /** Throws SimulatorConfigError on an unknown key. */
  setKeyActive(key: string, active: boolean): void;
  setKeyScope(key: string, apis: string[] | null): void;
  addSubKey(spec: SubKeySpec): void;
  readonly catalog: ApiCatalog;
  readonly plan: Plan;
}

function isPrimaryKey(k: string) {
  return k.startsWith('apv_') && !k.startsWith('apv_sbk_');
}

/** The key of `SimulatorStats.creditsByInput`: the API and its params (key order does not matter). */
export function billedInputKey(api: string, params: Record<string, unknown>): string {
  return dedupKey(api, params);
}

export function createEngine(opts: SimulatorOptions = {}): Engine {
  const clock = opts.now ?? Date.now;
  const plan = PLANS[opts.plan ?? 'PRO'];
  const catalog = opts.catalog ?? DEFAULT_CATALOG;
  const seed = opts.seed ?? 1;
  const latencyRng = mulberry32(deriveSeed(seed, 'latency'));
  const faultRng = mulberry32(deriveSeed(seed, 'faults'));
  // Its own stream: turning bad answers on shifts neither the latency nor the fault draws.
  const badRng = mulberry32(deriveSeed(seed, 'bad-answers'));
  let cond = initialConditions(opts);
  const startMs = clock();
  const maxCredits = opts.maxCredits ?? plan.monthlyCredits;
  let credits: Credits = {
    balance: opts.credits ?? maxCredits,
    used: 0,
    max: maxCredits,
    renewalAtMs: opts.renewalAt ? opts.renewalAt.getTime() : addMonthUtc(startMs),
  };
  let epochMs = startMs;
  let accountInFlight = 0;
  let accountMaxConcurrency = 0;
  let unknownKeyCalls = 0;
  const creditsByInput = new Map<string, number>();
  const keys = new Map<string, KeyState>();
  const callLog: CallRecord[] | null = opts.callLog ? [] : null;
  let callSeq = 0;
  /** Every credit billed since start (never reset): the call log reads what one decision billed from it. */
  let creditsBilledEver = 0;
  /** Per item of the batch being decided: credits billed, and the item results (null when refused whole). */
  let batchItemCredits: number[] = [];
  let batchItems: BatchResultWire[] | null = null;

  const rateCfg = (c: Conditions = cond): RateConfig => ({
    ratePerMinute: c.ratePerMinute,
    burst: c.burst,
    cooldownMs: c.cooldownSeconds * 1000,
  });

  function addKey(key: string, kind: 'primary' | 'sub', apis: string[] | undefined) {
    if (kind === 'primary' && !isPrimaryKey(key)) throw new SimulatorConfigError(`primary key must start with "apv_" (and not "apv_sbk_"), got "${key}"`);
    if (kind === 'sub' && !key.startsWith('apv_sbk_')) throw new SimulatorConfigError(`sub-key must start with "apv_sbk_", got "${key}"`);
    if (keys.has(key)) throw new SimulatorConfigError(`duplicate key "${key}"`);
    if (kind === 'sub') {
      const subs = [...keys.values()].filter((k) => k.kind === 'sub').length;
      if (subs >= plan.subKeys) throw new SimulatorConfigError(`plan ${plan.name} allows ${plan.subKeys} sub-keys`);
    }
    for (const api of apis ?? []) if (!catalog.has(api)) throw new SimulatorConfigError(`key "${key}" scoped to unknown api "${api}"`);
    keys.set(key, {
      key,
      kind,
      active: true,
      apis: apis ? new Set(apis) : null,
      window: newWindow(rateCfg(), clock()),
      inFlight: 0,
      stats: newCounters(),
    });
  }

  addKey(opts.apiKey ?? DEFAULT_API_KEY, 'primary', undefined);
  for (const sk of opts.subKeys ?? []) {
    const spec = typeof sk === 'string' ? { key: sk } : sk;
    addKey(spec.key, 'sub', spec.apis);
  }

  function mustKey(key: string): KeyState {
    const k = keys.get(key);
    if (!k) throw new SimulatorConfigError(`unknown key "${key}"`);
    return k;
  }

  function tick(): number {
    const now = clock();
    credits = renewIfDue(credits, now);
    return now;
  }

  function tokensNow(k: KeyState, now: number): number | null {
    if (cond.ratePerMinute === null) return null;
    return refill(k.window.bucket, now, rateCfg()).tokens;
  }

  /** The retry-after a rate-limit 429 states: the real wait, or what a misbehaving provider asks instead. */
  function asked(realSeconds: number): number {
    return cond.rateLimitRetryAfterSeconds ?? realSeconds;
  }

  function headersFor(k: KeyState | null, now: number, remaining?: number | null, retryAfter?: number): Record<string, string> {
    const h: Record<string, string> = { 'content-type': 'application/json; charset=utf-8' };
    if (k) {
      const rem = remaining !== undefined ? remaining : tokensNow(k, now);
      if (cond.rateLimitHeaders) {
        h[HEADER.rateLimitLimit] = cond.ratePerMinute === null ? 'unlimited' : String(cond.ratePerMinute);
        h[HEADER.rateLimitRemaining] = rem === null ? 'unlimited' : String(Math.max(0, Math.floor(rem)));
      }
      h[HEADER.remainingCredits] = String(credits.balance);
      h[HEADER.maxCredits] = String(credits.max);
      h[HEADER.creditsUsed] = String(credits.used);
      h[HEADER.renewal] = String(Math.floor(credits.renewalAtMs / 1000));
      h[HEADER.currentPlan] = plan.name;
    }
    if (retryAfter !== undefined) {
      h[HEADER.retryAfter] = String(retryAfter);
      if (cond.rateLimitHeaders) h[HEADER.rateLimitReset] = String(retryAfter);
    }
    return h;
  }

  function reply(
    k: KeyState | null,
    now: number,
    status: number,
    body: string | Buffer,
    x: { delayMs?: number | null; slot?: Slot | null; remaining?: number | null; retryAfter?: number; contentType?: string } = {},
  ): Reply {
    if (k) bump(k.stats.responses, status);
    const headers = headersFor(k, now, x.remaining, x.retryAfter);
    if (x.contentType !== undefined) headers['content-type'] = x.contentType;
    return {
      status,
      headers,
      body,
      delayMs: x.delayMs === undefined ? 0 : x.delayMs,
      slot: x.slot ?? null,
    };
  }

  function record(k: KeyState, n: number, now: number) {
    k.stats.calls += n;
    k.stats.httpRequests += 1;
    bump(k.stats.timeline, Math.floor((now - epochMs) / 1000), n);
  }

  function takeSlot(k: KeyState): Slot {
    k.inFlight += 1;
    accountInFlight += 1;
    k.stats.maxConcurrency = Math.max(k.stats.maxConcurrency, k.inFlight);
    accountMaxConcurrency = Math.max(accountMaxConcurrency, accountInFlight);
    return { key: k.key, released: false };
  }

  type Gate = { reply: Reply } | { k: KeyState; spec: ApiSpec; now: number };

  /** Steps 1-2 (and 3 for a batch, via `bodyError`), recording `n` calls for a known key. */
  function gate(apiKey: string | null, api: string, n: number, bodyError: string | null): Gate {
    const now = tick();
    const k = apiKey ? keys.get(apiKey) : undefined;
    if (!k) {
      unknownKeyCalls += 1;
      return { reply: reply(null, now, 401, errorBody(apiKey ? MESSAGES.keyInvalid : MESSAGES.keyRequired)) };
    }
    record(k, n, now);
    if (!k.active) {
      const status = cond.deactivatedKeyStatus;
      return { reply: reply(k, now, status, errorBody(status === 401 ? MESSAGES.keyInvalid : MESSAGES.keySuspended)) };
    }
    const spec = catalog.get(api);
    if (!spec) return { reply: reply(k, now, 404, errorBody(MESSAGES.unknownApi(api))) };
    if (k.apis && !k.apis.has(api)) return { reply: reply(k, now, 403, errorBody(MESSAGES.notInScope(api))) };
    if (bodyError !== null) return { reply: reply(k, now, 400, errorBody(bodyError)) };
    return { k, spec, now };
  }

  /** Steps 4-5: cooldown, then the concurrency limit. Returns a refusal, or the slot. */
  function edge(k: KeyState, now: number, n: number): { reply: Reply } | { slot: Slot } {
    const cd = checkCooldown(k.window, now, rateCfg());
    if (cd.inCooldown) {
      k.window = cd.window;
      k.stats.callsInCooldown += n;
      k.stats.rateLimited += n;
      return {
        reply: reply(k, now, 429, errorBody(MESSAGES.rateLimited(cond.ratePerMinute ?? 0)), { remaining: 0, retryAfter: asked(cd.retryAfterSeconds) }),
      };
    }
    if (accountInFlight >= cond.concurrentCalls) {
      k.stats.concurrencyLimited += n;
      const r = cond.concurrencyLimitResponse;
      return { reply: reply(k, now, r.status, errorBody(MESSAGES.concurrency(cond.concurrentCalls, plan.name)), { retryAfter: r.retryAfterSeconds }) };
    }
    return { slot: takeSlot(k) };
  }

  /** Seeded draws for one admitted request: always the same count, whatever the conditions. */
  function draws(api: string) {
    const f = faultsFor(cond, api);
    const uFault = faultRng();
    const uHang = faultRng();
    const latency = sampleLatencyMs(latencyRng, f.latencyMs, f.latencyP95Ms);
    const hang = f.hang && uHang < f.hang.probability ? f.hang : null;
    const error = uFault < f.errorRate ? f.errorStatus : null;
    return { f, latency, hang, error };
  }

  function missingParams(spec: ApiSpec, params: Record<string, unknown>): string[] {
    return spec.requiredParams.filter((p) => {
      const v = params[p];
      return v === undefined || v === null || (typeof v === 'string' && v.trim() === '');
    });
  }

  function creditsRefusal(k: KeyState, now: number, slot: Slot, remaining: number | null): Reply {
    k.stats.creditsExhausted += 1;
    const status = Number(cond.creditsExhaustedMode);
    const retryAfter = status === 429 ? Math.max(1, Math.ceil((credits.renewalAtMs - now) / 1000)) : undefined;
    return reply(k, now, status, errorBody(MESSAGES.credits), { slot, remaining, ...(retryAfter !== undefined ? { retryAfter } : {}) });
  }

  /** Whether this answer comes back bad (one draw whenever the fault is set, so the sequence replays). */
  function drawBad(f: FaultSpec): BadAnswerSpec | null {
    if (!f.badAnswer) return null;
    return badRng() < f.badAnswer.probability ? f.badAnswer : null;
  }

  function chargeOne(k: KeyState, cost: number, api: string, params: Record<string, unknown>) {
    creditsBilledEver += cost;
    credits = bill(credits, cost);
    k.stats.billedCalls += 1;
    k.stats.creditsBilled += cost;
    const input = billedInputKey(api, params);
    creditsByInput.set(input, (creditsByInput.get(input) ?? 0) + cost);
  }

  function logCall(apiKey: string | null, api: string, params: Record<string, unknown>, status: number | null, billed: number, batch: boolean): CallRecord | null {
    if (!callLog || !apiKey || !keys.has(apiKey)) return null;
    const record: CallRecord = { seq: ++callSeq, atMs: clock(), answeredAtMs: null, key: apiKey, api, params, status, credits: billed, batch };
    callLog.push(record);
    return record;
  }

  /** The reply stamps its records' answer time when the server writes it. */
  function stampAnswer(r: Reply, records: readonly (CallRecord | null)[]): Reply {
    const logged = records.filter((x): x is CallRecord => x !== null);
    if (logged.length > 0 && r.delayMs !== null) {
      r.answered = () => {
        const at = clock();
        for (const x of logged) x.answeredAtMs = at;
      };
    }
    return r;
  }

  const engine: Engine = {
    catalog,
    plan,

    handleCall({ apiKey, api, params }) {
      const g = gate(apiKey, api, 1, null);
      if ('reply' in g) return g.reply;
      const { k, spec, now } = g;
      const e = edge(k, now, 1);
      if ('reply' in e) return e.reply;
      const slot = e.slot;
      const t = takeToken(k.window, now, rateCfg());
      k.window = t.window;
      if (!t.ok) {
        k.stats.rateLimited += 1;
        return reply(k, now, 429, errorBody(MESSAGES.rateLimited(cond.ratePerMinute ?? 0)), { slot, remaining: 0, retryAfter: asked(t.retryAfterSeconds) });
      }
      const remaining = t.remaining;
      const d = draws(api);
      if (d.f.outage !== null) {
        return reply(k, now, d.f.outage, errorBody(d.f.outage === 503 ? MESSAGES.unavailable : MESSAGES.serverError), { slot, remaining });
      }
      if (!canSpend(credits)) return creditsRefusal(k, now, slot, remaining);
      const missing = missingParams(spec, params);
      if (missing.length) return reply(k, now, 400, errorBody(MESSAGES.missingParam(missing)), { slot, remaining, delayMs: d.latency });
      if (d.hang && d.hang.afterMs === null) return reply(k, now, 200, '', { slot, remaining, delayMs: null });
      const delayMs = d.hang ? d.hang.afterMs : d.latency;
      if (d.error !== null) {
        return reply(k, now, d.error, errorBody(d.error === 503 ? MESSAGES.unavailable : MESSAGES.serverError), { slot, remaining, delayMs });
      }
      const data = generateData(api, params);
      if (!data.ok) return reply(k, now, 400, errorBody(data.error), { slot, remaining, delayMs });
      chargeOne(k, spec.creditCost, api, params);
      const bad = drawBad(d.f);
      if (bad) {
        k.stats.badAnswers += 1;
        const b = badBody(bad, { status: 'ok', error: null, data: corruptData(data.data, bad.kind) });
        return reply(k, now, 200, b.body, { slot, remaining, delayMs, ...(b.contentType ? { contentType: b.contentType } : {}) });
      }
      return reply(k, now, 200, okBody(data.data), { slot, remaining, delayMs });
    },

    handleBatch({ apiKey, api, body }) {
      const parsed = body === undefined ? { ok: false as const, error: 'Body must be JSON' } : parseBatchRequest(body);
      const n = parsed.ok ? parsed.value.requests.length : 1;
      const g = gate(apiKey, api, n, parsed.ok ? null : parsed.error);
      if ('reply' in g) return g.reply;
      if (!parsed.ok) throw new Error('unreachable: gate refuses a bad body');
      const { k, spec, now } = g;
      const requests = parsed.value.requests;
      const e = edge(k, now, n);
      if ('reply' in e) return e.reply;
      const slot = e.slot;
      const t = takeTokens(k.window, n, now, rateCfg(), cond.batchOverflowTripsCooldown);
      k.window = t.window;
      const remaining = t.remaining;
      const d = draws(api);
      if (d.f.outage !== null) {
        return reply(k, now, d.f.outage, errorBody(d.f.outage === 503 ? MESSAGES.unavailable : MESSAGES.serverError), { slot, remaining });
      }
      if (d.hang && d.hang.afterMs === null) return reply(k, now, 200, '', { slot, remaining, delayMs: null });
      const delayMs = d.hang ? d.hang.afterMs : d.latency;
      if (d.error !== null) {
        return reply(k, now, d.error, errorBody(d.error === 503 ? MESSAGES.unavailable : MESSAGES.serverError), { slot, remaining, delayMs });
      }
      const results: BatchResultWire[] = requests.map((item, i) => {
        let r: BatchResultWire;
        if (i >= t.granted) {
          k.stats.rateLimited += 1;
          r = { id: item.id, status: 429, retryAfter: asked(t.retryAfterSeconds[i - t.granted] ?? 1), error: MESSAGES.rateLimited(cond.ratePerMinute ?? 0) };
        } else if (!canSpend(credits)) {
          k.stats.creditsExhausted += 1;
          r = { id: item.id, status: 402, error: MESSAGES.credits };
        } else {
          const missing = missingParams(spec, item.params);
          const data = missing.length ? null : generateData(api, item.params);
          if (missing.length) r = { id: item.id, status: 400, error: MESSAGES.missingParam(missing) };
          else if (data && !data.ok) r = { id: item.id, status: 400, error: data.error };
          else {
            chargeOne(k, spec.creditCost, api, item.params);
            batchItemCredits[i] = spec.creditCost;
            r = { id: item.id, status: 200, data: data?.ok ? data.data : null };
            // A value kind corrupts items one by one, each on its own draw.
            if (d.f.badAnswer && VALUE_KINDS.has(d.f.badAnswer.kind) && drawBad(d.f)) {
              k.stats.badAnswers += 1;
              r = { ...r, data: corruptData(r.data, d.f.badAnswer.kind) };
            }
          }
        }
        bump(k.stats.batchItems, r.status);
        return r;
      });
      batchItems = results;
      // The other kinds spoil the batch's body as a whole (one draw per batch); its items stay billed.
      const bad = d.f.badAnswer && !VALUE_KINDS.has(d.f.badAnswer.kind) ? drawBad(d.f) : null;
      if (bad) {
        k.stats.badAnswers += 1;
        const b = badBody(bad, JSON.parse(encodeBatchResponse(results)) as Record<string, unknown>);
        return reply(k, now, 200, b.body, { slot, remaining, delayMs, ...(b.contentType ? { contentType: b.contentType } : {}) });
      }
      return reply(k, now, 200, encodeBatchResponse(results), { slot, remaining, delayMs });
    },

    release(slot) {
      if (slot.released) return;
      slot.released = true;
      const k = keys.get(slot.key);
      if (k) k.inFlight = Math.max(0, k.inFlight - 1);
      accountInFlight = Math.max(0, accountInFlight - 1);
    },

    stats(): SimulatorStats {
      const now = tick();
      const out: Record<string, KeyStats> = {};
      const totals = {
        calls: 0,
        httpRequests: 0,
        rateLimited: 0,
        concurrencyLimited: 0,
        creditsExhausted: 0,
        callsInCooldown: 0,
        billedCalls: 0,
        creditsBilled: 0,
        badAnswers: 0,
      };
      for (const k of keys.values()) {
        const s = k.stats;
        const toObj = (m: Map<number, number>) => Object.fromEntries([...m].sort((a, b) => a[0] - b[0]).map(([a, b]) => [String(a), b]));
        out[k.key] = {
          key: k.key,
          kind: k.kind,
          active: k.active,
          apis: k.apis ? [...k.apis] : null,
          calls: s.calls,
          httpRequests: s.httpRequests,
          timeline: toObj(s.timeline),
          responses: toObj(s.responses),
          batchItems: toObj(s.batchItems),
          rateLimited: s.rateLimited,
          concurrencyLimited: s.concurrencyLimited,
          creditsExhausted: s.creditsExhausted,
          callsInCooldown: s.callsInCooldown,
          billedCalls: s.billedCalls,
          creditsBilled: s.creditsBilled,
          badAnswers: s.badAnswers,
          inFlight: k.inFlight,
          maxConcurrency: s.maxConcurrency,
          cooldownUntil: k.window.cooldownUntilMs > now ? new Date(k.window.cooldownUntilMs).toISOString() : null,
          tokens: tokensNow(k, now),
        };
        for (const f of Object.keys(totals) as (keyof typeof totals)[]) totals[f] += s[f];
      }
      return {
        epochMs,
        nowMs: now,
        account: {
          plan: plan.name,
          creditsRemaining: credits.balance,
          maxCredits: credits.max,
          creditsUsed: credits.used,
          renewalAt: new Date(credits.renewalAtMs).toISOString(),
          inFlight: accountInFlight,
          maxConcurrency: accountMaxConcurrency,
          concurrentCallsLimit: cond.concurrentCalls,
        },
        keys: out,
        unknownKeyCalls,
        creditsByInput: Object.fromEntries(creditsByInput),
        totals,
      };
    },

    calls(since = 0, limit = 10_000) {
      if (!callLog) return { enabled: false, calls: [], next: since };
      // seq ascends, so the first entry after `since` is found by bisection.
      let lo = 0;
      let hi = callLog.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (callLog[mid]!.seq <= since) lo = mid + 1;
        else hi = mid;
      }
      const page = callLog.slice(lo, lo + Math.max(0, limit));
      return { enabled: true, calls: structuredClone(page), next: page.length ? page[page.length - 1]!.seq : since };
    },

    resetStats() {
      if (callLog) callLog.length = 0;
      epochMs = clock();
      unknownKeyCalls = 0;
      creditsByInput.clear();
      accountMaxConcurrency = accountInFlight;
      for (const k of keys.values()) k.stats = newCounters(k.inFlight);
    },

    conditions: () => structuredClone(cond),

    setConditions(patch) {
      const now = clock();
      const before = rateCfg();
      cond = applyConditionsPatch(cond, patch);
      const after = rateCfg();
      if (before.ratePerMinute !== after.ratePerMinute || before.burst !== after.burst || before.cooldownMs !== after.cooldownMs) {
        for (const k of keys.values()) k.window = reconfigureWindow(k.window, now, before, after);
      }
      return structuredClone(cond);
    },

    account() {
      tick();
      return {
        plan: plan.name,
        credits: credits.balance,
        maxCredits: credits.max,
        creditsUsed: credits.used,
        renewalAt: new Date(credits.renewalAtMs),
        keys: [...keys.values()].map((k) => ({ key: k.key, kind: k.kind, active: k.active, apis: k.apis ? [...k.apis] : null })),
      };
    },

    setCredits(value) {
      tick();
      credits = { ...credits, balance: value };
    },

    renew() {
      // A forced renewal restores the allowance but keeps the anniversary.
      tick();
      credits = { ...credits, balance: credits.max, used: 0 };
    },

    setKeyActive(key, active) {
      mustKey(key).active = active;
    },

    setKeyScope(key, apis) {
      for (const api of apis ?? []) if (!catalog.has(api)) throw new SimulatorConfigError(`unknown api "${api}"`);
      mustKey(key).apis = apis ? new Set(apis) : null;
    },

    addSubKey(spec) {
      addKey(spec.key, 'sub', spec.apis);
    },
  };

  if (!callLog) return engine;
  // The call log wraps the two decisions: whatever path a call takes through them, it is logged once, with what it billed.
  const { handleCall, handleBatch } = engine;
  engine.handleCall = (req) => {
    const before = creditsBilledEver;
    const r = handleCall(req);
    return stampAnswer(r, [logCall(req.apiKey, req.api, req.params, r.delayMs === null ? null : r.status, creditsBilledEver - before, false)]);
  };
  engine.handleBatch = (req) => {
    batchItemCredits = [];
    batchItems = null;
    const r = handleBatch(req);
    const parsed = req.body === undefined ? null : parseBatchRequest(req.body);
    const records = parsed?.ok
      ? parsed.value.requests.map((item, i) => logCall(req.apiKey, req.api, item.params, r.delayMs === null ? null : (batchItems?.[i]?.status ?? r.status), batchItemCredits[i] ?? 0, true))
      : [logCall(req.apiKey, req.api, {}, r.status, 0, true)];
    return stampAnswer(r, records);
  };
  return engine;
}
