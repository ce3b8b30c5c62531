import type { TenantRecord } from '../../tenants/policy.ts';
import { jobWaitReason, tenantQueueStatus, tenantUsage, type QueueStatus, type Usage } from '../../visibility/status.ts';
import { tenantUsageFeed } from '../../visibility/usage-feed.ts';
import { builder, role } from '../builder.ts';
import { tenantOf } from '../context.ts';
import { JobRef, PriorityEnum, queueStatusOf } from './jobs.ts';
import { TenantRef } from './tenants.ts';

export const UsageRef = builder.objectRef<Usage>('Usage').implement({
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

export const WaitReasonEnum = builder.enumType('WaitReason', {
  description: "Why a queue's head job is waiting, the most fundamental reason first.",
  values: {
    SUSPENDED: { description: 'Your tenant is suspended: its jobs are held until an operator resumes it.' },
    SCHEDULED: { description: 'Not due yet: its runAt (or a retry\'s delay) is ahead; for a queue, every queued job is.' },
    CREDITS_EXHAUSTED: { description: 'The upstream account is out of credits: all dispatch is stopped until renewal.' },
    KEY_UNUSABLE: { description: "The class's upstream key was refused (401/403): its window is stopped." },
    WINDOW_PAUSED: { description: "The class's window is paused after a rate-limit 429." },
    BREAKER_OPEN: { description: "The head job's API is failing: its breaker is open." },
    QUOTA: { description: 'The next job would pass your monthly credit quota.' },
    CAP: { description: 'You have as many calls in flight as your concurrency cap allows.' },
    RATE: { description: 'Waiting its turn in the fair share of the pace.' },
  },
});

// Defined here, next to its enum (jobs.ts cannot import this file: it imports jobs.ts).
builder.objectField(JobRef, 'waitReason', (t) =>
  t.field({
    type: WaitReasonEnum,
    nullable: true,
    description: 'For a waiting job: why it waits (QUOTA while it waits for credits, otherwise its queue\'s reason). Null once started.',
    resolve: async (j, _a, ctx) => {
      if (ctx.auth.kind !== 'tenant') return null;
      if (j.state !== 'QUEUED') return jobWaitReason(j, []);
      return jobWaitReason(j, await queueStatusOf(ctx, ctx.auth.tenant));
    },
  }),
);

export const QueueRef = builder.objectRef<QueueStatus>('QueueStatus').implement({
  description: 'One class of your queue, counted at query time.',
  fields: (t) => ({
    priority: t.field({ type: PriorityEnum, resolve: (q) => q.priority }),
    depth: t.exposeInt('depth', { description: 'Jobs waiting (QUEUED or WAITING_QUOTA).' }),
    running: t.exposeInt('running', { description: 'Jobs with an upstream call in flight.' }),
    oldestAgeSeconds: t.float({ nullable: true, description: 'Age of the oldest waiting job.', resolve: (q) => q.oldestAgeSeconds }),
    waitReason: t.field({ type: WaitReasonEnum, nullable: true, description: 'Why the head job is waiting (null when nothing waits).', resolve: (q) => q.waitReason }),
    estimatedDrainSeconds: t.float({ nullable: true, description: 'Depth ÷ your fair share of the pace; null when nothing drains it now.', resolve: (q) => q.estimatedDrainSeconds }),
  }),
});

export const MeRef = builder.objectRef<TenantRecord>('Me').implement({
  fields: (t) => ({
    tenant: t.field({ type: TenantRef, resolve: (tenant) => tenant }),
    usage: t.field({ type: UsageRef, resolve: (tenant, _a, ctx) => tenantUsage(ctx.services, tenant) }),
    queues: t.field({ type: [QueueRef], resolve: (tenant, _a, ctx) => queueStatusOf(ctx, tenant) }),
    estimatedDrainSeconds: t.float({
      nullable: true,
      description: 'When all your waiting work should be done, in seconds (the slowest class).',
      resolve: async (tenant, _a, ctx) => {
        const qs = await queueStatusOf(ctx, tenant);
        if (qs.some((q) => q.depth > 0 && q.estimatedDrainSeconds === null)) return null;
        return Math.max(0, ...qs.map((q) => q.estimatedDrainSeconds ?? 0));
      },
    }),
  }),
});

const TenantUsageRef = builder.objectRef<{ usage: Usage; queues: QueueStatus[] }>('TenantUsage').implement({
  fields: (t) => ({
    usage: t.field({ type: UsageRef, resolve: (x) => x.usage }),
    queues: t.field({ type: [QueueRef], resolve: (x) => x.queues }),
  }),
});

builder.queryFields((t) => ({
  me: t.field({ ...role('tenant', ['READ']), type: MeRef, description: 'The calling tenant.', resolve: (_r, _a, ctx) => tenantOf(ctx) }),
}));

builder.subscriptionFields((t) => ({
  tenantUsage: t.field({
    ...role('tenant', ['READ']),
    type: TenantUsageRef,
    description: 'Your usage and queues, pushed when they change, at most once a second.',
    subscribe: (_r, _a, ctx) => {
      const tenant = tenantOf(ctx);
      // One poller per tenant in this process, however many subscribers (visibility/usage-feed.ts).
      return tenantUsageFeed.subscribe(tenant, async () => ({ usage: await tenantUsage(ctx.services, tenant), queues: await tenantQueueStatus(ctx.services, tenant) }));
    },
    resolve: (x) => x,
  }),
}));
