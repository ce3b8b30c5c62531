/**
 * The SDK as Sluice sets it up, in this process with an in-memory exporter: log lines inside a
 * span carry its ids; a batch call's root span is kept when a job it links to was sampled, even at
 * a ratio of 0; an unsampled span gives no traceparent to store; attributes pass the allowlist.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import { createLogger } from '../src/log.ts';
import { endSpan, logTraceFields, SpanKind, startSpan, startTracing, stopTracing, traceparentOf, tracing, withSpan } from '../src/tracing/tracer.ts';

const exporter = new InMemorySpanExporter();

before(() => {
  // Ratio 0: nothing is sampled at the root, so what is kept was kept by a rule.
  startTracing({ enabled: true, endpoint: 'http://unused', serviceName: 'sdk-test', sampler: { kind: 'parentbased_traceidratio', ratio: 0 } }, {}, [new SimpleSpanProcessor(exporter)]);
});
after(() => stopTracing());

test('log lines written inside a span carry trace_id and span_id; others do not', () => {
  assert.equal(tracing.on, true);
  const lines: string[] = [];
  const sink = new Writable({ write: (c, _e, cb) => void (lines.push(String(c)), cb()) });
  const log = pino({ mixin: logTraceFields, mixinMergeStrategy: (m, x) => Object.assign(x, m) }, sink);
  const span = startSpan('work', { parent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' });
  withSpan(span, () => log.info({ a: 1 }, 'inside'));
  log.info('outside');
  endSpan(span);
  const [inside, outside] = lines.map((l) => JSON.parse(l));
  assert.equal(inside.trace_id, '0af7651916cd43dd8448eb211c80319c');
  assert.equal(inside.span_id, span.spanContext().spanId);
  assert.equal(inside.a, 1);
  assert.equal(outside.trace_id, undefined);
  // Sluice's own logger is set up the same way.
  assert.doesNotThrow(() => createLogger('silent').info({ err: new Error('x') }, 'no throw with fields'));
});

test('a root span is sampled by the ratio (0 here): no traceparent to store with a job', () => {
  const span = startSpan('sluice.submit', { parent: null });
  assert.equal(traceparentOf(span), null);
  endSpan(span);
});

test("a client's sampled traceparent is followed, and a batch call linked to a sampled job is kept", () => {
  exporter.reset();
  const lease = startSpan('sluice.lease', { parent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' });
  const tp = traceparentOf(lease)!;
  assert.ok(tp.startsWith('00-0af7651916cd43dd8448eb211c80319c-'));
  const batch = startSpan('POST /v1/x/batch', { parent: null, kind: SpanKind.CLIENT, links: [{ traceparent: tp, attributes: { 'sluice.job.id': 'j1', params: 'no' } as never }], attributes: { 'sluice.job.count': 1, 'x-api-key': 'secret' } as never });
  assert.ok(traceparentOf(batch), 'kept though the ratio is 0');
  endSpan(batch);
  endSpan(lease);
  const done = exporter.getFinishedSpans();
  const b = done.find((s) => s.name === 'POST /v1/x/batch')!;
  assert.notEqual(b.spanContext().traceId, '0af7651916cd43dd8448eb211c80319c');
  assert.equal(b.links.length, 1);
  assert.deepEqual(b.links[0]!.attributes, { 'sluice.job.id': 'j1' });
  assert.deepEqual(b.attributes, { 'sluice.job.count': 1 });
});
