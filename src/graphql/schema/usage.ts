/**
 * Usage events (`usageEvents`, a Relay connection of CloudEvents; also NDJSON at GET
 * /usage/events, src/http/usage-events.ts) and usage history for billing: `me { usageHistory }` for a tenant, the same
 * field on `Tenant` and `tenantUsageHistory(tenantId)` (which also answers for
 * deleted tenants) for the admin. The CSV download (GET /usage.csv) reads the
 * same function (src/usage/store.ts).
 */
import { SluiceError } from '../../errors.ts';
import type { TenantRecord } from '../../tenants/policy.ts';
import { decodeUsageCursor, encodeUsageCursor, MAX_USAGE_EVENTS_PAGE, readUsageEvents, toCloudEvent, USAGE_EVENT_TYPES, usageEventId, type UsageEventRow } from '../../usage/events.ts';
import { MAX_USAGE_ROWS, usageHistory, type Granularity, type UsageGroup, type UsageRow } from '../../usage/store.ts';
import { builder, role } from '../builder.ts';
import type { Context } from '../context.ts';
import { asId } from '../ids.ts';
import { MeRef } from './me.ts';
import { TenantRef } from './tenants.ts';

export const GranularityEnum = builder.enumType('UsageGranularity', {
  description: 'Bucket size of usage history, in UTC.',
  values: ['HOUR', 'DAY', 'MONTH'] as const,
});

export const UsageGroupEnum = builder.enumType('UsageGroupBy', {
  description: 'What usage history rows are split by (besides time).',
  values: { API: {}, PRIORITY: { description: 'The priority class.' } },
});

const UsageRowRef = builder.objectRef<UsageRow>('UsageHistoryRow').implement({
  description: 'Settled upstream calls in one time bucket (and API/class when grouped). Equal to the ledger: every settlement is counted once.',
  fields: (t) => ({
    start: t.field({ type: 'DateTime', resolve: (r) => r.start }),
    api: t.string({ nullable: true, description: 'null when not grouped by API.', resolve: (r) => r.api }),
    priority: t.string({ nullable: true, description: 'null when not grouped by PRIORITY.', resolve: (r) => r.priority }),
    calls: t.exposeInt('calls', { description: 'Settled attempts (upstream calls, including retried and put-back ones).' }),
    succeeded: t.exposeInt('succeeded', { description: 'Calls answered 200 and billed.' }),
    failed: t.exposeInt('failed', { description: 'Every other settled call (errors, timeouts, rate limits, lost workers).' }),
    creditsBilled: t.exposeInt('creditsBilled'),
    creditsRefunded: t.exposeInt('creditsRefunded', { description: 'Credits reserved and given back.' }),
    latencyP95Ms: t.float({
      nullable: true,
      description: 'p95 of reservation life (dispatch to settlement), as the upper bound of its histogram bucket.',
      resolve: (r) => r.latencyP95Ms,
    }),
  }),
});

/** Checks the arguments a usage history query takes; shared with the CSV route. */
export function usageArgs(a: { from: Date; to: Date; granularity?: Granularity | null; groupBy?: readonly UsageGroup[] | null }) {
  if (!(a.from < a.to)) throw new SluiceError('BAD_USER_INPUT', '`from` must be before `to`', { field: 'from' });
  return { from: a.from, to: a.to, granularity: a.granularity ?? 'DAY', groupBy: [...new Set(a.groupBy ?? [])] };
}

async function read(ctx: Context, tenantId: string, a: Parameters<typeof usageArgs>[0]): Promise<UsageRow[]> {
  const rows = await usageHistory(ctx.services.sql, { tenantId, ...usageArgs(a) });
  if (rows.length > MAX_USAGE_ROWS) {
    throw new SluiceError('BAD_USER_INPUT', `more than ${MAX_USAGE_ROWS} rows: ask for a shorter period or a coarser granularity`, { maxRows: MAX_USAGE_ROWS });
  }
  return rows;
}

const historyField = (t: any, tenantOf: (parent: any) => string) =>
  t.field({
    type: [UsageRowRef],
    description: 'Usage history in UTC buckets from the one holding `from` up to `to` (exclusive), oldest first. Kept after retention deletes the jobs.',
    args: {
      from: t.arg({ type: 'DateTime', required: true }),
      to: t.arg({ type: 'DateTime', required: true }),
      granularity: t.arg({ type: GranularityEnum, defaultValue: 'DAY' }),
      groupBy: t.arg({ type: [UsageGroupEnum], defaultValue: [] }),
    },
    resolve: (parent: unknown, args: any, ctx: Context) => read(ctx, tenantOf(parent), args),
  });

builder.objectField(MeRef, 'usageHistory', (t) => historyField(t, (me: TenantRecord) => me.id));
builder.objectField(TenantRef, 'usageHistory', (t) => historyField(t, (tenant: TenantRecord) => tenant.id));

builder.queryFields((t) => ({
  tenantUsageHistory: t.field({
    ...role('admin'),
    type: [UsageRowRef],
    description: "A tenant's usage history by id, also after the tenant was deleted (admin).",
    args: {
      tenantId: t.arg.id({ required: true }),
      from: t.arg({ type: 'DateTime', required: true }),
      to: t.arg({ type: 'DateTime', required: true }),
      granularity: t.arg({ type: GranularityEnum, defaultValue: 'DAY' }),
      groupBy: t.arg({ type: [UsageGroupEnum], defaultValue: [] }),
    },
    resolve: (_r, args, ctx) => read(ctx, asId(args.tenantId, 'tenant', 'tenantId'), args),
  }),
}));

/* ---- Usage events (CloudEvents 1.0, one per settled charge; src/usage/events.ts) ---- */

const UsageEventRef = builder.objectRef<UsageEventRow>('UsageEvent').implement({
  description:
    'One settled charge as a CloudEvents 1.0 event (or a late settlement\'s correction of one). Its id is stable: read again, it is the same event, so a billing system ingests each once (OpenMeter as is; a Stripe meter event\'s `identifier`).',
  fields: (t) => ({
    id: t.string({ description: 'The reservation id (`<id>:corrected` for a correction).', resolve: (r) => usageEventId(r) }),
    type: t.string({ description: `${USAGE_EVENT_TYPES.charged} or ${USAGE_EVENT_TYPES.corrected}.`, resolve: (r) => USAGE_EVENT_TYPES[r.kind] }),
    time: t.field({ type: 'DateTime', description: 'When the charge was settled (the correction made).', resolve: (r) => r.time }),
    subject: t.string({ description: 'The tenant id.', resolve: (r) => r.tenantId }),
    api: t.exposeString('api'),
    priority: t.exposeString('priority'),
    credits: t.exposeInt('credits', { description: 'Credits charged; a correction\'s difference (negative when credits went back).' }),
    jobId: t.exposeID('jobId'),
    attempt: t.exposeInt('attempt'),
    cloudEvent: t.field({ type: 'JSON', description: 'The whole event, structured CloudEvents JSON, to forward as is.', resolve: (r) => toCloudEvent(r) }),
  }),
});

builder.queryFields((t) => ({
  usageEvents: t.connection(
    {
      ...role('tenantOrAdmin', ['READ']),
      type: UsageEventRef,
      description:
        'Usage events oldest first, a page at a time: keep the endCursor and ask again with `after` (new events come after it, never before). A tenant key reads its own; the admin token reads every tenant\'s, or one with `tenantId`. Also as NDJSON: GET /usage/events?after=<cursor>.',
      args: { tenantId: t.arg.id() },
      resolve: async (_r, args, ctx) => {
        if (args.before || args.last) throw new SluiceError('BAD_USER_INPUT', 'only forward pagination (first, after) is supported');
        const first = args.first ?? 100;
        if (first < 0 || first > MAX_USAGE_EVENTS_PAGE) throw new SluiceError('BAD_USER_INPUT', `first must be 0 to ${MAX_USAGE_EVENTS_PAGE}`, { field: 'first' });
        const tenantId = usageEventsTenant(ctx, args.tenantId);
        const after = args.after ? decodeUsageCursor(args.after) : null;
        const { rows } = await readUsageEvents(ctx.services.sql, { tenantId, after, limit: first + 1 });
        const page = rows.slice(0, first);
        return {
          edges: page.map((node) => ({ cursor: encodeUsageCursor(node), node })),
          pageInfo: {
            hasNextPage: rows.length > first,
            hasPreviousPage: after !== null,
            startCursor: page[0] ? encodeUsageCursor(page[0]) : null,
            // An empty page keeps the cursor it was asked with: the next poll starts there.
            endCursor: page.at(-1) ? encodeUsageCursor(page.at(-1)!) : (args.after ?? null),
          },
        };
      },
    },
    { name: 'UsageEventConnection' },
  ),
}));

/** Whose usage events: a tenant key its own (tenantId left out or its own); the admin everyone's, or the tenant named. */
export function usageEventsTenant(ctx: Pick<Context, 'auth'>, tenantId: string | number | null | undefined): string | null {
  if (ctx.auth.kind === 'tenant') {
    if (tenantId !== null && tenantId !== undefined && asId(tenantId, 'tenant', 'tenantId') !== ctx.auth.tenant.id) {
      throw new SluiceError('FORBIDDEN', "a tenant key reads only its own usage events: leave tenantId out", { field: 'tenantId' });
    }
    return ctx.auth.tenant.id;
  }
  return tenantId === null || tenantId === undefined || tenantId === '' ? null : asId(tenantId, 'tenant', 'tenantId');
}
