/**
 * The OpenTelemetry SDK of this process (or of a webhook sender's thread), and the few helpers
 * Sluice's code calls to make its spans. Everything here is behind `tracing.on`: with tracing off
 * (no OTLP endpoint) no provider is made, the global API stays the no-op one, and callers check
 * the flag before doing any work, so the hot path pays one boolean test.
 *
 * A job's spans are made on different nodes at different times (submit on an API node, the
 * queue wait and the lease on a worker, a webhook on its sender thread), so they are started
 * with an explicit parent, the job's stored traceparent, and often with explicit start and end
 * times, not from the active context.
 */
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags, type Attributes, type Context, type Link, type Span, type SpanContext, type Tracer } from '@opentelemetry/api';
import {
  AlwaysOffSampler,
  AlwaysOnSampler,
  BatchSpanProcessor,
  NodeTracerProvider,
  ParentBasedSampler,
  SamplingDecision,
  TraceIdRatioBasedSampler,
  type Sampler,
  type SamplingResult,
  type SpanProcessor,
} from '@opentelemetry/sdk-trace-node';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources';
import { keepForLinks, type SamplerConfig, type TracingConfig } from './config.ts';
import { allowedAttributes, type TraceAttributes } from './attributes.ts';
import { formatTraceparent, parseTraceparent } from './traceparent.ts';

export { SpanKind };
export type { Span, Context };

/** Read on the hot path: false until startTracing turned tracing on in this thread. */
export const tracing = { on: false };

let provider: NodeTracerProvider | null = null;
let tracer: Tracer | null = null;
let users = 0;

/** Keeps a root span that links to a kept trace (a batch call: config.ts keepForLinks), else asks the configured sampler. */
class LinkAwareSampler implements Sampler {
  private readonly inner: Sampler;
  constructor(inner: Sampler) {
    this.inner = inner;
  }
  shouldSample(ctx: Context, traceId: string, name: string, kind: SpanKind, attributes: Attributes, links: Link[]): SamplingResult {
    const parent = trace.getSpanContext(ctx);
    if (keepForLinks(!parent, links.map((l) => (l.context.traceFlags & TraceFlags.SAMPLED) === TraceFlags.SAMPLED))) return { decision: SamplingDecision.RECORD_AND_SAMPLED };
    return this.inner.shouldSample(ctx, traceId, name, kind, attributes, links);
  }
  toString(): string {
    return `LinkAware{${this.inner.toString()}}`;
  }
}

/** The SDK sampler for a parsed OTEL_TRACES_SAMPLER. */
export function buildSampler(c: SamplerConfig): Sampler {
  const root = (): Sampler => (c.kind.endsWith('always_on') ? new AlwaysOnSampler() : c.kind.endsWith('always_off') ? new AlwaysOffSampler() : new TraceIdRatioBasedSampler(c.ratio));
  return new LinkAwareSampler(c.kind.startsWith('parentbased_') ? new ParentBasedSampler({ root: root() }) : root());
}

/**
 * Starts the SDK once per thread (a second start, e.g. two apps in one test process, shares
 * it): the OTLP/HTTP exporter behind a batch processor (OTEL_BSP_* tune it), the W3C propagator,
 * the AsyncLocalStorage context manager. `processors` replace the exporter (tests).
 * Returns whether tracing is on.
 */
export function startTracing(cfg: TracingConfig, resource: Record<string, string> = {}, processors?: SpanProcessor[]): boolean {
  if (!cfg.enabled) return tracing.on;
  users++;
  if (provider) return true;
  provider = new NodeTracerProvider({
    resource: defaultResource().merge(resourceFromAttributes({ 'service.name': cfg.serviceName, ...resource })).merge(detectResources({ detectors: [envDetector] })),
    sampler: buildSampler(cfg.sampler),
    // The URL is passed, not left to the exporter's own reading of the environment: a webhook
    // thread, or a test's overrides, configure it the same way. Headers (OTEL_EXPORTER_OTLP_HEADERS) it reads itself.
    spanProcessors: processors ?? [new BatchSpanProcessor(new OTLPTraceExporter({ url: cfg.endpoint }))],
  });
  provider.register();
  tracer = provider.getTracer('sluice');
  tracing.on = true;
  return true;
}

/** Flushes what is buffered and stops the SDK when its last user stops. */
export async function stopTracing(): Promise<void> {
  if (!provider || --users > 0) return;
  const p = provider;
  provider = null;
  tracer = null;
  tracing.on = false;
  await p.forceFlush().catch(() => {});
  await p.shutdown().catch(() => {});
  trace.disable();
  propagation.disable();
  context.disable();
}

/** Exports what is buffered now (tests; a stop does it too). */
export async function flushTracing(): Promise<void> {
  await provider?.forceFlush();
}

/** The context a stored traceparent continues, or null when there is none (or it is not one). */
export function parentContext(traceparent: string | null | undefined): Context | null {
  const p = parseTraceparent(traceparent);
  if (!p) return null;
  const sc: SpanContext = { traceId: p.traceId, spanId: p.spanId, traceFlags: p.sampled ? TraceFlags.SAMPLED : TraceFlags.NONE, isRemote: true };
  return trace.setSpanContext(ROOT_CONTEXT, sc);
}

export interface SpanOptions {
  /** A stored traceparent or a context; absent: the active context (null: a new trace). */
  parent?: string | Context | null | undefined;
  kind?: SpanKind;
  /** Epoch ms; absent: now. */
  startMs?: number | undefined;
  attributes?: TraceAttributes;
  links?: Array<{ traceparent: string; attributes?: TraceAttributes }>;
}

/** A span (call only when tracing.on). Attributes pass the allowlist (attributes.ts). */
export function startSpan(name: string, o: SpanOptions = {}): Span {
  const parent = o.parent === undefined ? context.active() : o.parent === null ? ROOT_CONTEXT : typeof o.parent === 'string' ? (parentContext(o.parent) ?? ROOT_CONTEXT) : o.parent;
  const links: Link[] = [];
  for (const l of o.links ?? []) {
    const sc = parentContext(l.traceparent);
    if (sc) links.push({ context: trace.getSpanContext(sc)!, attributes: allowedAttributes(l.attributes ?? {}) });
  }
  return tracer!.startSpan(
    name,
    {
      kind: o.kind ?? SpanKind.INTERNAL,
      ...(o.startMs !== undefined ? { startTime: o.startMs } : {}),
      attributes: allowedAttributes(o.attributes ?? {}),
      ...(links.length > 0 ? { links } : {}),
    },
    parent,
  );
}

/** Sets attributes through the allowlist. */
export function setAttributes(span: Span, attributes: TraceAttributes): void {
  span.setAttributes(allowedAttributes(attributes));
}

/** Ends a span, marking it an error with a code (never a message: messages may quote params). */
export function endSpan(span: Span, o: { endMs?: number | undefined; attributes?: TraceAttributes; error?: string | null | undefined } = {}): void {
  if (o.attributes) setAttributes(span, o.attributes);
  if (o.error) {
    span.setAttribute('error.type', o.error.slice(0, 128));
    span.setStatus({ code: SpanStatusCode.ERROR });
  }
  span.end(o.endMs);
}

/** A sampled span's traceparent (what a job stores and a request carries on); null when not sampled. */
export function traceparentOf(span: Span): string | null {
  const sc = span.spanContext();
  if ((sc.traceFlags & TraceFlags.SAMPLED) !== TraceFlags.SAMPLED) return null;
  return formatTraceparent({ traceId: sc.traceId, spanId: sc.spanId, sampled: true });
}

/** The propagation headers (traceparent, tracestate per OTEL_PROPAGATORS) that make `span` the caller's parent. */
export function propagationHeaders(span: Span): Record<string, string> {
  const carrier: Record<string, string> = {};
  propagation.inject(trace.setSpan(ROOT_CONTEXT, span), carrier);
  return carrier;
}

/** The context an incoming request's headers carry (a client's traceparent), or the root. */
export function extractContext(headers: Record<string, string | string[] | undefined>): Context {
  return propagation.extract(ROOT_CONTEXT, headers);
}

/** Runs `fn` with `span` active: logs written inside carry its ids, spans started inside are its children. */
export function withSpan<T>(span: Span, fn: () => T): T {
  return context.with(trace.setSpan(context.active(), span), fn);
}

/** What logTraceFields returns when there is nothing to add (log.ts's merge knows it and skips it). */
export const NO_TRACE_FIELDS: Readonly<Record<string, never>> = Object.freeze({});

/**
 * The log fields of the active span (pino's mixin): `trace_id` and `span_id`, so a log line
 * written inside a span joins its trace. Nothing when tracing is off or no span is active.
 */
export function logTraceFields(): Record<string, string> {
  // A fresh object otherwise: pino merges the line's fields into it.
  if (!tracing.on) return NO_TRACE_FIELDS;
  const sc = trace.getSpanContext(context.active());
  if (!sc) return NO_TRACE_FIELDS;
  return { trace_id: sc.traceId, span_id: sc.spanId, trace_flags: `0${sc.traceFlags.toString(16)}` };
}
