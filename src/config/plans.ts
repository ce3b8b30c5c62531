/**
 * APIVerve plans (PROVIDER.md, "Limits"). `ratePerMinute: null` means no
 * per-minute ceiling (Mega): such a window has no pacer but still has the
 * plan's concurrent-call limit.
 */
export interface Plan {
  readonly name: PlanName;
  readonly ratePerMinute: number | null;
  readonly concurrentCalls: number;
  readonly monthlyCredits: number;
  readonly subKeys: number;
}

export const PLAN_NAMES = ['FREE', 'STARTER', 'PRO', 'MEGA'] as const;
export type PlanName = (typeof PLAN_NAMES)[number];

export const PLANS: Readonly<Record<PlanName, Plan>> = {
  FREE: { name: 'FREE', ratePerMinute: 5, concurrentCalls: 1, monthlyCredits: 200, subKeys: 0 },
  STARTER: { name: 'STARTER', ratePerMinute: 60, concurrentCalls: 5, monthlyCredits: 200_000, subKeys: 0 },
  PRO: { name: 'PRO', ratePerMinute: 180, concurrentCalls: 20, monthlyCredits: 1_000_000, subKeys: 5 },
  MEGA: { name: 'MEGA', ratePerMinute: null, concurrentCalls: 50, monthlyCredits: 4_000_000, subKeys: 25 },
};
