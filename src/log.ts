import { pino, type Logger } from 'pino';
import { logTraceFields, NO_TRACE_FIELDS } from './tracing/tracer.ts';

export type { Logger };

/**
 * A line written inside a span carries its `trace_id` and `span_id` (the mixin reads the active
 * span). With tracing off the mixin returns one shared frozen empty object, and the merge leaves
 * it alone (pino's default merge writes the line's fields into the mixin's object).
 */
export function createLogger(level: string, name = 'sluice'): Logger {
  return pino({
    name,
    level,
    base: { pid: process.pid },
    mixin: logTraceFields,
    mixinMergeStrategy: (mergeObject, mixinObject) => (mixinObject === NO_TRACE_FIELDS ? mergeObject : Object.assign(mixinObject, mergeObject)),
  });
}
