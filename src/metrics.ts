/**
 * Prometheus metrics for GET /metrics. Each `Metrics` owns its own registry
 * (never prom-client's global one), so several Sluice apps in one process do
 * not clash.
 *
 * - Counters the dispatcher and admission call as things happen.
 * - Gauges filled at scrape time from one injected async collector (queue
 *   depths, pacer tokens, pools, breakers, alerts), so a scrape shows the
 *   state now and nothing goes stale between scrapes.
 * - GraphQL request metrics from a Yoga plugin, per operation type (never per
 *   operation name).
 * - Node process metrics (collectDefaultMetrics) in the same registry.
 *
 * Cardinality is bounded: labels are classes, windows, APIs, outcome kinds and
 * error codes, never jobs; tenant labels only with METRICS_TENANT_LABELS. As a
 * guard against a caller passing something unbounded by mistake, each label
 * keeps at most MAX_LABEL_VALUES distinct values and folds the rest into "other".
 */
import { getOperationAST, type DocumentNode } from 'graphql';
import type { Plugin } from 'graphql-yoga';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export type BreakerState = 'closed' | 'half-open' | 'open';
const BREAKER_VALUE: Record<BreakerState, number> = { closed: 0, 'half-open': 1, open: 2 };

/** What the collector reports at each scrape. Every part is optional; a part left out shows no series. */
export interface GaugeSnapshot {
  /** Per class, all tenants together: jobs waiting, and the age of the oldest (0 or null when none waits). */
  queues?: Array<{ class: string; depth: number; oldestAgeSeconds: number | null }>;
  /** Per window (upstream key): pacer tokens (null = unpaced), pool size, calls in flight. */
  windows?: Array<{ window: string; tokens: number | null; poolSize: number; busy: number; ratePerMinute?: number | null; configuredRatePerMinute?: number | null }>;
  /** Per API circuit breaker. */
  breakers?: Array<{ api: string; state: BreakerState }>;
  /** Every known alert, active or not (so a cleared alert shows 0 rather than vanishing). */
  alerts?: Array<{ alert: string; active: boolean }>;
  /** Per tenant and class; read only when tenant labels are on (the collector may skip the query otherwise). */
  tenantQueues?: Array<{ tenant: string; class: string; depth: number; running: number }>;
  /** Lag against the SFQ bound over the recent leases: the worst pair, and per tenant (tenant labels only). */
  fairness?: { worst: { lag: number; bound: number } | null; tenants: Array<{ tenant: string; lag: number; bound: number }> };
}

export type Collector = () => Promise<GaugeSnapshot>;

export interface MetricsOptions {
  /** Per-tenant series (METRICS_TENANT_LABELS). Default false. */
  tenantLabels?: boolean;
  /** Fills the gauges at each scrape; can also be set later with setCollector. */
  collect?: Collector;
  /** Node process metrics (default true). */
  defaultMetrics?: boolean;
  /** Called when the collector fails (the scrape still answers, without gauges). */
  onCollectError?: (err: unknown) => void;
}

export const MAX_LABEL_VALUES = 64;
export const OTHER = 'other';

/** Folds values past the first `max` distinct ones into "other". */
class BoundedLabel {
  private readonly seen = new Set<string>();
  private readonly max: number;
  constructor(max = MAX_LABEL_VALUES) {
    this.max = max;
  }
  value(v: string): string {
    if (this.seen.has(v)) return v;
    if (this.seen.size >= this.max) return OTHER;
    this.seen.add(v);
    return v;
  }
}

type OperationType = 'query' | 'mutation' | 'subscription' | 'unknown';
const DURATION_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export class Metrics {
  readonly registry = new Registry();
  readonly tenantLabels: boolean;
  private collector: Collector | null;
  private readonly onCollectError: (err: unknown) => void;
  private rendering: Promise<unknown> = Promise.resolve();

  private readonly labels = {
    window: new BoundedLabel(),
    class: new BoundedLabel(),
    outcome: new BoundedLabel(),
    code: new BoundedLabel(),
    alert: new BoundedLabel(),
    errorCode: new BoundedLabel(),
    api: new BoundedLabel(),
  };

  readonly dispatches: Counter<'window' | 'class'>;
  readonly outcomes: Counter<'kind'>;
  readonly provider429s: Counter<'kind'>;
  readonly creditsBilled: Counter;
  readonly creditsRefunded: Counter;
  readonly admissionsRefused: Counter<'code' | 'class'>;
  readonly alertsRaised: Counter<'alert'>;
  readonly collectErrors: Counter;

  readonly queueDepth: Gauge<'class'>;
  readonly queueOldestAge: Gauge<'class'>;
  readonly pacerTokens: Gauge<'window'>;
  readonly poolSize: Gauge<'window'>;
  readonly windowBusy: Gauge<'window'>;
  readonly windowRate: Gauge<'window'>;
  readonly windowConfiguredRate: Gauge<'window'>;
  readonly breakerState: Gauge<'api'>;
  readonly alertsActive: Gauge<'alert'>;
  readonly tenantQueueDepth: Gauge<'tenant' | 'class'> | null;
  readonly tenantRunning: Gauge<'tenant' | 'class'> | null;
  readonly fairLag: Gauge;
  readonly fairLagBound: Gauge;
  readonly tenantFairLag: Gauge<'tenant' | 'of'> | null;

  readonly webhookAttempts: Counter<'outcome'>;
  readonly graphqlRequests: Counter<'operation' | 'transport'>;
  readonly graphqlErrors: Counter<'operation' | 'code'>;
  readonly graphqlDuration: Histogram<'operation'>;

  constructor(opts: MetricsOptions = {}) {
    this.tenantLabels = opts.tenantLabels ?? false;
    this.collector = opts.collect ?? null;
    this.onCollectError = opts.onCollectError ?? (() => {});
    const registers = [this.registry];

    this.dispatches = new Counter({ name: 'sluice_dispatches_total', help: 'Jobs dispatched to the upstream, per window and class.', labelNames: ['window', 'class'], registers });
    this.outcomes = new Counter({ name: 'sluice_outcomes_total', help: 'Upstream call outcomes, per kind (billed, rate_limited, server_error, timeout, ...).', labelNames: ['kind'], registers });
    this.provider429s = new Counter({ name: 'sluice_provider_429_total', help: 'Upstream 429s: kind="rate" (window spent) or "credits" (credits exhausted).', labelNames: ['kind'], registers });
    this.creditsBilled = new Counter({ name: 'sluice_credits_billed_total', help: 'Credits billed by settled calls.', registers });
    this.creditsRefunded = new Counter({ name: 'sluice_credits_refunded_total', help: 'Credits reserved and then refunded at settlement.', registers });
    this.admissionsRefused = new Counter({ name: 'sluice_admissions_refused_total', help: 'Submissions refused at admission, per code and class.', labelNames: ['code', 'class'], registers });
    this.alertsRaised = new Counter({ name: 'sluice_alerts_raised_total', help: 'Alerts raised (each transition to active).', labelNames: ['alert'], registers });
    this.webhookAttempts = new Counter({ name: 'sluice_webhook_attempts_total', help: 'Webhook delivery attempts by this process: outcome="delivered" (2xx) or "failed".', labelNames: ['outcome'], registers });
    this.collectErrors = new Counter({ name: 'sluice_metrics_collect_errors_total', help: 'Scrapes whose gauge collector failed (those scrapes show no gauges).', registers });

    this.queueDepth = new Gauge({ name: 'sluice_queue_depth', help: 'Jobs waiting, per class, all tenants.', labelNames: ['class'], registers });
    this.queueOldestAge = new Gauge({ name: 'sluice_queue_oldest_age_seconds', help: 'Age of the oldest waiting job, per class (0 when none waits).', labelNames: ['class'], registers });
    this.pacerTokens = new Gauge({ name: 'sluice_pacer_tokens', help: "Tokens in the window's pacer bucket now (unpaced windows have no series).", labelNames: ['window'], registers });
    this.poolSize = new Gauge({ name: 'sluice_pool_size', help: "The window's pool size (Little's law).", labelNames: ['window'], registers });
    this.windowBusy = new Gauge({ name: 'sluice_window_busy', help: 'Calls in flight on the window, across nodes.', labelNames: ['window'], registers });
    this.windowRate = new Gauge({ name: 'sluice_window_rate_per_minute', help: "The window's paced rate now, as learned from the provider's answers (unpaced windows have no series).", labelNames: ['window'], registers });
    this.windowConfiguredRate = new Gauge({ name: 'sluice_window_configured_rate_per_minute', help: "The window's paced rate from configuration (limit × PACE_FRACTION): the learned rate's ceiling.", labelNames: ['window'], registers });
    this.breakerState = new Gauge({ name: 'sluice_breaker_state', help: 'Circuit breaker per API: 0 closed, 1 half-open, 2 open.', labelNames: ['api'], registers });
    this.alertsActive = new Gauge({ name: 'sluice_alerts_active', help: 'Alerts now: 1 active, 0 not.', labelNames: ['alert'], registers });
    this.tenantQueueDepth = this.tenantLabels
      ? new Gauge({ name: 'sluice_tenant_queue_depth', help: 'Jobs waiting, per tenant and class (METRICS_TENANT_LABELS).', labelNames: ['tenant', 'class'], registers })
      : null;
    this.tenantRunning = this.tenantLabels
      ? new Gauge({ name: 'sluice_tenant_running', help: 'Calls in flight, per tenant and class (METRICS_TENANT_LABELS).', labelNames: ['tenant', 'class'], registers })
      : null;
    this.fairLag = new Gauge({ name: 'sluice_fair_lag', help: "Recent leases: the worst pair's lag |dW_i/w_i - dW_j/w_j| over any interval (no series with fewer than two tenants backlogged).", registers });
    this.fairLagBound = new Gauge({ name: 'sluice_fair_lag_bound', help: "That pair's SFQ bound 1/w_i + 1/w_j + P/W.", registers });
    this.tenantFairLag = this.tenantLabels
      ? new Gauge({ name: 'sluice_tenant_fair_lag', help: "Per backlogged tenant: its worst lag against another (of=\"lag\") and that pair's bound (of=\"bound\") (METRICS_TENANT_LABELS).", labelNames: ['tenant', 'of'], registers })
      : null;

    this.graphqlRequests = new Counter({
      name: 'sluice_graphql_requests_total',
      help: 'GraphQL requests (HTTP) and operations (graphql-ws), per operation type; refused ones count as operation="unknown" when no document was read.',
      labelNames: ['operation', 'transport'],
      registers,
    });
    this.graphqlErrors = new Counter({ name: 'sluice_graphql_errors_total', help: 'GraphQL errors in HTTP responses, per operation type and extensions.code.', labelNames: ['operation', 'code'], registers });
    this.graphqlDuration = new Histogram({
      name: 'sluice_graphql_request_duration_seconds',
      help: 'Time from receiving a GraphQL HTTP request to its result (for a subscription over SSE: to its first event).',
      labelNames: ['operation'],
      buckets: DURATION_BUCKETS,
      registers,
    });

    if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  /** The gauge collector, for wiring done after construction (the dispatcher that knows the values starts later). */
  setCollector(collect: Collector | null): void {
    this.collector = collect;
  }

  dispatched(window: string, cls: string, n = 1): void {
    this.dispatches.inc({ window: this.labels.window.value(window), class: this.labels.class.value(cls) }, n);
  }

  outcome(kind: string, n = 1): void {
    this.outcomes.inc({ kind: this.labels.outcome.value(kind) }, n);
  }

  provider429(kind: 'rate' | 'credits', n = 1): void {
    this.provider429s.inc({ kind }, n);
  }

  credits(billed: number, refunded = 0): void {
    if (billed > 0) this.creditsBilled.inc(billed);
    if (refunded > 0) this.creditsRefunded.inc(refunded);
  }

  /** An attempt's outcome as it is settled: its kind, the provider's 429s, its credits billed and refunded. */
  attemptSettled(outcome: { kind: string; httpStatus: number | null }, billed: number, reserved: number): void {
    this.outcome(outcome.kind);
    if (outcome.kind === 'rate_limited') this.provider429('rate');
    if (outcome.kind === 'credits_exhausted' && outcome.httpStatus === 429) this.provider429('credits');
    this.credits(billed, reserved - billed);
  }

  refused(code: string, cls: string, n = 1): void {
    this.admissionsRefused.inc({ code: this.labels.code.value(code), class: this.labels.class.value(cls) }, n);
  }

  webhookAttempt(outcome: 'delivered' | 'failed', count = 1): void {
    this.webhookAttempts.inc({ outcome }, count);
  }

  alertRaised(name: string): void {
    this.alertsRaised.inc({ alert: this.labels.alert.value(name) });
  }

  /** The Prometheus text exposition, gauges filled from the collector first. Scrapes are serialised. */
  render(): Promise<{ contentType: string; body: string }> {
    const next = this.rendering.then(() => this.renderNow());
    this.rendering = next.catch(() => {});
    return next;
  }

  private async renderNow(): Promise<{ contentType: string; body: string }> {
    this.resetGauges();
    if (this.collector) {
      try {
        this.fill(await this.collector());
      } catch (err) {
        this.resetGauges();
        this.collectErrors.inc();
        this.onCollectError(err);
      }
    }
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }

  private resetGauges(): void {
    for (const g of [this.queueDepth, this.queueOldestAge, this.pacerTokens, this.poolSize, this.windowBusy, this.windowRate, this.windowConfiguredRate, this.breakerState, this.alertsActive, this.tenantQueueDepth, this.tenantRunning, this.fairLag, this.fairLagBound, this.tenantFairLag]) {
      g?.reset();
    }
  }

  private fill(s: GaugeSnapshot): void {
    for (const q of s.queues ?? []) {
      const labels = { class: this.labels.class.value(q.class) };
      this.queueDepth.set(labels, q.depth);
      this.queueOldestAge.set(labels, q.oldestAgeSeconds ?? 0);
    }
    for (const w of s.windows ?? []) {
      const labels = { window: this.labels.window.value(w.window) };
      if (w.tokens !== null) this.pacerTokens.set(labels, w.tokens);
      this.poolSize.set(labels, w.poolSize);
      this.windowBusy.set(labels, w.busy);
      if (w.ratePerMinute != null) this.windowRate.set(labels, w.ratePerMinute);
      if (w.configuredRatePerMinute != null) this.windowConfiguredRate.set(labels, w.configuredRatePerMinute);
    }
    for (const b of s.breakers ?? []) this.breakerState.set({ api: this.labels.api.value(b.api) }, BREAKER_VALUE[b.state]);
    for (const a of s.alerts ?? []) this.alertsActive.set({ alert: this.labels.alert.value(a.alert) }, a.active ? 1 : 0);
    if (s.fairness?.worst) {
      this.fairLag.set(s.fairness.worst.lag);
      this.fairLagBound.set(s.fairness.worst.bound);
    }
    for (const t of this.tenantFairLag ? (s.fairness?.tenants ?? []) : []) {
      this.tenantFairLag!.set({ tenant: t.tenant, of: 'lag' }, t.lag);
      this.tenantFairLag!.set({ tenant: t.tenant, of: 'bound' }, t.bound);
    }
    if (this.tenantQueueDepth && this.tenantRunning) {
      for (const t of s.tenantQueues ?? []) {
        const labels = { tenant: t.tenant, class: this.labels.class.value(t.class) };
        this.tenantQueueDepth.set(labels, t.depth);
        this.tenantRunning.set(labels, t.running);
      }
    }
  }

  /** GraphQL request metrics: count, errors by code and duration per operation type. */
  yogaPlugin(): Plugin {
    const started = new WeakMap<Request, { at: bigint; operation: OperationType }>();
    const operationOf = (document: DocumentNode, operationName: string | null | undefined): OperationType => {
      try {
        return getOperationAST(document, operationName ?? undefined)?.operation ?? 'unknown';
      } catch {
        return 'unknown';
      }
    };
    const countOperation = (context: unknown, document: DocumentNode, operationName: string | null | undefined) => {
      // graphql-ws operations have no fetch Request in their context; HTTP ones are counted per request below.
      if ((context as { request?: unknown }).request) return;
      this.graphqlRequests.inc({ operation: operationOf(document, operationName), transport: 'ws' });
    };
    return {
      onRequest: ({ request }) => {
        started.set(request, { at: process.hrtime.bigint(), operation: 'unknown' });
      },
      onParse: ({ context }) => {
        const request = (context as { request?: Request }).request;
        return ({ result }) => {
          const entry = request && started.get(request);
          if (entry && result && !(result instanceof Error)) {
            entry.operation = operationOf(result, (context as { params?: { operationName?: string | null } }).params?.operationName);
          }
        };
      },
      onExecute: ({ args }) => countOperation(args.contextValue, args.document, args.operationName),
      onSubscribe: ({ args }) => countOperation(args.contextValue, args.document, args.operationName),
      onResultProcess: ({ request, result }) => {
        const entry = started.get(request);
        if (!entry) return;
        started.delete(request);
        const operation = entry.operation;
        this.graphqlRequests.inc({ operation, transport: 'http' });
        this.graphqlDuration.observe({ operation }, Number(process.hrtime.bigint() - entry.at) / 1e9);
        const results = Array.isArray(result) ? result : Symbol.asyncIterator in (result as object) ? [] : [result];
        for (const r of results as Array<{ errors?: ReadonlyArray<{ extensions?: Record<string, unknown> }> }>) {
          for (const e of r.errors ?? []) {
            const code = typeof e.extensions?.code === 'string' ? e.extensions.code : 'NONE';
            this.graphqlErrors.inc({ operation, code: this.labels.errorCode.value(code) });
          }
        }
      },
    };
  }
}

export function createMetrics(opts: MetricsOptions = {}): Metrics {
  return new Metrics(opts);
}
