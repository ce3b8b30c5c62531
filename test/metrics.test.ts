/**
 * Metrics: counters, gauges filled by the collector at scrape time, tenant
 * labels only when enabled, bounded labels, GraphQL request metrics through a
 * real Yoga instance, and GET /metrics on a real HTTP server. Every scrape is
 * parsed by an independent parser of the Prometheus text format.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import type { Sql } from '../src/db/client.ts';
import type { Services } from '../src/graphql/context.ts';
import { createLogger } from '../src/log.ts';
import { MAX_LABEL_VALUES, createMetrics, type GaugeSnapshot, type Metrics } from '../src/metrics.ts';
import { createGraphQL, createHttpServer } from '../src/server.ts';
import { hashSecret } from '../src/tenants/keys.ts';
import { collect } from './helpers/app.ts';

interface Family {
  name: string;
  help: string;
  type: string;
  metrics: Array<{ value?: string; labels?: Record<string, string>; buckets?: Record<string, string>; count?: string; sum?: string }>;
}
const parseText = createRequire(import.meta.url)('parse-prometheus-text-format') as (text: string) => Family[];

async function scrape(m: Metrics): Promise<Map<string, Family>> {
  const { contentType, body } = await m.render();
  assert.match(contentType, /^text\/plain; version=0\.0\.4/);
  return new Map(parseText(body).map((f) => [f.name, f]));
}

/** The value of one series, or undefined when it is not there. */
function value(families: Map<string, Family>, name: string, labels: Record<string, string> = {}): number | undefined {
  const series = families.get(name)?.metrics.find((s) => Object.entries(labels).every(([k, v]) => s.labels?.[k] === v) && Object.keys(s.labels ?? {}).length === Object.keys(labels).length);
  return series?.value === undefined ? undefined : Number(series.value);
}

const SNAPSHOT: GaugeSnapshot = {
  queues: [
    { class: 'INTERACTIVE', depth: 3, oldestAgeSeconds: 1.5 },
    { class: 'BULK', depth: 1200, oldestAgeSeconds: 95 },
    { class: 'STANDARD', depth: 0, oldestAgeSeconds: null },
  ],
  windows: [
    { window: 'primary', tokens: 4.25, poolSize: 12, busy: 7 },
    { window: 'mega', tokens: null, poolSize: 40, busy: 0 },
  ],
  breakers: [
    { api: 'dnslookup', state: 'closed' },
    { api: 'emailvalidator', state: 'half-open' },
    { api: 'weather', state: 'open' },
  ],
  alerts: [
    { alert: 'age_promise_BULK', active: true },
    { alert: 'credits_low', active: false },
  ],
  tenantQueues: [{ tenant: 't-1', class: 'BULK', depth: 1200, running: 2 }],
};

describe('metrics', () => {
  test('counters count what the dispatcher and admission report', async () => {
    const m = createMetrics({ defaultMetrics: false });
    m.dispatched('primary', 'BULK', 5);
    m.dispatched('primary', 'BULK');
    m.dispatched('sub1', 'INTERACTIVE', 2);
    m.outcome('billed', 4);
    m.outcome('rate_limited');
    m.provider429('rate');
    m.provider429('credits', 2);
    m.credits(120, 30);
    m.credits(5);
    m.refused('QUEUE_FULL', 'BULK');
    m.refused('QUOTA_EXCEEDED', 'STANDARD', 3);
    m.alertRaised('age_promise_BULK');
    const f = await scrape(m);
    assert.equal(f.get('sluice_dispatches_total')?.type, 'COUNTER');
    assert.equal(value(f, 'sluice_dispatches_total', { window: 'primary', class: 'BULK' }), 6);
    assert.equal(value(f, 'sluice_dispatches_total', { window: 'sub1', class: 'INTERACTIVE' }), 2);
    assert.equal(value(f, 'sluice_outcomes_total', { kind: 'billed' }), 4);
    assert.equal(value(f, 'sluice_outcomes_total', { kind: 'rate_limited' }), 1);
    assert.equal(value(f, 'sluice_provider_429_total', { kind: 'rate' }), 1);
    assert.equal(value(f, 'sluice_provider_429_total', { kind: 'credits' }), 2);
    assert.equal(value(f, 'sluice_credits_billed_total'), 125);
    assert.equal(value(f, 'sluice_credits_refunded_total'), 30);
    assert.equal(value(f, 'sluice_admissions_refused_total', { code: 'QUEUE_FULL', class: 'BULK' }), 1);
    assert.equal(value(f, 'sluice_admissions_refused_total', { code: 'QUOTA_EXCEEDED', class: 'STANDARD' }), 3);
    assert.equal(value(f, 'sluice_alerts_raised_total', { alert: 'age_promise_BULK' }), 1);
    assert.equal(f.has('process_cpu_user_seconds_total'), false, 'no default metrics when turned off');
  });

  test('gauges come from the collector at each scrape, and what it no longer reports disappears', async () => {
    let snapshot: GaugeSnapshot = SNAPSHOT;
    let calls = 0;
    const m = createMetrics({ defaultMetrics: false, collect: async () => (calls++, snapshot) });
    assert.equal(calls, 0, 'nothing is collected before a scrape');
    let f = await scrape(m);
    assert.equal(calls, 1);
    assert.equal(f.get('sluice_queue_depth')?.type, 'GAUGE');
    assert.equal(value(f, 'sluice_queue_depth', { class: 'BULK' }), 1200);
    assert.equal(value(f, 'sluice_queue_oldest_age_seconds', { class: 'BULK' }), 95);
    assert.equal(value(f, 'sluice_queue_oldest_age_seconds', { class: 'STANDARD' }), 0, 'an empty queue has age 0');
    assert.equal(value(f, 'sluice_pacer_tokens', { window: 'primary' }), 4.25);
    assert.equal(value(f, 'sluice_pacer_tokens', { window: 'mega' }), undefined, 'an unpaced window has no token series');
    assert.equal(value(f, 'sluice_pool_size', { window: 'mega' }), 40);
    assert.equal(value(f, 'sluice_window_busy', { window: 'primary' }), 7);
    assert.equal(value(f, 'sluice_breaker_state', { api: 'dnslookup' }), 0);
    assert.equal(value(f, 'sluice_breaker_state', { api: 'emailvalidator' }), 1);
    assert.equal(value(f, 'sluice_breaker_state', { api: 'weather' }), 2);
    assert.equal(value(f, 'sluice_alerts_active', { alert: 'age_promise_BULK' }), 1);
    assert.equal(value(f, 'sluice_alerts_active', { alert: 'credits_low' }), 0);

    snapshot = { queues: [{ class: 'BULK', depth: 10, oldestAgeSeconds: 2 }], windows: [] };
    f = await scrape(m);
    assert.equal(value(f, 'sluice_queue_depth', { class: 'BULK' }), 10);
    assert.equal(value(f, 'sluice_queue_depth', { class: 'INTERACTIVE' }), undefined, 'stale series are dropped');
    assert.equal(value(f, 'sluice_pool_size', { window: 'primary' }), undefined);
    assert.equal(value(f, 'sluice_breaker_state', { api: 'weather' }), undefined);
  });

  test('a failing collector still gives a scrape: counters, no gauges, and the failure counted', async () => {
    const failures: unknown[] = [];
    let fail = false;
    const m = createMetrics({ defaultMetrics: false, collect: async () => { if (fail) throw new Error('db down'); return SNAPSHOT; }, onCollectError: (e) => failures.push(e) });
    m.outcome('billed');
    assert.equal(value(await scrape(m), 'sluice_queue_depth', { class: 'BULK' }), 1200);
    fail = true;
    const f = await scrape(m);
    assert.equal(value(f, 'sluice_outcomes_total', { kind: 'billed' }), 1);
    assert.equal(value(f, 'sluice_queue_depth', { class: 'BULK' }), undefined, 'no stale gauges from the previous scrape');
    assert.equal(value(f, 'sluice_metrics_collect_errors_total'), 1);
    assert.equal(failures.length, 1);
  });

  test('tenant labels only with METRICS_TENANT_LABELS: off by default, on when asked', async () => {
    const off = await scrape(createMetrics({ defaultMetrics: false, collect: async () => SNAPSHOT }));
    assert.deepEqual([...off.keys()].filter((n) => n.includes('tenant')), []);
    for (const f of off.values()) for (const s of f.metrics) assert.equal(s.labels?.tenant, undefined, f.name);

    const m = createMetrics({ defaultMetrics: false, tenantLabels: true, collect: async () => SNAPSHOT });
    const on = await scrape(m);
    assert.equal(value(on, 'sluice_tenant_queue_depth', { tenant: 't-1', class: 'BULK' }), 1200);
    assert.equal(value(on, 'sluice_tenant_running', { tenant: 't-1', class: 'BULK' }), 2);
  });

  test('labels are bounded: past the limit new values fold into "other"', async () => {
    const m = createMetrics({ defaultMetrics: false });
    for (let i = 0; i < MAX_LABEL_VALUES + 36; i++) m.outcome(`kind-${i}`);
    const f = await scrape(m);
    assert.equal(f.get('sluice_outcomes_total')?.metrics.length, MAX_LABEL_VALUES + 1);
    assert.equal(value(f, 'sluice_outcomes_total', { kind: 'other' }), 36);
    assert.equal(value(f, 'sluice_outcomes_total', { kind: 'kind-0' }), 1);
  });

  test('each Metrics has its own registry with process metrics: two in one process do not clash', async () => {
    const a = createMetrics();
    const b = createMetrics();
    a.outcome('billed');
    const fa = await scrape(a);
    const fb = await scrape(b);
    assert.ok(fa.has('process_cpu_user_seconds_total') && fb.has('process_cpu_user_seconds_total'));
    assert.ok(fa.has('nodejs_eventloop_lag_seconds'));
    assert.equal(value(fa, 'sluice_outcomes_total', { kind: 'billed' }), 1);
    assert.equal(value(fb, 'sluice_outcomes_total', { kind: 'billed' }), undefined);
  });

  test('GraphQL requests are counted per operation type, errors per code, with a duration histogram', async () => {
    const metrics = createMetrics({ defaultMetrics: false });
    // Only introspection and refusals: nothing here reaches a resolver that would use services.
    const yoga = createGraphQL({ services: {} as Services, maxBodyBytes: 1 << 20, log: createLogger('silent'), development: false, metrics, introspection: 'public' });
    const ask = (init: RequestInit) => yoga.fetch('http://localhost/graphql', init);
    const json = (query: string) => ask({ method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ query }) });
    assert.equal((await json('{ __typename }')).status, 200);
    assert.equal((await json('query Named { __type(name: "Job") { name } }')).status, 200);
    assert.equal((await json('{ me { tenant { id } } }')).status, 401);
    assert.equal((await json('mutation { cancelJob(id: "x") { id } }')).status, 401);
    assert.equal((await json(`{ __type(name: "Job") { fields { type { ${'ofType { '.repeat(11)}name${' }'.repeat(11)} } } } }`)).status, 400);
    await json('{ nope'); // a syntax error (Yoga answers 200 to application/json clients, per the GraphQL-over-HTTP spec)
    assert.equal((await ask({ method: 'GET' })).status, 403);

    const f = await scrape(metrics);
    assert.equal(value(f, 'sluice_graphql_requests_total', { operation: 'query', transport: 'http' }), 4);
    assert.equal(value(f, 'sluice_graphql_requests_total', { operation: 'mutation', transport: 'http' }), 1);
    assert.equal(value(f, 'sluice_graphql_requests_total', { operation: 'unknown', transport: 'http' }), 2, 'a syntax error and a CSRF refusal');
    assert.equal(value(f, 'sluice_graphql_errors_total', { operation: 'query', code: 'UNAUTHENTICATED' }), 1);
    assert.equal(value(f, 'sluice_graphql_errors_total', { operation: 'mutation', code: 'UNAUTHENTICATED' }), 1);
    assert.equal(value(f, 'sluice_graphql_errors_total', { operation: 'query', code: 'QUERY_TOO_DEEP' }), 1);
    assert.equal(value(f, 'sluice_graphql_errors_total', { operation: 'unknown', code: 'GRAPHQL_PARSE_FAILED' }), 1);
    assert.equal(value(f, 'sluice_graphql_errors_total', { operation: 'unknown', code: 'CSRF_PREVENTED' }), 1);
    assert.equal(f.get('sluice_graphql_request_duration_seconds')?.type, 'HISTOGRAM');
    // The parser folds a labelled histogram into one series, so read its lines from the text itself.
    const { body } = await metrics.render();
    assert.match(body, /^sluice_graphql_request_duration_seconds_count\{operation="query"\} 4$/m);
    assert.match(body, /^sluice_graphql_request_duration_seconds_bucket\{le="\+Inf",operation="query"\} 4$/m);
    assert.match(body, /^sluice_graphql_request_duration_seconds_sum\{operation="query"\} 0\.\d+/m);
    const names = [...f.values()].flatMap((fam) => fam.metrics.flatMap((s) => Object.keys(s.labels ?? {})));
    assert.ok(!names.includes('operationName') && !names.includes('name'), 'never per operation name');
  });

  test('GET /metrics on the real HTTP server, counting graphql-ws operations too', async () => {
    const metrics = createMetrics({ collect: async () => SNAPSHOT });
    metrics.dispatched('primary', 'STANDARD', 3);
    // The route never touches services; the one graphql-ws operation is introspection by the admin (a hash compare).
    const services = { adminTokenHash: hashSecret('slcadm_metrics_test') } as Services;
    // ops.sql is read only by /readyz, which this test does not request.
    const ops = { sql: undefined as unknown as Sql, expectedMigrations: 0, metrics };
    const { server } = createHttpServer({ services, maxBodyBytes: 1 << 20, log: createLogger('silent'), development: false, metrics, ops });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const ws = createClient({ url: `${base.replace('http', 'ws')}/graphql`, webSocketImpl: WebSocket, connectionParams: { authorization: 'Bearer slcadm_metrics_test' }, retryAttempts: 0 });
      const events = await collect<any>(ws, '{ __typename }', {}, (e) => e.length > 0, 5_000);
      assert.equal(events[0].__typename, 'Query');
      await ws.dispose();
      const res = await fetch(`${base}/metrics`);
      assert.equal(res.status, 200);
      assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
      const f = new Map(parseText(await res.text()).map((fam) => [fam.name, fam]));
      assert.equal(value(f, 'sluice_dispatches_total', { window: 'primary', class: 'STANDARD' }), 3);
      assert.equal(value(f, 'sluice_queue_depth', { class: 'BULK' }), 1200);
      assert.ok(f.has('process_resident_memory_bytes'));
      assert.equal(value(f, 'sluice_graphql_requests_total', { operation: 'query', transport: 'ws' }), 1);
      assert.equal((await fetch(`${base}/metrics`, { method: 'POST' })).status, 405, 'a documented path, a method it does not take');
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
