-- Job.traceParent: the W3C traceparent of the submitting request when tracing was on (src/tracing/);
-- null otherwise. Nullable with no default: adding it rewrites nothing.
ALTER TABLE "jobs" ADD COLUMN "trace_parent" text;