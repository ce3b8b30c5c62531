/**
 * Tracing's decisions, without an SDK or a database: the configuration from the OTEL_*
 * variables, the sampler's rule for batch calls, the attribute allowlist, the wait events, and
 * traceparent parsing.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { keepForLinks, parseSampler, tracingConfig } from '../src/tracing/config.ts';
import { apiHoldKey, HOLD_MERGE_GAP_MS, HoldLog, HOLDS_PER_KEY, windowHoldKey } from '../src/tracing/holds.ts';
import { addWaitMark, allowedAttributes, MAX_ATTRIBUTE_CHARS, MAX_WAIT_MARKS, outcomeAttributes, requeueReason, TRACE_ATTRIBUTES, waitEvents } from '../src/tracing/attributes.ts';
import { formatTraceparent, parseTraceparent, traceIdOf, traceUrl } from '../src/tracing/traceparent.ts';
import { queuedTrace, requeuedData } from '../src/tracing/job-trace.ts';
import { logTraceFields, tracing } from '../src/tracing/tracer.ts';

describe('tracing configuration', () => {
  test('off without an endpoint, whatever else is set', () => {
    assert.equal(tracingConfig({}).enabled, false);
    assert.equal(tracingConfig({ OTEL_SERVICE_NAME: 'x', OTEL_TRACES_SAMPLER: 'always_on' }).enabled, false);
  });
  test('on with an endpoint; the traces URL from the base endpoint or as given', () => {
    const c = tracingConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/' });
    assert.ok(c.enabled);
    assert.equal(c.endpoint, 'http://collector:4318/v1/traces');
    assert.equal(c.serviceName, 'sluice');
    assert.deepEqual(c.sampler, { kind: 'parentbased_always_on', ratio: 1 });
    const t = tracingConfig({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://x:1/traces', OTEL_SERVICE_NAME: 'sluice-eu' });
    assert.ok(t.enabled);
    assert.equal(t.endpoint, 'http://x:1/traces');
    assert.equal(t.serviceName, 'sluice-eu');
  });
  test('OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none turn it off', () => {
    assert.equal(tracingConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_SDK_DISABLED: 'true' }).enabled, false);
    assert.equal(tracingConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4318', OTEL_TRACES_EXPORTER: 'none' }).enabled, false);
  });
  test('gRPC is refused by name (the bundled exporter speaks OTLP/HTTP)', () => {
    assert.throws(() => tracingConfig({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://c:4317', OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }), /OTEL_EXPORTER_OTLP_PROTOCOL/);
  });
  test('samplers: names, ratios, and typos named', () => {
    assert.deepEqual(parseSampler('traceidratio', '0.1'), { kind: 'traceidratio', ratio: 0.1 });
    assert.deepEqual(parseSampler('parentbased_traceidratio', undefined), { kind: 'parentbased_traceidratio', ratio: 1 });
    assert.deepEqual(parseSampler('always_off', '0.5'), { kind: 'always_off', ratio: 0 });
    assert.deepEqual(parseSampler('ALWAYS_ON', undefined), { kind: 'always_on', ratio: 1 });
    assert.throws(() => parseSampler('sometimes', undefined), /OTEL_TRACES_SAMPLER/);
    assert.throws(() => parseSampler('traceidratio', '1.5'), /OTEL_TRACES_SAMPLER_ARG/);
    assert.throws(() => parseSampler('traceidratio', 'ten'), /OTEL_TRACES_SAMPLER_ARG/);
  });
  test('a root span linked to a kept trace is kept (a batch call of a sampled job)', () => {
    assert.equal(keepForLinks(true, [false, true]), true);
    assert.equal(keepForLinks(true, [false, false]), false);
    assert.equal(keepForLinks(true, []), false);
    assert.equal(keepForLinks(false, [true]), false, 'a child follows its parent');
  });
});

describe('attributes', () => {
  test('only listed keys leave; secrets, params and results do not', () => {
    const out = allowedAttributes({
      'sluice.job.id': 'j1',
      'sluice.credits.billed': 3,
      'sluice.webhook.delivered': true,
      params: { domain: 'x' },
      'sluice.job.params': '{"domain":"x"}',
      result: 'r',
      'x-api-key': 'k',
      authorization: 'Bearer s',
      'url.full': 'https://h/p?token=s',
      'sluice.job.api': null,
      'sluice.window': undefined,
      'http.response.status_code': Number.NaN,
    });
    assert.deepEqual(out, { 'sluice.job.id': 'j1', 'sluice.credits.billed': 3, 'sluice.webhook.delivered': true });
  });
  test('values of other types are dropped and long strings cut', () => {
    const out = allowedAttributes({ 'sluice.job.id': { a: 1 }, 'sluice.tenant.id': 'x'.repeat(500) });
    assert.deepEqual(Object.keys(out), ['sluice.tenant.id']);
    assert.equal((out['sluice.tenant.id'] as string).length, MAX_ATTRIBUTE_CHARS);
  });
  test('the list names no key that could hold a secret or a payload', () => {
    // The fairness key is the tenant's grouping label, asked for by name; no other key is a credential.
    for (const key of Object.keys(TRACE_ATTRIBUTES).filter((k) => k !== 'sluice.job.fairness_key')) assert.doesNotMatch(key, /secret|key$|token|param|result|body|url\.full|query|authorization/i, key);
  });
  test("an outcome: status, classification and the provider's rate-limit headers, no message or data", () => {
    const a = outcomeAttributes({
      kind: 'rate_limited',
      httpStatus: 429,
      creditsBilled: 0,
      data: { secret: 1 },
      message: 'slow down',
      status: { remainingCredits: 10, maxCredits: 100, creditsUsed: 90, renewalAt: null, rateLimitLimit: 60, rateLimitRemaining: 0, plan: 'PRO', observedAt: new Date() },
      retryAfterSeconds: 2,
      latencyMs: 5,
    });
    assert.deepEqual(allowedAttributes(a), {
      'http.response.status_code': 429,
      'sluice.outcome': 'rate_limited',
      'provider.retry_after_seconds': 2,
      'provider.rate_limit.limit': 60,
      'provider.rate_limit.remaining': 0,
      'provider.credits.remaining': 10,
      'error.type': 'rate_limited',
    });
  });
});

describe('wait reasons', () => {
  test('a job that waited its turn only: RATE from when it was accepted', () => {
    assert.deepEqual(waitEvents(undefined, 1000, 1500), [{ reason: 'RATE', atMs: 1000 }]);
  });
  test('scheduled, then its turn from when it was due', () => {
    assert.deepEqual(waitEvents([['SCHEDULED', 1000, 5000]], 1000, 6000), [{ reason: 'SCHEDULED', atMs: 1000 }, { reason: 'RATE', atMs: 5000 }]);
  });
  test('quota: no known end, so no RATE after it', () => {
    assert.deepEqual(waitEvents([['QUOTA', 1000]], 1000, 9000), [{ reason: 'QUOTA', atMs: 1000 }]);
  });
  test("a retry's wait counts its own marks only (earlier waits belong to earlier spans)", () => {
    const data = requeuedData({ tp: '00-' + 'a'.repeat(32) + '-' + 'b'.repeat(16) + '-01', ta: 0, tw: [['SCHEDULED', 0, 10] as [string, number, number]] }, requeueReason(true), 100, 1100);
    assert.equal(data.ta, 100);
    assert.deepEqual(waitEvents(data.tw, data.ta, 2000), [{ reason: 'RETRY', atMs: 100 }, { reason: 'RATE', atMs: 1100 }]);
    assert.equal(requeueReason(false), 'PUT_BACK');
  });
  test('holds of its window and API that overlapped the wait are events; RATE after the last ends', () => {
    const holds = [
      { reason: 'WINDOW_PAUSED', fromMs: 500, untilMs: 2000 },
      { reason: 'BREAKER_OPEN', fromMs: 3000, untilMs: 4000 },
      { reason: 'KEY_UNUSABLE', fromMs: 9000, untilMs: 9500 },
    ];
    assert.deepEqual(waitEvents(undefined, 1000, 6000, holds), [
      { reason: 'WINDOW_PAUSED', atMs: 1000 },
      { reason: 'BREAKER_OPEN', atMs: 3000 },
      { reason: 'RATE', atMs: 4000 },
    ]);
    // Leased while the hold still stood (a pause lifted early, a probe): no RATE after it.
    assert.deepEqual(waitEvents([['SCHEDULED', 1000, 1500]], 1000, 3500, holds), [
      { reason: 'SCHEDULED', atMs: 1000 },
      { reason: 'WINDOW_PAUSED', atMs: 1000 },
      { reason: 'BREAKER_OPEN', atMs: 3000 },
    ]);
  });
  test('a hold log merges the looks at one hold and keeps a bounded history per key', () => {
    const log = new HoldLog();
    log.note(apiHoldKey('dnslookup'), 'BREAKER_OPEN', 1000);
    log.note(apiHoldKey('dnslookup'), 'BREAKER_OPEN', 1500);
    log.note(apiHoldKey('dnslookup'), 'BREAKER_OPEN', 1000 + 500 + HOLD_MERGE_GAP_MS);
    log.note(apiHoldKey('dnslookup'), 'BREAKER_OPEN', 10_000 + HOLD_MERGE_GAP_MS * 2);
    log.note(windowHoldKey('primary'), 'WINDOW_PAUSED', 1200, 5000);
    assert.deepEqual(log.overlapping([apiHoldKey('dnslookup'), windowHoldKey('primary')], 0, 4000), [
      { reason: 'BREAKER_OPEN', fromMs: 1000, untilMs: 1000 + 500 + HOLD_MERGE_GAP_MS },
      { reason: 'WINDOW_PAUSED', fromMs: 1200, untilMs: 5000 },
    ]);
    assert.deepEqual(log.overlapping([apiHoldKey('other')], 0, 1e9), []);
    for (let i = 0; i < HOLDS_PER_KEY + 5; i++) log.note(windowHoldKey('w'), i % 2 ? 'WINDOW_PAUSED' : 'KEY_UNUSABLE', i * 10_000);
    assert.equal(log.overlapping([windowHoldKey('w')], 0, 1e9).length, HOLDS_PER_KEY);
  });
  test('an untraced job is left as it is', () => {
    const data: { tenantId: string; tp?: string } = { tenantId: 't' };
    assert.equal(requeuedData(data, 'RETRY', 1, 2), data);
  });
  test('marks stay bounded', () => {
    let marks = addWaitMark(undefined, ['RETRY', 0]);
    for (let i = 1; i < 40; i++) marks = addWaitMark(marks, ['RETRY', i]);
    assert.equal(marks.length, MAX_WAIT_MARKS);
    assert.equal(marks.at(-1)![1], 39);
  });
  test("a lost lease's release starts a fresh wait", () => {
    assert.deepEqual(queuedTrace('tp', 'LEASE_LOST', 7), { tp: 'tp', ta: 7, tw: [['LEASE_LOST', 7]] });
  });
});

describe('traceparent', () => {
  const tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  test('parsed and made back', () => {
    const p = parseTraceparent(tp)!;
    assert.deepEqual(p, { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', sampled: true });
    assert.equal(formatTraceparent(p), tp);
    assert.equal(traceIdOf(tp), p.traceId);
  });
  test('invalid ones are not parents', () => {
    for (const bad of [null, '', 'x', '00-' + '0'.repeat(32) + '-b7ad6b7169203331-01', '00-0af7651916cd43dd8448eb211c80319c-' + '0'.repeat(16) + '-01', 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01']) {
      assert.equal(parseTraceparent(bad), null, String(bad));
    }
    assert.equal(parseTraceparent('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00')!.sampled, false);
  });
  test('the console link from TRACE_URL_TEMPLATE', () => {
    assert.equal(traceUrl('http://jaeger:16686/trace/{traceId}', 'abc'), 'http://jaeger:16686/trace/abc');
    assert.equal(traceUrl(undefined, 'abc'), null);
    assert.equal(traceUrl('http://x/{traceId}', null), null);
  });
});

test('with tracing off, log lines get no trace fields (one shared empty object)', () => {
  assert.equal(tracing.on, false);
  assert.equal(logTraceFields(), logTraceFields());
  assert.deepEqual(logTraceFields(), {});
});
