import { FINAL_STATES, JOB_STATES, countJobs, findJobs, finishedSince, getJob, listJobs, retriedFrom, WAITING_STATES, type JobRow } from '../../jobs/store.ts';
import { traceIdOf, traceUrl } from '../../tracing/traceparent.ts';
import { RESYNC } from '../../events/bus.ts';
import { isTransientOutage } from '../../db/availability.ts';
import { CLASSES } from '../../config/classes.ts';
import { SluiceError } from '../../errors.ts';
import { builder, needs, role } from '../builder.ts';
import { tenantOf } from '../context.ts';
import { asId } from '../ids.ts';
import { pageArgs, pageOf } from '../pages.ts';
import { estimatedStartAt, queuePositions, tenantQueueStatus, type QueueStatus } from '../../visibility/status.ts';
import { batchLoad, perRequest } from '../memo.ts';
import type { Context } from '../context.ts';
import type { TenantRecord } from '../../tenants/policy.ts';
import { MAX_IDEMPOTENCY_KEY_LENGTH } from '../../jobs/validate.ts';
import { TenantRef } from './tenants.ts';

export const PriorityEnum = builder.enumType('Priority', {
  description: 'Priority class. INTERACTIVE is served first; BULK sheds first when queues fill.',
  values: CLASSES,
});
export const JobStateEnum = builder.enumType('JobState', { values: JOB_STATES });

const JobError = builder.objectRef<{ code: string; message: string }>('JobError').implement({
  fields: (t) => ({ code: t.exposeString('code'), message: t.exposeString('message') }),
});

/** The tenant's queue status, read once per request however many fields and jobs ask (graphql/cost.ts counts it once). */
export function queueStatusOf(ctx: Context, tenant: TenantRecord): Promise<QueueStatus[]> {
  return perRequest(ctx, `queueStatus:${tenant.id}`, () => tenantQueueStatus(ctx.services, tenant));
}

/**
 * What a job carries in and out (its params, its result, the provider's error text, the caller's own
 * keys) needs READ: a SUBMIT-only key that submits, cancels or retries gets ids and states, not data
 * (the auth plugin refuses an operation selecting these without it).
 */
const JOB_DATA = needs(['READ']);

export const JobRef = builder.objectRef<JobRow>('Job').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    api: t.exposeString('api'),
    params: t.field({ ...JOB_DATA, type: 'JSON', description: 'The params it was submitted with (needs READ).', resolve: (j) => j.params }),
    priority: t.field({ type: PriorityEnum, resolve: (j) => j.priority }),
    state: t.field({ type: JobStateEnum, resolve: (j) => j.state }),
    result: t.field({ ...JOB_DATA, type: 'JSON', nullable: true, description: "The upstream `data` of a SUCCEEDED job (needs READ).", resolve: (j) => (j.state === 'SUCCEEDED' ? j.result : null) }),
    error: t.field({
      ...JOB_DATA,
      type: JobError,
      nullable: true,
      description: "Why the job FAILED, or the last retryable error of a job waiting to retry; its message may quote the provider's answer (needs READ).",
      resolve: (j) => (j.errorCode && j.state !== 'SUCCEEDED' ? { code: j.errorCode, message: j.errorMessage ?? j.errorCode } : null),
    }),
    httpStatus: t.int({ nullable: true, resolve: (j) => j.httpStatus }),
    creditsBilled: t.int({ resolve: (j) => j.creditsBilled }),
    attempts: t.exposeInt('attempts'),
    idempotencyKey: t.exposeString('idempotencyKey', { ...JOB_DATA, nullable: true, description: 'The idempotency key it was submitted with (needs READ).' }),
    fairnessKey: t.string({
      ...JOB_DATA,
      nullable: true,
      description: 'The fairness key it was submitted with; null: the default key (every job without one shares it). Needs READ.',
      resolve: (j) => j.fairnessKey ?? null,
    }),
    retryOf: t.id({
      nullable: true,
      description: 'The FAILED or CANCELLED job this one was submitted again from by retryJob; null for a job submitted afresh.',
      // A page's jobs share one lookup (graphql/memo.ts).
      resolve: async (j, _a, ctx) => (await batchLoad(ctx, 'retriedFrom', (ids: string[]) => retriedFrom(ctx.services.sql, ids), j.id)) ?? null,
    }),
    traceId: t.string({
      nullable: true,
      description: "The OpenTelemetry trace the job's spans belong to (the submitting request's, continued from its traceparent header when one was sent); null when tracing was off or the trace not sampled.",
      resolve: (j) => traceIdOf(j.traceParent),
    }),
    traceUrl: t.string({
      nullable: true,
      description: "A link to the job's trace in the operator's tracing UI (TRACE_URL_TEMPLATE); null without a template or a trace.",
      resolve: (j, _a, ctx) => traceUrl(ctx.services.traceUrlTemplate, traceIdOf(j.traceParent)),
    }),
    createdAt: t.field({ type: 'DateTime', resolve: (j) => j.createdAt }),
    startedAt: t.field({ type: 'DateTime', nullable: true, resolve: (j) => j.startedAt }),
    finishedAt: t.field({ type: 'DateTime', nullable: true, resolve: (j) => j.finishedAt }),
    estimatedStartAt: t.field({
      type: 'DateTime',
      nullable: true,
      description:
        "For a waiting job: when it should start, from the jobs ahead of it and your fair share of the pace; for a job WAITING_QUOTA, the end of your quota period (when the quota renews). Null once started, or when nothing drains the queue now (see waitReason).",
      resolve: async (j, _a, ctx) => {
        if (ctx.auth.kind !== 'tenant') return null;
        if (j.state !== 'QUEUED' && j.state !== 'WAITING_QUOTA') return null;
        const tenant = ctx.auth.tenant;
        // A page's jobs share one queue-status read and one positions query (graphql/memo.ts).
        const [ahead, queues] = await Promise.all([
          j.state === 'QUEUED' ? batchLoad(ctx, 'queuePositions', (ids: string[]) => queuePositions(ctx.services.sql, tenant.id, ids), j.id) : undefined,
          queueStatusOf(ctx, tenant),
        ]);
        return estimatedStartAt(ctx.services, tenant, j, ahead, queues);
      },
    }),
  }),
});

/** A job found by the operator's search, with its tenant. */
const FoundJobRef = builder.objectRef<{ job: JobRow; tenant: TenantRecord }>('FoundJob').implement({
  fields: (t) => ({
    job: t.field({ type: JobRef, resolve: (x) => x.job }),
    tenant: t.field({ type: TenantRef, resolve: (x) => x.tenant }),
  }),
});

/** What submission answers with: the id and state, nothing that needs another read. */
const SubmittedJobRef = builder.objectRef<{ id: string; state: string }>('SubmittedJob').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    state: t.field({ type: JobStateEnum, resolve: (j) => j.state as (typeof JOB_STATES)[number] }),
  }),
});

const JobInput = builder.inputType('JobInput', {
  fields: (t) => ({
    api: t.string({ required: true, description: 'An API from `apis`, e.g. "emailvalidator".' }),
    params: t.field({ type: 'JSON', description: 'Query parameters for the API, as a JSON object.' }),
    priority: t.field({ type: PriorityEnum, defaultValue: 'STANDARD' }),
    idempotencyKey: t.string({ description: 'Same key from the same tenant returns the original job instead of a new one.' }),
    fairnessKey: t.string({
      description:
        'Who inside your tenant the job is for (1 to 64 characters), e.g. your own customer\'s id. Within your share and class, keys are served round robin, so one key\'s backlog does not hold up another key\'s jobs. Absent: the default key, which every job without one shares (first in, first out).',
    }),
    runAt: t.field({
      type: 'DateTime',
      description:
        'Not before this instant (at most JOB_RUN_AT_MAX_SECONDS ahead, 30 days by default; up to 5 minutes past counts as now; otherwise BAD_RUN_AT). The job is QUEUED, counts in your queue bound, and waits with waitReason SCHEDULED until then.',
    }),
  }),
});

const SubmitJobsInput = builder.inputType('SubmitJobsInput', {
  fields: (t) => ({ jobs: t.field({ type: [JobInput], required: true }) }),
});

const SubmitJobPayload = builder.objectRef<{ job: { id: string; state: string } }>('SubmitJobPayload').implement({
  fields: (t) => ({ job: t.field({ type: SubmittedJobRef, resolve: (p) => p.job }) }),
});
const SubmitJobsPayload = builder.objectRef<{ jobs: Array<{ id: string; state: string }> }>('SubmitJobsPayload').implement({
  fields: (t) => ({ jobs: t.field({ type: [SubmittedJobRef], resolve: (p) => p.jobs }) }),
});

const JobFilter = builder.inputType('JobFilter', {
  fields: (t) => ({
    state: t.field({ type: JobStateEnum }),
    api: t.string(),
    priority: t.field({ type: PriorityEnum }),
    idempotencyKey: t.string({ description: 'The job submitted with this idempotency key (at most one per tenant).' }),
  }),
});

/** cancelJobs cancels at most this many jobs per call (one transaction: it must not hold the tenant for long). */
export const MAX_CANCEL_JOBS = 1_000;

const CancelJobsPayload = builder.objectRef<{ cancelled: number; more: boolean }>('CancelJobsPayload').implement({
  fields: (t) => ({
    cancelled: t.exposeInt('cancelled', { description: 'Waiting jobs cancelled by this call (never sent, never billed).' }),
    more: t.exposeBoolean('more', { description: 'Waiting jobs matching the filter remain (past `limit`): call again.' }),
  }),
});

function asParams(params: unknown): Record<string, unknown> | undefined {
  if (params === null || params === undefined) return undefined;
  if (typeof params !== 'object' || Array.isArray(params)) {
    throw new SluiceError('BAD_USER_INPUT', 'params must be a JSON object', { field: 'params' });
  }
  return params as Record<string, unknown>;
}

/** A resync re-reads jobs finished this long before the last one sent: settlements commit a little after their finish time. */
const RESYNC_MARGIN_MS = 60_000;

/** Reads for a resync, retrying while the database is still coming back (the LISTEN may return before every pool connection does). */
async function readThroughOutage<T>(read: () => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await read();
    } catch (err) {
      if (!isTransientOutage(err) || attempt >= 30) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

builder.queryFields((t) => ({
  job: t.field({
    ...role('tenant', ['READ']),
    type: JobRef,
    nullable: true,
    description: 'One of your jobs; null when no job of yours has this id (an id that is not a UUID is BAD_USER_INPUT).',
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => getJob(ctx.services.sql, tenantOf(ctx).id, asId(id, 'job')),
  }),
  jobs: t.connection(
    {
      ...role('tenant', ['READ']),
      type: JobRef,
      description: 'Your jobs, newest first.',
      args: { filter: t.arg({ type: JobFilter }) },
      resolve: (_r, args, ctx) => jobsPage(ctx, tenantOf(ctx).id, args),
    },
    {
      name: 'JobConnection',
      fields: (c) => ({
        totalCount: c.int({ description: 'Jobs matching the filter.', resolve: (conn) => (conn as unknown as { count: () => Promise<number> }).count() }),
      }),
    },
  ),
  tenantJobs: t.connection(
    {
      ...role('admin'),
      type: JobRef,
      description: "One tenant's jobs, newest first (admin; the console's tenant page).",
      args: { tenantId: t.arg.id({ required: true }), filter: t.arg({ type: JobFilter }) },
      resolve: (_r, args, ctx) => jobsPage(ctx, asId(args.tenantId, 'tenant', 'tenantId'), args),
    },
    { name: 'TenantJobConnection', fields: (c) => ({ totalCount: c.int({ description: 'Jobs matching the filter.', resolve: (conn) => (conn as unknown as { count: () => Promise<number> }).count() }) }) },
  ),
  jobSearch: t.field({
    ...role('admin'),
    type: [FoundJobRef],
    description: 'Jobs of any tenant with this id or idempotency key, newest first (admin; the console\'s job search).',
    args: { text: t.arg.string({ required: true }), first: t.arg.int({ defaultValue: 20 }) },
    resolve: async (_r, { text, first }, ctx) => {
      const wanted = text.trim();
      if (wanted.length === 0 || wanted.length > MAX_IDEMPOTENCY_KEY_LENGTH) {
        throw new SluiceError('BAD_USER_INPUT', `text must be 1 to ${MAX_IDEMPOTENCY_KEY_LENGTH} characters: a job id or an idempotency key`, { field: 'text' });
      }
      const limit = first ?? 20;
      if (limit < 1 || limit > 100) throw new SluiceError('BAD_USER_INPUT', 'first must be 1 to 100', { field: 'first' });
      const jobs = await findJobs(ctx.services.sql, wanted, limit);
      const tenants = await Promise.all(jobs.map((j) => ctx.services.tenants.get(j.tenantId)));
      return jobs.flatMap((job, i) => (tenants[i] ? [{ job, tenant: tenants[i]! }] : []));
    },
  }),
}));

/** One page of a tenant's jobs for `jobs` and `tenantJobs`: keyset paging on (created_at, id), newest first. */
async function jobsPage(
  ctx: Context,
  tenantId: string,
  args: { first?: number | null; after?: string | null; last?: number | null; before?: string | null; filter?: { state?: JobRow['state'] | null; api?: string | null; priority?: JobRow['priority'] | null; idempotencyKey?: string | null } | null },
) {
  const { first, after } = pageArgs(args, 'job');
  const filter = { state: args.filter?.state, api: args.filter?.api, priority: args.filter?.priority, idempotencyKey: args.filter?.idempotencyKey };
  const rows = await listJobs(ctx.services.sql, tenantId, filter, first + 1, after);
  return {
    // Counted only when totalCount is selected (its resolver): a count(*) over a big backlog is not free.
    count: () => countJobs(ctx.services.sql, tenantId, filter),
    ...pageOf(rows, first, after),
  };
}

builder.mutationFields((t) => ({
  submitJob: t.field({
    ...role('tenant', ['SUBMIT']),
    type: SubmitJobPayload,
    description: 'Queues one job and answers at once with state QUEUED.',
    args: { input: t.arg({ type: JobInput, required: true }) },
    resolve: async (_r, { input }, ctx) => {
      const [job] = await ctx.services.jobs.submit(tenantOf(ctx), [{ ...input, params: asParams(input.params) }], { gate: ctx.gate });
      return { job: job! };
    },
  }),
  submitJobs: t.field({
    ...role('tenant', ['SUBMIT']),
    type: SubmitJobsPayload,
    description: 'Queues many jobs, accepted whole or refused whole; answers in input order.',
    args: { input: t.arg({ type: SubmitJobsInput, required: true }) },
    resolve: async (_r, { input }, ctx) => {
      const jobs = await ctx.services.jobs.submit(
        tenantOf(ctx),
        input.jobs.map((j) => ({ ...j, params: asParams(j.params) })),
        { bulk: true, gate: ctx.gate },
      );
      return { jobs };
    },
  }),
  retryJob: t.field({
    ...role('tenantOrAdmin', ['SUBMIT']),
    type: JobRef,
    description:
      "Submits a FAILED or CANCELLED job again as a new job (same api, params and class; Job.retryOf names the original). A tenant retries its own jobs; the admin any tenant's.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      const jobId = asId(id, 'job');
      // A tenant's lookup is scoped to it: another tenant's job is NOT_FOUND, as if it did not exist.
      const original = await getJob(ctx.services.sql, ctx.auth.kind === 'tenant' ? ctx.auth.tenant.id : null, jobId);
      const tenant = original ? (ctx.auth.kind === 'tenant' ? ctx.auth.tenant : await ctx.services.tenants.get(original.tenantId)) : null;
      if (!original || !tenant) throw new SluiceError('NOT_FOUND', `no job with id ${jobId}`);
      const submitted = await ctx.services.jobs.retry(tenant, original, { gate: ctx.gate });
      const job = await getJob(ctx.services.sql, tenant.id, submitted.id);
      if (!job) throw new SluiceError('NOT_FOUND', `no job with id ${submitted.id}`);
      return job;
    },
  }),
  cancelJob: t.field({
    ...role('tenant', ['SUBMIT']),
    type: JobRef,
    description: 'Cancels one of your QUEUED jobs.',
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.services.jobs.cancel(tenantOf(ctx).id, asId(id, 'job')),
  }),
  cancelJobs: t.field({
    ...role('tenant', ['SUBMIT']),
    type: CancelJobsPayload,
    description: `Cancels your waiting jobs (QUEUED, WAITING_QUOTA) that match the filter, the oldest \`limit\` (1 to ${MAX_CANCEL_JOBS}, default ${MAX_CANCEL_JOBS}) per call; \`more\` says whether matching waiting jobs remain. Running and finished jobs are left as they are.`,
    args: { filter: t.arg({ type: JobFilter, required: true }), limit: t.arg.int({ defaultValue: MAX_CANCEL_JOBS }) },
    resolve: (_r, { filter, limit }, ctx) => {
      const n = limit ?? MAX_CANCEL_JOBS;
      if (!Number.isInteger(n) || n < 1 || n > MAX_CANCEL_JOBS) throw new SluiceError('BAD_USER_INPUT', `limit must be 1 to ${MAX_CANCEL_JOBS}`, { field: 'limit' });
      if (filter.state && filter.state !== 'QUEUED' && filter.state !== 'WAITING_QUOTA') {
        throw new SluiceError('NOT_CANCELLABLE', `only waiting jobs (QUEUED, WAITING_QUOTA) can be cancelled, not ${filter.state}`, { field: 'filter.state', state: filter.state });
      }
      return ctx.services.jobs.cancelMany(tenantOf(ctx).id, { state: filter.state, api: filter.api, priority: filter.priority, idempotencyKey: filter.idempotencyKey }, n);
    },
  }),
}));

builder.subscriptionFields((t) => ({
  jobUpdated: t.field({
    ...role('tenant', ['READ']),
    type: JobRef,
    description: 'Every state change of one of your jobs; completes after a final state.',
    args: { id: t.arg.id({ required: true }) },
    subscribe: async function* (_r, { id }, ctx) {
      const tenantId = tenantOf(ctx).id;
      const jobId = asId(id, 'job');
      // Listen before reading, so a change between the read and the listen is not missed.
      // A tenant-wide event (the quota block: one for all the tenant's waiting jobs) is read as this job's.
      const events = ctx.services.bus.subscribe((e) => e.tenantId === tenantId && (e.jobId === jobId || e.allWaiting === true), { resync: true, socket: ctx.socket, tenantId });
      try {
        const current = await getJob(ctx.services.sql, tenantId, jobId);
        if (!current) throw new SluiceError('NOT_FOUND', `no job with id ${jobId}`);
        // The state it is in now, then every change after it.
        yield current;
        let last = current.state;
        if (FINAL_STATES.includes(last)) return;
        for await (const event of events) {
          // Events were missed while the LISTEN connection was down (RESYNC), or every waiting job of
          // the tenant changed (allWaiting; only a waiting job can be one of them): the row says where
          // the job is now.
          if (event === RESYNC || event.allWaiting) {
            if (event !== RESYNC && !(WAITING_STATES as string[]).includes(last)) continue;
            const job = await readThroughOutage(() => getJob(ctx.services.sql, tenantId, jobId));
            if (!job) return;
            if (job.state === last) continue;
            last = job.state;
            yield job;
            if (FINAL_STATES.includes(last)) return;
            continue;
          }
          let state = event.state as JobRow['state'];
          if (state === last) continue;
          // A final state's row rides in the event (or is read once per event in this process); a passing state is read.
          const load = () => readThroughOutage(() => getJob(ctx.services.sql, tenantId, jobId));
          const job = FINAL_STATES.includes(state) ? await ctx.services.bus.jobOf(event, load) : await load();
          if (!job) return;
          // The row may already be further along than this event: report the state the event
          // announced, as it shows (a job put back QUEUED shows WAITING_QUOTA while its tenant is blocked).
          if (state === 'QUEUED' && job.state === 'WAITING_QUOTA') state = job.state;
          if (state === last) continue;
          last = state;
          yield { ...job, state };
          if (FINAL_STATES.includes(state)) return;
        }
      } finally {
        await events.return?.();
      }
    },
    resolve: (job) => job,
  }),
  jobsCompleted: t.field({
    ...role('tenant', ['READ']),
    type: JobRef,
    description: 'Every job of yours that reaches SUCCEEDED, FAILED or CANCELLED.',
    subscribe: async function* (_r, _a, ctx) {
      const tenantId = tenantOf(ctx).id;
      const events = ctx.services.bus.subscribe((e) => e.tenantId === tenantId && (FINAL_STATES as string[]).includes(e.state), { resync: true, socket: ctx.socket, tenantId });
      // What was sent, by finish time, to send each job once across a resync; only the last
      // RESYNC_MARGIN_MS before the watermark are kept (the resync re-reads from there).
      const sent = new Map<string, number>();
      let [{ now: watermark }] = (await ctx.services.sql`select now()`) as unknown as [{ now: Date }];
      const remember = (job: JobRow) => {
        const at = job.finishedAt?.getTime() ?? Date.now();
        if (at > watermark.getTime()) watermark = new Date(at);
        sent.set(job.id, at);
        if (sent.size > 1_000) for (const [id, t] of sent) if (t < watermark.getTime() - RESYNC_MARGIN_MS) sent.delete(id);
      };
      try {
        for await (const event of events) {
          if (event === RESYNC) {
            // Events committed while the LISTEN connection was down were never delivered: read what finished since.
            const since = new Date(watermark.getTime() - RESYNC_MARGIN_MS);
            const { rows } = await readThroughOutage(() => finishedSince(ctx.services.sql, tenantId, since));
            for (const job of rows) {
              if (sent.has(job.id)) continue;
              remember(job);
              yield job;
            }
            continue;
          }
          if (sent.has(event.jobId)) continue;
          // The row rides in the event; only a row too big for NOTIFY is read, once per event in this process.
          const job = await ctx.services.bus.jobOf(event, () => readThroughOutage(() => getJob(ctx.services.sql, tenantId, event.jobId)));
          if (!job) continue;
          remember(job);
          yield job;
        }
      } finally {
        await events.return?.();
      }
    },
    resolve: (job) => job,
  }),
}));
