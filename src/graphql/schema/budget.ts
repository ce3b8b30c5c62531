import { builder, role } from '../builder.ts';
import { currentlyAvailable, type BudgetState } from '../../http/budget.ts';

const RateLimitRef = builder.objectRef<BudgetState>('RateLimit').implement({
  description: "Your request budget, as GitHub's GraphQL API reports it: a bucket of cost points shared by every Sluice node.",
  fields: (t) => ({
    limit: t.int({ description: 'Points the bucket holds when full.', resolve: (s) => s.limits.burst }),
    cost: t.int({ description: 'Points this operation was charged before it ran (its requested cost; extensions.cost has the actual).', resolve: (s) => s.requested }),
    remaining: t.int({ description: 'Points left after this charge.', resolve: (s) => Math.floor(currentlyAvailable(s)) }),
    resetAt: t.field({
      type: 'DateTime',
      description: 'When the bucket is full again at its restore rate, if nothing more is spent.',
      resolve: (s) => new Date(Date.now() + (Math.max(0, s.limits.burst - currentlyAvailable(s)) / s.limits.rate) * 1000),
    }),
  }),
});

builder.queryFields((t) => ({
  rateLimit: t.field({
    ...role('tenant', []),
    type: RateLimitRef,
    nullable: true,
    description: 'Your request budget after this operation was charged; null when budgets are off.',
    resolve: (_r, _a, ctx) => ctx.budget ?? null,
  }),
}));
