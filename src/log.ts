import { pino, type Logger } from 'pino';
import { logTraceFields } from './tracing/tracer.ts';

export type { Logger };

/**
 * A line written inside a span carries its `trace_id` and `span_id` (the mixin reads the active
 * span; with tracing off it returns one shared empty object).
 */
export function createLogger(level: string, name = 'sluice'): Logger {
  return pino({ name, level, base: { pid: process.pid }, mixin: logTraceFields });
}
