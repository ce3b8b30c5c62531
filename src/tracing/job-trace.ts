/**
 * A job's trace after its submission: what its queued data carries (so a worker on any node
 * continues the trace, with no read of its own) and the spans of its wait, its lease and its
 * settlement. Called only when `tracing.on` and the job's data has a traceparent (`tp`): an
 * untraced job costs the caller one test of a flag.
 *
 * Spans of one attempt, all in the job's trace, children of its submit span:
 *   sluice.queue.wait   from entering the queue to the lease (explicit times), the wait reasons as events
 *   sluice.lease        from the lease call to the settlement landing: window, pace, credits
 *     <METHOD> /<api>   the upstream call (provider/client.ts, a CLIENT span)
 *     sluice.settle     from the outcome queued for settlement to its commit
 */
import { ROOT_CONTEXT, trace, type Context, type Span } from '@opentelemetry/api';
import { addWaitMark, jobAttributes, waitEvents, type TraceAttributes, type WaitMark } from './attributes.ts';
import { apiHoldKey, windowHoldKey, type HoldLog } from './holds.ts';
import { endSpan, setAttributes, startSpan, traceparentOf } from './tracer.ts';

/** The trace fields of a traced job's queued (pg-boss) data. */
export interface QueuedTrace {
  /** The job's traceparent (its submit span). */
  tp: string;
  /** When it entered the queue this time (epoch ms). */
  ta: number;
  /** The wait reasons it was marked with. */
  tw?: WaitMark[];
  /** Its fairness key ('' = the default key). */
  fk?: string;
}

/** The trace fields of a job put back in its queue (a lost lease's release): a fresh wait, with its reason. Pure. */
export function queuedTrace(traceParent: string, reason: string, nowMs = Date.now(), untilMs?: number): QueuedTrace {
  return { tp: traceParent, ta: nowMs, tw: [untilMs === undefined ? [reason, nowMs] : [reason, nowMs, untilMs]] };
}

/** A requeued job's data (a retry, a put-back): its wait starts again now, marked with why and until when. Pure. */
export function requeuedData<T extends Partial<QueuedTrace>>(data: T, reason: string, nowMs: number, untilMs: number): T {
  if (!data.tp) return data;
  return { ...data, ta: nowMs, tw: addWaitMark(data.tw, [reason, nowMs, untilMs]) };
}

/** What one traced attempt carries from its lease to its settlement. */
export interface AttemptTrace {
  /** The sluice.lease span: ended when the settlement lands. */
  lease: Span;
  /** Its traceparent: the upstream call's parent. */
  leaseParent: string | null;
  /** Set when the settlement is planned (settler.ts). */
  billed?: number;
  state?: string;
  outcome?: string;
}

export interface LeasedJob {
  jobId: string;
  tenantId: string;
  jobClass: string;
  attempt: number;
  credits: number;
  data: { api: string } & Partial<QueuedTrace>;
}

export interface LeaseFacts {
  window: string;
  /** The window's pace when it leased: the learned one when the pace is learned. */
  pacedPerMinute: number | null;
  pool: number;
  jobs: number;
  /** When the lease call was sent and when it returned (epoch ms). */
  startMs: number;
  endMs: number;
  /** What held the window and the APIs on this node (the wait's events). */
  holds?: HoldLog;
}

function attrsOf(j: LeasedJob): TraceAttributes {
  return { ...jobAttributes({ id: j.jobId, tenantId: j.tenantId, api: j.data.api, priority: j.jobClass, fairnessKey: j.data.fk }), 'sluice.job.attempt': j.attempt };
}

/**
 * At lease time, on the leasing node: the job's queue.wait span (ended: its times are known) and
 * its lease span (open until the settlement lands). Null when the job is not traced.
 */
export function leaseTrace(j: LeasedJob, l: LeaseFacts): AttemptTrace | null {
  const tp = j.data.tp;
  if (!tp) return null;
  const base = attrsOf(j);
  const since = typeof j.data.ta === 'number' ? Math.min(j.data.ta, l.startMs) : l.startMs;
  const wait = startSpan('sluice.queue.wait', { parent: tp, startMs: since, attributes: base });
  const events = waitEvents(j.data.tw, since, l.endMs, l.holds?.overlapping([windowHoldKey(l.window), apiHoldKey(j.data.api)], since, l.endMs));
  for (const e of events) wait.addEvent('wait', { 'sluice.wait.reason': e.reason }, e.atMs);
  endSpan(wait, { endMs: l.endMs, attributes: { 'sluice.wait.reason': events.at(-1)?.reason } });
  const lease = startSpan('sluice.lease', {
    parent: tp,
    startMs: l.startMs,
    attributes: {
      ...base,
      'sluice.credits.reserved': j.credits,
      'sluice.window': l.window,
      'sluice.window.paced_per_minute': l.pacedPerMinute,
      'sluice.window.pool': l.pool,
      'sluice.lease.jobs': l.jobs,
    },
  });
  return { lease, leaseParent: traceparentOf(lease) };
}

/** The settlement landed (or was let go): its span from `queuedMs`, and the lease span ends. */
export function settledTrace(t: AttemptTrace, queuedMs: number, error?: string): void {
  const parent: Context = trace.setSpan(ROOT_CONTEXT, t.lease);
  const settle = startSpan('sluice.settle', { parent, startMs: queuedMs, attributes: { 'sluice.credits.billed': t.billed, 'sluice.job.state': t.state } });
  endSpan(settle, { error });
  endSpan(t.lease, { attributes: { 'sluice.credits.billed': t.billed, 'sluice.job.state': t.state, 'sluice.outcome': t.outcome }, error });
}

/** Sets attributes on a lease span (through the allowlist). */
export function annotateLease(t: AttemptTrace, attributes: TraceAttributes): void {
  setAttributes(t.lease, attributes);
}
