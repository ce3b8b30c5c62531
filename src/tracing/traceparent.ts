/**
 * W3C trace context as Sluice stores it with a job (jobs.trace_parent, the queued job's data):
 * the `traceparent` text, parsed and made. Pure.
 */

export interface TraceParent {
  traceId: string;
  spanId: string;
  sampled: boolean;
}

const PATTERN = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** A traceparent header's value, or null when it is not one (all-zero ids and version ff are invalid). */
export function parseTraceparent(text: string | null | undefined): TraceParent | null {
  if (typeof text !== 'string') return null;
  const m = PATTERN.exec(text.trim().toLowerCase());
  if (!m) return null;
  const [, version, traceId, spanId, flags] = m;
  if (version === 'ff' || /^0+$/.test(traceId!) || /^0+$/.test(spanId!)) return null;
  return { traceId: traceId!, spanId: spanId!, sampled: (parseInt(flags!, 16) & 1) === 1 };
}

export function formatTraceparent(p: TraceParent): string {
  return `00-${p.traceId}-${p.spanId}-${p.sampled ? '01' : '00'}`;
}

/** The trace id of a stored traceparent, or null. */
export function traceIdOf(text: string | null | undefined): string | null {
  return parseTraceparent(text)?.traceId ?? null;
}

/**
 * A link to a trace in the operator's tracing UI: TRACE_URL_TEMPLATE with `{traceId}` replaced
 * (e.g. `https://jaeger.example/trace/{traceId}`). Null without a template or a trace id.
 */
export function traceUrl(template: string | null | undefined, traceId: string | null): string | null {
  if (!template || !traceId) return null;
  return template.replaceAll('{traceId}', traceId);
}
