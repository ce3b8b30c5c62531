/**
 * The request budget at the front door: every tenant operation is priced
 * before it runs (src/graphql/cost.ts), paid from the tenant's bucket of cost
 * points shared by every API node (src/tenants/budget-store.ts), and what it
 * did not use is given back once it has run. Admin operations are not charged.
 *
 * Clients see where they stand on every tenant answer:
 * - `extensions.cost { requestedQueryCost actualQueryCost throttleStatus { maximumAvailable currentlyAvailable restoreRate } }`;
 * - over HTTP, the IETF RateLimit-Policy and RateLimit headers
 *   (draft-ietf-httpapi-ratelimit-headers: `"budget";q=<burst>;w=<seconds to refill>`
 *   and `"budget";r=<points left>;t=<seconds until full>`);
 * - the `rateLimit` query field (as GitHub's GraphQL API has).
 * Over budget: HTTP 429 with Retry-After, `extensions.code` THROTTLED,
 * `extensions.retryable` true; over graphql-ws the operation gets an error
 * message with the same code and the socket stays open.
 */
import { GraphQLError, type DocumentNode, type ExecutionResult, type GraphQLSchema } from 'graphql';
import type { Plugin } from 'graphql-yoga';
import type { Sql } from '../db/client.ts';
import { actualCost, requestedCost } from '../graphql/cost.ts';
import { chargeBudget, refundBudget } from '../tenants/budget-store.ts';
import { requestBudgetLimits, type RequestBudgetLimits, type TenantRecord } from '../tenants/policy.ts';

/** Where one operation stands with its tenant's budget (kept on the request's context). */
export interface BudgetState {
  limits: RequestBudgetLimits;
  requested: number;
  /** Points left right after the charge (or, when refused, now). */
  available: number;
  granted: boolean;
  /** Set once the operation ran. */
  actual?: number;
  /** When it was refused: seconds until the bucket holds `requested` again. */
  retryAfterSeconds?: number;
  /** The charge could never be granted: the operation costs more than the bucket holds. */
  tooCostly?: boolean;
}

/** What a client is told: Shopify's `extensions.cost` shape. */
export function costExtension(s: BudgetState): Record<string, unknown> {
  return {
    requestedQueryCost: s.requested,
    actualQueryCost: s.granted ? (s.actual ?? s.requested) : 0,
    throttleStatus: { maximumAvailable: s.limits.burst, currentlyAvailable: Math.floor(currentlyAvailable(s)), restoreRate: s.limits.rate },
  };
}

/** Points left once the unused part is refunded. Pure. */
export function currentlyAvailable(s: BudgetState): number {
  const refund = s.granted && s.actual !== undefined ? Math.max(0, s.requested - s.actual) : 0;
  return Math.max(0, Math.min(s.limits.burst, s.available + refund));
}

/** Seconds until the bucket holds `need` points, at least 1. Pure. */
export function secondsUntil(need: number, available: number, rate: number): number {
  if (available >= need) return 0;
  return rate > 0 ? Math.max(1, Math.ceil((need - available) / rate)) : 3600;
}

/** The RateLimit-Policy and RateLimit header values (current draft syntax). Pure. */
export function rateLimitHeaders(s: BudgetState): Record<string, string> {
  const { burst, rate } = s.limits;
  const left = Math.floor(currentlyAvailable(s));
  return {
    'RateLimit-Policy': `"budget";q=${burst};w=${Math.max(1, Math.ceil(burst / Math.max(rate, 1e-9)))}`,
    RateLimit: `"budget";r=${left};t=${Math.ceil(Math.max(0, burst - left) / Math.max(rate, 1e-9))}`,
  };
}

export function throttledError(s: BudgetState, opts: { http: boolean }): GraphQLError {
  if (s.tooCostly) {
    return new GraphQLError(`this operation costs ${s.requested} points; your request budget holds at most ${s.limits.burst}: ask for smaller pages`, {
      extensions: { code: 'QUERY_TOO_COSTLY', retryable: false, cost: costExtension(s), ...(opts.http ? { http: { status: 400 } } : {}) },
    });
  }
  const seconds = s.retryAfterSeconds ?? 1;
  return new GraphQLError(`request budget spent: this operation costs ${s.requested} points and ${Math.floor(s.available)} are left; try again in ${seconds} s`, {
    extensions: {
      code: 'THROTTLED',
      retryable: true,
      retryAfterSeconds: seconds,
      cost: costExtension(s),
      ...(opts.http ? { http: { status: 429, headers: { 'Retry-After': String(seconds), ...rateLimitHeaders(s) } } } : {}),
    },
  });
}

/** What this node last learnt of a tenant's bucket. */
interface Known {
  available: number;
  at: number;
  limits: RequestBudgetLimits;
  /** Until when this node told the tenant to wait (its last Retry-After), ms since epoch. */
  refusedUntil: number;
}

/** Whether two readings of a tenant's budget limits agree (an update changes them: what was learnt under the old ones no longer holds). Pure. */
export function sameLimits(a: RequestBudgetLimits, b: RequestBudgetLimits): boolean {
  return a.burst === b.burst && a.rate === b.rate;
}

/** The most the bucket can hold now: what it held at `at`, restored since, capped (other nodes may have taken some). Pure. */
export function estimateAvailable(k: Pick<Known, 'available' | 'at' | 'limits'>, now: number): number {
  return Math.min(k.limits.burst, k.available + (k.limits.rate * Math.max(0, now - k.at)) / 1000);
}

/**
 * The most points this node keeps for a tenant between statements: a quarter second of its
 * restore rate, at most a tenth of its burst. Taking that much beyond a charge when the node goes
 * to Postgres anyway, and keeping refunds locally up to it, lets a busy tenant's operations be
 * paid from the node's reserve without a round trip each; the shared limit is still kept, off by
 * at most this much per node. Pure.
 */
export function reserveCap(limits: RequestBudgetLimits): number {
  return Math.floor(Math.min(limits.burst / 10, limits.rate / 4));
}

/** The budget of every tenant, as seen from this process. */
export class RequestBudget {
  private readonly sql: Sql;
  private readonly refusalDelayMs: number;
  /** Refunds under way per tenant: this node's next charge for the tenant waits for them (they are quick). */
  private readonly refunds = new Map<string, Promise<void>>();
  /**
   * The level each tenant's bucket had after this node's last charge. Other nodes only take from the
   * bucket, so a request the estimate cannot pay for is refused here without a round trip (a refund
   * on another node could have added its overestimate: the refusal errs by at most that).
   */
  private readonly known = new Map<string, Known>();
  /** Points this node took from each tenant's bucket and has not spent yet (at most `reserveCap`). */
  private readonly reserves = new Map<string, { points: number; limits: RequestBudgetLimits }>();
  /**
   * Tenants whose reserve a charge is topping up right now, until it is in place: one at a time, so
   * concurrent charges do not each take one; they wait for it instead (charge).
   */
  private readonly toppingUp = new Map<string, Promise<void>>();
  /** Charges sent to Postgres, refusals answered from `known`, and charges paid from a reserve (a benchmark's figures). */
  readonly counts = { charges: 0, localRefusals: 0, reserved: 0 };

  /**
   * `refusalDelayMs`: a tenant that asks again before its Retry-After has passed (a client that
   * ignores it) gets its refusal that much later, so a closed loop of such clients costs the node
   * a bounded number of answers a second. A client that waits as told never sees the delay.
   */
  constructor(sql: Sql, opts: { refusalDelayMs?: number } = {}) {
    this.sql = sql;
    this.refusalDelayMs = opts.refusalDelayMs ?? 0;
  }

  /** Prices and pays for one operation. */
  async charge(tenant: TenantRecord, requested: number): Promise<BudgetState> {
    const limits = requestBudgetLimits(tenant);
    if (requested > limits.burst) return { limits, requested, available: limits.burst, granted: false, tooCostly: true };
    for (let waited = false; ; waited = true) {
      await this.refunds.get(tenant.id);
      const now = Date.now();
      const known = this.known.get(tenant.id);
      const reserve = this.reserves.get(tenant.id);
      if (reserve && !sameLimits(reserve.limits, limits)) this.reserves.delete(tenant.id);
      else if (reserve && reserve.points >= requested) {
        reserve.points -= requested;
        this.counts.reserved++;
        const shared = known ? estimateAvailable(known, now) : limits.burst;
        return { limits, requested, available: Math.min(limits.burst, shared + reserve.points), granted: true };
      }
      if (known && sameLimits(known.limits, limits)) {
        const estimate = estimateAvailable(known, now);
        if (estimate < requested) {
          this.counts.localRefusals++;
          const early = now < known.refusedUntil;
          const retryAfterSeconds = secondsUntil(requested, estimate, limits.rate);
          known.refusedUntil = now + retryAfterSeconds * 1000;
          if (early && this.refusalDelayMs > 0) await new Promise((r) => setTimeout(r, Math.min(this.refusalDelayMs, retryAfterSeconds * 1000)));
          return { limits, requested, available: estimate, granted: false, retryAfterSeconds };
        }
      }
      // Another charge of this tenant is topping the reserve up: wait for it once and look again
      // (what it brings pays for a burst from the reserve) instead of sending one more statement on
      // the tenant's row, where a burst of them (a client's first 64 requests) would queue on its lock.
      const toppingUp = this.toppingUp.get(tenant.id);
      if (!toppingUp || waited) return this.chargeInPostgres(tenant, requested, limits, known, now);
      await toppingUp;
    }
  }

  /** A charge sent to Postgres; when it may, it tops this node's reserve up in the same statement. */
  private async chargeInPostgres(tenant: TenantRecord, requested: number, limits: RequestBudgetLimits, known: Known | undefined, now: number): Promise<BudgetState> {
    this.counts.charges++;
    // Going to Postgres anyway: top the reserve up too, when the bucket looks able to pay for both
    // and no other charge of this tenant is topping it up already.
    let extra = this.toppingUp.has(tenant.id) ? 0 : Math.max(0, reserveCap(limits) - (this.reserves.get(tenant.id)?.points ?? 0));
    if (extra > 0 && known && estimateAvailable(known, now) < requested + extra) extra = 0;
    let release: (() => void) | undefined;
    const topping = extra > 0 ? new Promise<void>((resolve) => (release = resolve)) : null;
    if (topping) this.toppingUp.set(tenant.id, topping);
    try {
      let c: Awaited<ReturnType<typeof chargeBudget>> = await chargeBudget(this.sql, tenant.id, limits, requested + extra);
      if (!c.granted && extra > 0) {
        extra = 0;
        c = await chargeBudget(this.sql, tenant.id, limits, requested);
      }
      if (c.granted && extra > 0) {
        // Added to what is there now: other charges may have spent from it or refunded into it meanwhile.
        if (this.reserves.size >= 10_000 && !this.reserves.has(tenant.id)) this.reserves.clear(); // bounded; a cleared reserve only errs in the tenant's disfavour
        const reserve = this.reserves.get(tenant.id);
        if (reserve && sameLimits(reserve.limits, limits)) reserve.points += extra;
        else this.reserves.set(tenant.id, { points: extra, limits });
      }
      const s: BudgetState = c.granted
        ? { limits, requested, available: c.available, granted: true }
        : // Refused: at least a second, even when the read after the refusal already sees enough (time passed between them).
          { limits, requested, available: c.available, granted: false, retryAfterSeconds: Math.max(1, secondsUntil(requested, c.available, limits.rate)) };
      if (this.known.size >= 10_000 && !this.known.has(tenant.id)) this.known.clear(); // bounded: it is only a shortcut
      this.known.set(tenant.id, { available: c.available, at: Date.now(), limits, refusedUntil: s.granted ? 0 : Date.now() + s.retryAfterSeconds! * 1000 });
      return s;
    } finally {
      // Those waiting look again once the reserve (or the refusal's level) is in place.
      if (topping) {
        this.toppingUp.delete(tenant.id);
        release!();
      }
    }
  }

  /** Gives back what the operation did not use (not awaited by the answer; the tenant's next charge here waits for it). */
  settle(tenantId: string, s: BudgetState, actual: number): void {
    s.actual = Math.min(actual, s.requested);
    const points = s.requested - s.actual;
    if (!s.granted || points <= 0) return;
    // Kept in this node's reserve up to its cap; only the rest goes back to the shared bucket.
    const reserve = this.reserves.get(tenantId) ?? { points: 0, limits: s.limits };
    const kept = Math.min(points, Math.max(0, reserveCap(s.limits) - reserve.points));
    if (kept > 0) {
      reserve.points += kept;
      this.reserves.set(tenantId, reserve);
    }
    const returned = points - kept;
    if (returned <= 0) return;
    const known = this.known.get(tenantId);
    if (known) known.available = Math.min(known.limits.burst, known.available + returned);
    const previous = this.refunds.get(tenantId) ?? Promise.resolve();
    const done: Promise<void> = previous
      .then(() => refundBudget(this.sql, tenantId, s.limits, returned))
      .catch(() => {}) // a lost refund only errs in the tenant's disfavour, by at most this operation's overestimate
      .finally(() => {
        if (this.refunds.get(tenantId) === done) this.refunds.delete(tenantId);
      });
    this.refunds.set(tenantId, done);
  }

  /** Waits for this process's refunds (tests, shutdown). */
  async idle(): Promise<void> {
    await Promise.all(this.refunds.values());
  }
}

/** What the budget reads from a GraphQL context. */
interface BudgetContext {
  auth: { kind: string; tenant?: TenantRecord };
  services: { budget?: RequestBudget };
  budget?: BudgetState;
  request?: Request;
}

interface OperationArgs {
  schema: GraphQLSchema;
  document: DocumentNode;
  variableValues?: Record<string, unknown> | null | undefined;
  operationName?: string | null | undefined;
  contextValue: unknown;
}

/**
 * Charges a tenant operation once (the graphql-ws path calls this before it
 * starts the operation, the Yoga plugin for HTTP); null when nothing is
 * charged (admin, or no budget), else the state, granted or not.
 */
export async function chargeOperation(args: OperationArgs): Promise<BudgetState | null> {
  const ctx = args.contextValue as BudgetContext;
  const budget = ctx.services.budget;
  if (!budget || ctx.auth.kind !== 'tenant' || !ctx.auth.tenant) return null;
  if (ctx.budget) return ctx.budget;
  const cost = requestedCost(args.schema, args.document, args.variableValues ?? null, args.operationName ?? null);
  ctx.budget = await budget.charge(ctx.auth.tenant, cost?.total ?? 1);
  return ctx.budget;
}

/** HTTP responses' budget, for the headers (Yoga hands onResponse the request, not the context). */
const byRequest = new WeakMap<Request, BudgetState>();

function withCost(result: ExecutionResult, s: BudgetState): ExecutionResult {
  return { ...result, extensions: { ...(result.extensions ?? {}), cost: costExtension(s) } };
}

/** The Yoga plugin: charge before execution, refund and report after, headers on HTTP answers. */
export function useRequestBudget(): Plugin {
  const before = async (args: OperationArgs, stop: (r: ExecutionResult) => void): Promise<BudgetState | null> => {
    const s = await chargeOperation(args);
    if (!s) return null;
    const request = (args.contextValue as BudgetContext).request;
    if (request) byRequest.set(request, s);
    if (!s.granted) stop(withCost({ errors: [throttledError(s, { http: request !== undefined })] }, s));
    return s;
  };
  return {
    async onExecute({ args, setResultAndStopExecution }) {
      const s = await before(args as OperationArgs, setResultAndStopExecution as (r: ExecutionResult) => void);
      if (!s || !s.granted) return;
      const ctx = args.contextValue as unknown as BudgetContext;
      return {
        onExecuteDone({ result, setResult }) {
          if (Symbol.asyncIterator in result) return; // incremental delivery is not served
          const r = result as ExecutionResult;
          const actual = actualCost(args.schema, args.document, r.data as Record<string, unknown> | null | undefined, args.variableValues as Record<string, unknown> | null, args.operationName);
          ctx.services.budget!.settle(ctx.auth.tenant!.id, s, actual?.total ?? s.requested);
          setResult(withCost(r, s));
        },
      };
    },
    async onSubscribe({ args, setResultAndStopExecution }) {
      // A subscription pays for its start (its first reads); what it pushes later is not charged.
      await before(args as OperationArgs, setResultAndStopExecution as (r: ExecutionResult) => void);
    },
    onResponse({ request, response }) {
      const s = byRequest.get(request);
      // A refusal's error carries its headers (Retry-After too), which Yoga adds to the response itself.
      if (!s || !s.granted) return;
      for (const [k, v] of Object.entries(rateLimitHeaders(s))) response.headers.set(k, v);
    },
  };
}

/** A refusal of a plain HTTP route (not GraphQL) as the route sends it: status, coded JSON body, headers. */
export interface RouteRefusal {
  status: number;
  body: { errors: Array<{ message: string; extensions: Record<string, unknown> }> };
  headers: Record<string, string>;
}

/**
 * The same budget for the plain HTTP routes a tenant key reads (GET /usage.csv, GET /usage/events):
 * a fixed `cost` per request, charged like an operation (no refund: the route's cost is what it
 * reads). Granted: the RateLimit headers its answer carries. Refused: 429 THROTTLED with
 * Retry-After (or 400 QUERY_TOO_COSTLY when the cost is over the bucket), the body GraphQL would
 * carry. Nothing is charged without a budget (REQUEST_BUDGET_ENABLED=false) or for the admin token.
 */
export async function chargeRoute(budget: RequestBudget | undefined, tenant: TenantRecord | null, cost: number): Promise<{ headers: Record<string, string>; refused: RouteRefusal | null }> {
  if (!budget || !tenant) return { headers: {}, refused: null };
  const s = await budget.charge(tenant, cost);
  if (s.granted) return { headers: rateLimitHeaders(s), refused: null };
  const error = throttledError(s, { http: true });
  const { http, ...extensions } = error.extensions as { http?: { status: number; headers?: Record<string, string> } } & Record<string, unknown>;
  return { headers: {}, refused: { status: http?.status ?? 429, body: { errors: [{ message: error.message, extensions }] }, headers: http?.headers ?? {} } };
}
