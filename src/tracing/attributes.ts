/**
 * What Sluice's spans may say: the one list of attribute keys (README "Tracing" prints it), the
 * filter every attribute passes through, and the attribute sets of a job's spans. Pure.
 *
 * An allowlist, not a denylist: a key nobody put on the list is dropped, so a new call site
 * cannot leak a job's params or result, an API key, a webhook secret or a URL with a token in
 * it by accident. Values are numbers, booleans, or short strings (identifiers and codes).
 */
import type { CallOutcome, ProviderStatus } from '../provider/types.ts';

export const TRACE_ATTRIBUTES = {
  // Who and what.
  'sluice.tenant.id': 'the tenant',
  'sluice.job.id': 'the job',
  'sluice.job.api': 'the upstream API it calls (a catalog name)',
  'sluice.job.priority': 'its priority class',
  'sluice.job.fairness_key': "the fairness key the tenant gave it (absent: the tenant's default key)",
  'sluice.job.attempt': 'the attempt number (1 for the first call)',
  'sluice.job.state': 'the state the settlement left it in (SUCCEEDED, FAILED, QUEUED for a retry)',
  'sluice.job.count': 'jobs in a submission, or carried by a batch call',
  // Credits.
  'sluice.credits.reserved': 'credits the attempt reserved at lease time',
  'sluice.credits.billed': 'credits billed for the attempt',
  // The wait and the lease.
  'sluice.wait.reason': 'why the job waited (on a queue.wait event): SCHEDULED, QUOTA, RETRY, PUT_BACK, LEASE_LOST, WINDOW_PAUSED, KEY_UNUSABLE, CREDITS_EXHAUSTED, BREAKER_OPEN, RATE',
  'sluice.window': 'the upstream window (key) the job was leased on',
  'sluice.window.paced_per_minute': "the window's pace at lease time, learned or configured (absent: unlimited)",
  'sluice.window.pool': "the window's pool (concurrent calls) at lease time",
  'sluice.lease.jobs': 'jobs the lease call handed out',
  'sluice.outcome': 'how the provider answered, classified (billed, rate_limited, server_error, timeout, ...)',
  // The provider's answer.
  'provider.rate_limit.limit': 'x-rate-limit-limit',
  'provider.rate_limit.remaining': 'x-rate-limit-remaining',
  'provider.credits.remaining': 'x-api-remaining-credits',
  'provider.retry_after_seconds': 'the pause the provider asked for (after the cap)',
  // Webhooks and subscriptions.
  'sluice.webhook.endpoint.id': 'the webhook endpoint',
  'sluice.webhook.delivery.id': 'the delivery (the webhook-id header)',
  'sluice.webhook.event': 'the event (JOB_SUCCEEDED, ...)',
  'sluice.webhook.attempt': 'the delivery attempt number',
  'sluice.webhook.delivered': 'the receiver accepted it (2xx)',
  'sluice.subscription.subscribers': 'subscribers on this node the event was pushed to',
  // Standard HTTP and GraphQL attributes (no query strings: a GET's params travel in them).
  'http.request.method': 'HTTP method',
  'http.response.status_code': 'HTTP status of the answer',
  'url.path': "the request's path (Sluice's own routes and the provider's API path only; never a webhook URL's)",
  'server.address': 'the host called',
  'server.port': 'the port called',
  'error.type': 'an error code (Sluice\'s, or a connection error), never a message',
  'graphql.operation.type': 'query, mutation or subscription',
  'graphql.operation.name': 'the operation name the client gave',
} as const;

export type TraceAttributeKey = keyof typeof TRACE_ATTRIBUTES;
export type AttributeValue = string | number | boolean;
export type TraceAttributes = Partial<Record<TraceAttributeKey, AttributeValue | null | undefined>>;

/** Longest string value kept: identifiers and codes fit; anything longer is not one of them. */
export const MAX_ATTRIBUTE_CHARS = 128;

const ALLOWED = new Set<string>(Object.keys(TRACE_ATTRIBUTES));

/**
 * The attributes that may leave the process: keys on the list only, values of the allowed types
 * only, strings cut at MAX_ATTRIBUTE_CHARS, null and undefined dropped.
 */
export function allowedAttributes(input: Record<string, unknown>): Record<string, AttributeValue> {
  const out: Record<string, AttributeValue> = {};
  for (const key in input) {
    if (!ALLOWED.has(key)) continue;
    const v = input[key];
    if (typeof v === 'number') {
      if (Number.isFinite(v)) out[key] = v;
    } else if (typeof v === 'boolean') out[key] = v;
    else if (typeof v === 'string') out[key] = v.length > MAX_ATTRIBUTE_CHARS ? v.slice(0, MAX_ATTRIBUTE_CHARS) : v;
  }
  return out;
}

/** A job as its spans name it (the fields of a leased job's data and of a job row). */
export interface TracedJob {
  id: string;
  tenantId: string;
  api: string;
  priority?: string | undefined;
  fairnessKey?: string | null | undefined;
}

export function jobAttributes(job: TracedJob): TraceAttributes {
  return {
    'sluice.tenant.id': job.tenantId,
    'sluice.job.id': job.id,
    'sluice.job.api': job.api,
    'sluice.job.priority': job.priority,
    'sluice.job.fairness_key': job.fairnessKey || undefined,
  };
}

/** The provider's rate-limit and credit headers of an answer (none when no answer came). */
export function providerStatusAttributes(status: ProviderStatus | null): TraceAttributes {
  if (!status) return {};
  return {
    'provider.rate_limit.limit': status.rateLimitLimit,
    'provider.rate_limit.remaining': status.rateLimitRemaining,
    'provider.credits.remaining': status.remainingCredits,
  };
}

/** An upstream call's outcome on its client span: status, classification, the provider's headers. */
export function outcomeAttributes(outcome: CallOutcome): TraceAttributes {
  return {
    'http.response.status_code': outcome.httpStatus,
    'sluice.outcome': outcome.kind,
    'provider.retry_after_seconds': outcome.retryAfterSeconds,
    ...providerStatusAttributes(outcome.status),
    ...(outcome.kind === 'billed' ? {} : { 'error.type': outcome.kind }),
  };
}

/** A wait reason recorded on a job while it waits: [reason, since (epoch ms), due (epoch ms) when it ends at a known time]. */
export type WaitMark = [reason: string, atMs: number, untilMs?: number];

/** Most wait marks a job carries (a retry adds one): its queued data stays small whatever happens. */
export const MAX_WAIT_MARKS = 16;

/** The marks with one more, the oldest dropped past MAX_WAIT_MARKS. Pure. */
export function addWaitMark(marks: readonly WaitMark[] | undefined, mark: WaitMark): WaitMark[] {
  const all = [...(marks ?? []), mark];
  return all.length > MAX_WAIT_MARKS ? all.slice(all.length - MAX_WAIT_MARKS) : all;
}

/**
 * The wait reason a settlement's requeue starts: RETRY for an attempt that counts (a retryable
 * answer, after its delay), PUT_BACK for one given back (an open breaker, nothing sent). Pure.
 */
export function requeueReason(countsAsAttempt: boolean): string {
  return countsAsAttempt ? 'RETRY' : 'PUT_BACK';
}

/**
 * The events of a job's queue.wait span, from `sinceMs` (it entered the queue) to `leasedAtMs`:
 * each reason it was marked with since then, each hold of its window or API that overlapped the
 * wait (holds.ts: a pause, an open breaker, seen by the leasing node), and then its turn in the
 * pace (RATE) from when it was due: the end of the last mark's known wait and of every hold, or
 * at once when nothing held it. Pure.
 */
export function waitEvents(
  marks: readonly WaitMark[] | undefined,
  sinceMs: number,
  leasedAtMs: number,
  holds: ReadonlyArray<{ reason: string; fromMs: number; untilMs: number }> = [],
): Array<{ reason: string; atMs: number }> {
  const mine = (marks ?? []).filter(([, at]) => at >= sinceMs && at <= leasedAtMs);
  const held = holds.filter((h) => h.untilMs >= sinceMs && h.fromMs <= leasedAtMs);
  const out = [...mine.map(([reason, atMs]) => ({ reason, atMs })), ...held.map((h) => ({ reason: h.reason, atMs: Math.max(h.fromMs, sinceMs) }))].sort((a, b) => a.atMs - b.atMs);
  const last = mine.at(-1);
  const markDue = last ? last[2] : sinceMs;
  const due = markDue === undefined ? undefined : Math.max(markDue, ...held.map((h) => h.untilMs));
  if (due !== undefined && due <= leasedAtMs) out.push({ reason: 'RATE', atMs: Math.max(due, out.at(-1)?.atMs ?? sinceMs) });
  return out;
}
