/**
 * What the operator console needs that no other field offers: the tenants
 * table (one sorted, filtered page with each tenant's live counters) and one
 * tenant's row for its page.
 */
import type { TenantRecord } from '../../tenants/policy.ts';
import { normalizePage, tenantPage, tenantRowsStatus, TENANT_ORDERS, type TenantRowStatus } from '../../visibility/console.ts';
import { builder, role } from '../builder.ts';
import { asId } from '../ids.ts';
import { QueueRef, UsageRef } from './me.ts';
import { TenantRef, TierEnum } from './tenants.ts';

const TenantOrderEnum = builder.enumType('TenantOrder', { values: TENANT_ORDERS });

type Row = { tenant: TenantRecord; status: TenantRowStatus };

const TenantRowRef = builder.objectRef<Row>('TenantRow').implement({
  description: 'One tenant with its live counters, as the operator sees it.',
  fields: (t) => ({
    tenant: t.field({ type: TenantRef, resolve: (x) => x.tenant }),
    queues: t.field({
      type: [QueueRef],
      description: 'Each class: depth, running, oldest age, wait reason. estimatedDrainSeconds is null here (me.queues has it).',
      resolve: (x) => x.status.queues,
    }),
    usage: t.field({ type: UsageRef, description: 'Credits against quota in its current period.', resolve: (x) => x.status.usage }),
  }),
});

const TenantTableRef = builder.objectRef<{ totalCount: number; rows: Row[] }>('TenantTable').implement({
  fields: (t) => ({
    totalCount: t.exposeInt('totalCount', { description: 'Tenants matching the filter.' }),
    rows: t.field({ type: [TenantRowRef], resolve: (x) => x.rows }),
  }),
});

builder.queryFields((t) => ({
  tenantRow: t.field({
    ...role('admin'),
    type: TenantRowRef,
    nullable: true,
    description: "One tenant with its live counters (admin; the console's tenant page); null when no tenant has this id.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      const tenant = await ctx.services.tenants.get(asId(id, 'tenant'));
      if (!tenant) return null;
      const status = await tenantRowsStatus(ctx.services, [tenant]);
      return { tenant, status: status.get(tenant.id)! };
    },
  }),
  tenantTable: t.field({
    ...role('admin'),
    type: TenantTableRef,
    description: 'One page of tenants, sorted and filtered (admin; the console\'s tenants table). At most 200 rows a page.',
    args: {
      first: t.arg.int({ defaultValue: 25 }),
      offset: t.arg.int({ defaultValue: 0 }),
      orderBy: t.arg({ type: TenantOrderEnum, defaultValue: 'NAME' }),
      descending: t.arg.boolean({ defaultValue: false }),
      nameContains: t.arg.string(),
      tier: t.arg({ type: TierEnum }),
    },
    resolve: async (_r, args, ctx) => {
      const { first, offset } = normalizePage(args);
      const page = await tenantPage(ctx.services.sql, {
        first,
        offset,
        orderBy: args.orderBy ?? 'NAME',
        descending: args.descending ?? false,
        nameContains: args.nameContains?.trim() || null,
        tier: args.tier ?? null,
      });
      const tenants = (await Promise.all(page.ids.map((id) => ctx.services.tenants.get(id)))).filter((r): r is TenantRecord => r !== null);
      // The live columns for the whole page at once, not per row.
      const status = await tenantRowsStatus(ctx.services, tenants);
      return { totalCount: page.totalCount, rows: tenants.map((tenant) => ({ tenant, status: status.get(tenant.id)! })) };
    },
  }),
}));
