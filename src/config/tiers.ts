/**
 * Tenant tiers: the defaults a tenant gets from its tier. Every field can be
 * overridden per tenant (`updateTenant`); the scheduler and admission read the
 * tenant's effective values, never these directly.
 */
export const TIER_NAMES = ['FREE', 'PRO', 'ENTERPRISE'] as const;
export type TierName = (typeof TIER_NAMES)[number];

export interface TierSpec {
  /** Share of the paced rate relative to other active tenants. */
  readonly weight: number;
  /** Maximum in-flight upstream calls, across all nodes. */
  readonly concurrencyCap: number;
  /** Credits a tenant may spend per monthly period. */
  readonly monthlyQuota: number;
  /** Maximum jobs waiting in the tenant's queues (all classes together). */
  readonly queueBound: number;
  /** Request budget: cost points the tenant may spend at once (the bucket's size; src/http/budget.ts). */
  readonly requestBurst: number;
  /** Request budget: cost points restored per second, shared by every API node. */
  readonly requestRate: number;
}

export const TIERS: Readonly<Record<TierName, TierSpec>> = {
  FREE: { weight: 1, concurrencyCap: 2, monthlyQuota: 1_000, queueBound: 1_000, requestBurst: 1_000, requestRate: 50 },
  PRO: { weight: 2, concurrencyCap: 8, monthlyQuota: 100_000, queueBound: 50_000, requestBurst: 2_000, requestRate: 100 },
  ENTERPRISE: { weight: 4, concurrencyCap: 32, monthlyQuota: 1_000_000, queueBound: 200_000, requestBurst: 5_000, requestRate: 250 },
};
