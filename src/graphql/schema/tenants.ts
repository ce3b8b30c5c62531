import { TIER_NAMES } from '../../config/tiers.ts';
import { SluiceError } from '../../errors.ts';
import { effectiveLimits, requestBudgetLimits, type TenantRecord } from '../../tenants/policy.ts';
import { builder, role } from '../builder.ts';
import { asId } from '../ids.ts';
import { deleteTenant, resumeTenant, suspendTenant } from '../../tenants/lifecycle.ts';

export const TierEnum = builder.enumType('Tier', { values: TIER_NAMES });
export const QuotaPolicyEnum = builder.enumType('QuotaPolicy', {
  values: {
    WAIT: { description: "Jobs that would pass the quota wait until the next period." },
    FAIL: { description: 'Jobs that would pass the quota fail with QUOTA_EXCEEDED.' },
  },
});

export const TenantRef = builder.objectRef<TenantRecord>('Tenant').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    tier: t.field({ type: TierEnum, resolve: (x) => x.tier }),
    weight: t.int({ description: 'Effective weight (the override, else the tier default).', resolve: (x) => effectiveLimits(x).weight }),
    concurrencyCap: t.int({ resolve: (x) => effectiveLimits(x).concurrencyCap }),
    monthlyQuota: t.int({ description: 'Credits per monthly period.', resolve: (x) => effectiveLimits(x).monthlyQuota }),
    queueBound: t.int({ resolve: (x) => effectiveLimits(x).queueBound }),
    quotaPolicy: t.field({ type: QuotaPolicyEnum, resolve: (x) => x.quotaPolicy }),
    requestBurst: t.int({ description: 'Request budget: cost points the tenant may spend at once (the override, else the tier default).', resolve: (x) => requestBudgetLimits(x).burst }),
    requestRate: t.int({ description: 'Request budget: cost points restored per second, across every API node.', resolve: (x) => requestBudgetLimits(x).rate }),
    createdAt: t.field({ type: 'DateTime', resolve: (x) => x.createdAt }),
    suspendedAt: t.field({ type: 'DateTime', nullable: true, description: 'When the tenant was suspended; null while active.', resolve: (x) => x.suspendedAt ?? null }),
    reservedShare: t.float({
      nullable: true,
      description:
        "The fraction (0 to 1) of its priority class's dispatches on each window guaranteed to the tenant while it has work waiting (its part of the rest by weight comes on top), lent to the others while it has none; null: no reservation.",
      resolve: (x) => x.reservedShare ?? null,
    }),
  }),
});

const TenantWithKey = builder
  .objectRef<{ tenant: TenantRecord; apiKey: string }>('TenantWithKey')
  .implement({
    description: 'A tenant and its new API key. The key is shown only here, once; Sluice stores only its hash.',
    fields: (t) => ({
      tenant: t.field({ type: TenantRef, resolve: (x) => x.tenant }),
      apiKey: t.exposeString('apiKey'),
    }),
  });

const DeletedTenant = builder.objectRef<{ id: string; cancelledJobs: number }>('DeletedTenant').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    cancelledJobs: t.exposeInt('cancelledJobs', { description: 'Waiting jobs cancelled (never sent, never billed).' }),
  }),
});

const CreateTenantInput = builder.inputType('CreateTenantInput', {
  fields: (t) => ({
    name: t.string({ required: true }),
    tier: t.field({ type: TierEnum, required: true }),
    reservedShare: t.float({ description: 'See updateTenant; absent, null or 0: no reservation.' }),
  }),
});

const UpdateTenantInput = builder.inputType('UpdateTenantInput', {
  description: 'Fields left out are unchanged; a limit set to null goes back to the tier default.',
  fields: (t) => ({
    id: t.id({ required: true }),
    name: t.string(),
    tier: t.field({ type: TierEnum }),
    weight: t.int(),
    concurrencyCap: t.int(),
    monthlyQuota: t.int(),
    queueBound: t.int(),
    quotaPolicy: t.field({ type: QuotaPolicyEnum }),
    requestBurst: t.int({ description: 'Request budget size in cost points (at least 1).' }),
    requestRate: t.int({ description: 'Request budget restore rate in cost points per second (at least 1).' }),
    reservedShare: t.float({
      description:
        "Fraction (0 to 1) of its priority class's dispatches on each window guaranteed while the tenant has work waiting (its part of the rest by weight comes on top), lent to others while it has none; null or 0 clears it. Every tenant's together at most 0.8, else RESERVATION_OVERCOMMITTED.",
    }),
  }),
});

function checkName(name: string): string {
  const trimmed = name.trim();
  if (trimmed.length < 1 || trimmed.length > 100) {
    throw new SluiceError('BAD_USER_INPUT', 'name must be 1 to 100 characters', { field: 'name' });
  }
  return trimmed;
}

function checkShare(value: number | null | undefined): number | null | undefined {
  if (value !== null && value !== undefined && !(value >= 0 && value <= 1)) {
    throw new SluiceError('BAD_USER_INPUT', 'reservedShare must be between 0 and 1', { field: 'reservedShare' });
  }
  return value;
}

function checkLimit(field: string, value: number | null | undefined, min: number): number | null | undefined {
  if (value !== null && value !== undefined && value < min) {
    throw new SluiceError('BAD_USER_INPUT', `${field} must be at least ${min}`, { field });
  }
  return value;
}

builder.queryFields((t) => ({
  tenants: t.field({
    ...role('admin'),
    type: [TenantRef],
    description: 'Every tenant (admin).',
    resolve: (_r, _a, ctx) => ctx.services.tenants.list(),
  }),
}));

builder.mutationFields((t) => ({
  createTenant: t.field({
    ...role('admin'),
    type: TenantWithKey,
    args: { input: t.arg({ type: CreateTenantInput, required: true }) },
    resolve: async (_r, { input }, ctx) => {
      const created = await ctx.services.tenants.create({ name: checkName(input.name), tier: input.tier, reservedShare: checkShare(input.reservedShare) });
      await ctx.services.tenantChanged(created.tenant);
      return created;
    },
  }),
  rotateTenantKey: t.field({
    ...role('admin'),
    type: TenantWithKey,
    description:
      "Issues a new key (both scopes) and gives the tenant's other live keys an expiry KEY_ROTATION_OVERLAP_SECONDS from now (default 24 h), so running deployments keep working while they get the new key; revokeApiKey ends one at once.",
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.services.tenants.rotateKey(asId(id, 'tenant'), ctx.services.keyRotationOverlapSeconds),
  }),
  suspendTenant: t.field({
    ...role('admin'),
    type: TenantRef,
    description: "Refuses the tenant's submissions (TENANT_SUSPENDED) and holds its queued jobs (wait reason SUSPENDED); calls in flight finish.",
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      const tenantId = asId(id, 'tenant');
      await suspendTenant(ctx.services.lifecycle, tenantId);
      return (await ctx.services.tenants.get(tenantId))!;
    },
  }),
  resumeTenant: t.field({
    ...role('admin'),
    type: TenantRef,
    description: 'Lifts a suspension: submissions are accepted again and the held jobs are dispatched.',
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      const tenantId = asId(id, 'tenant');
      await resumeTenant(ctx.services.lifecycle, tenantId);
      return (await ctx.services.tenants.get(tenantId))!;
    },
  }),
  deleteTenant: t.field({
    ...role('admin'),
    type: DeletedTenant,
    description:
      'Revokes its keys, closes its subscriptions, cancels its waiting jobs (not billed), waits for calls in flight to settle, drops its queues and deletes its rows. Usage history is kept (tenantUsageHistory).',
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, { id }, ctx) => {
      const tenantId = asId(id, 'tenant');
      const { cancelledJobs } = await deleteTenant(ctx.services.lifecycle, tenantId);
      return { id: tenantId, cancelledJobs };
    },
  }),
  updateTenant: t.field({
    ...role('admin'),
    type: TenantRef,
    args: { input: t.arg({ type: UpdateTenantInput, required: true }) },
    resolve: async (_r, { input }, ctx) => {
      const tenant = await ctx.services.tenants.update(asId(input.id, 'tenant', 'input.id'), {
        name: input.name === null || input.name === undefined ? undefined : checkName(input.name),
        tier: input.tier ?? undefined,
        weight: checkLimit('weight', input.weight, 1),
        concurrencyCap: checkLimit('concurrencyCap', input.concurrencyCap, 1),
        monthlyQuota: checkLimit('monthlyQuota', input.monthlyQuota, 0),
        queueBound: checkLimit('queueBound', input.queueBound, 1),
        requestBurst: checkLimit('requestBurst', input.requestBurst, 1),
        requestRate: checkLimit('requestRate', input.requestRate, 1),
        quotaPolicy: input.quotaPolicy ?? undefined,
        reservedShare: checkShare(input.reservedShare),
      });
      await ctx.services.tenantChanged(tenant);
      return tenant;
    },
  }),
}));
