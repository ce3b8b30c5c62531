/**
 * What the operator console needs that no other field offers: the tenants
 * table (one sorted, filtered page with each tenant's live counters).
 */
import type { TenantRecord } from '../../tenants/policy.ts';
import { normalizePage, tenantPage, TENANT_ORDERS } from '../../visibility/console.ts';
import { tenantQueueStatus, tenantUsage } from '../../visibility/status.ts';
import { builder, role } from '../builder.ts';
import { QueueRef, UsageRef } from './me.ts';
import { TenantRef, TierEnum } from './tenants.ts';

const TenantOrderEnum = builder.enumType('TenantOrder', { values: TENANT_ORDERS });

const TenantRowRef = builder.objectRef<TenantRecord>('TenantRow').implement({
  description: 'One tenant with its live counters, as the operator sees it.',
  fields: (t) => ({
    tenant: t.field({ type: TenantRef, resolve: (x) => x }),
    queues: t.field({ type: [QueueRef], description: 'Each class: depth, running, wait reason, estimated drain.', resolve: (x, _a, ctx) => tenantQueueStatus(ctx.services, x) }),
    usage: t.field({ type: UsageRef, description: 'Credits against quota in its current period.', resolve: (x, _a, ctx) => tenantUsage(ctx.services, x) }),
  }),
});

const TenantTableRef = builder.objectRef<{ totalCount: number; rows: TenantRecord[] }>('TenantTable').implement({
  fields: (t) => ({
    totalCount: t.exposeInt('totalCount', { description: 'Tenants matching the filter.' }),
    rows: t.field({ type: [TenantRowRef], resolve: (x) => x.rows }),
  }),
});

builder.queryFields((t) => ({
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
      const rows = await Promise.all(page.ids.map((id) => ctx.services.tenants.get(id)));
      return { totalCount: page.totalCount, rows: rows.filter((r): r is TenantRecord => r !== null) };
    },
  }),
}));
