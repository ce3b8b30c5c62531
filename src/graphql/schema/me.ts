import { queueCounts } from '../../jobs/store.ts';
import { ledgerFor } from '../../scheduler/store.ts';
import { CLASSES, type JobClass } from '../../queue/boss.ts';
import { effectiveLimits, quotaPeriod, type TenantRecord } from '../../tenants/policy.ts';
import { builder, role } from '../builder.ts';
import { tenantOf } from '../context.ts';
import { PriorityEnum } from './jobs.ts';
import { TenantRef } from './tenants.ts';

interface Usage {
  creditsUsed: number;
  creditsReserved: number;
  quota: number;
  periodStart: Date;
  periodEnd: Date;
}

const UsageRef = builder.objectRef<Usage>('Usage').implement({
  description: "The calling tenant's credits in the current monthly period (it starts on the tenant's anniversary).",
  fields: (t) => ({
    creditsUsed: t.exposeInt('creditsUsed', { description: 'Credits billed this period.' }),
    creditsReserved: t.exposeInt('creditsReserved', { description: 'Credits held for calls in flight.' }),
    quota: t.exposeInt('quota'),
    creditsRemaining: t.int({ description: 'quota − used − reserved.', resolve: (u) => Math.max(0, u.quota - u.creditsUsed - u.creditsReserved) }),
    periodStart: t.field({ type: 'DateTime', resolve: (u) => u.periodStart }),
    periodEnd: t.field({ type: 'DateTime', resolve: (u) => u.periodEnd }),
  }),
});

const QueueRef = builder.objectRef<{ priority: JobClass; depth: number; running: number }>('QueueStatus').implement({
  description: 'One class of your queue, counted at query time.',
  fields: (t) => ({
    priority: t.field({ type: PriorityEnum, resolve: (q) => q.priority }),
    depth: t.exposeInt('depth', { description: 'Jobs waiting.' }),
    running: t.exposeInt('running', { description: 'Jobs with an upstream call in flight.' }),
  }),
});

const MeRef = builder.objectRef<TenantRecord>('Me').implement({
  fields: (t) => ({
    tenant: t.field({ type: TenantRef, resolve: (tenant) => tenant }),
    usage: t.field({
      type: UsageRef,
      resolve: async (tenant, _a, ctx) => {
        const period = quotaPeriod(tenant.periodAnchor, new Date());
        const ledger = await ledgerFor(ctx.services.sql, tenant.id, period.start);
        return {
          creditsUsed: ledger.billed,
          creditsReserved: ledger.reserved,
          quota: effectiveLimits(tenant).monthlyQuota,
          periodStart: period.start,
          periodEnd: period.end,
        };
      },
    }),
    queues: t.field({
      type: [QueueRef],
      resolve: async (tenant, _a, ctx) => {
        const counts = await queueCounts(ctx.services.sql, tenant.id);
        return CLASSES.map((priority) => ({ priority, ...(counts.get(priority) ?? { depth: 0, running: 0 }) }));
      },
    }),
  }),
});

builder.queryFields((t) => ({
  me: t.field({ ...role('tenant'), type: MeRef, description: 'The calling tenant.', resolve: (_r, _a, ctx) => tenantOf(ctx) }),
}));
