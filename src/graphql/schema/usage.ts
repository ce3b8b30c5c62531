/**
 * Usage history for billing: `me { usageHistory }` for a tenant, the same
 * field on `Tenant` and `tenantUsageHistory(tenantId)` (which also answers for
 * deleted tenants) for the admin. The CSV download (GET /usage.csv) reads the
 * same function (src/usage/store.ts).
 */
import { SluiceError } from '../../errors.ts';
import type { TenantRecord } from '../../tenants/policy.ts';
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
    resolve: (_r, args, ctx) => read(ctx, asId(args.tenantId, 'tenant'), args),
  }),
}));
