/**
 * The per-tenant delivery budget of one sender, pure (the clock is passed in): a token bucket per
 * tenant (WEBHOOK_TENANT_DELIVERIES_PER_SECOND, up to WEBHOOK_TENANT_DELIVERY_BURST), and a cap on
 * the deliveries one tenant has in flight in this process (WEBHOOK_TENANT_CONCURRENCY). Each claim
 * asks allowances() how many deliveries each tenant may take now and charges what it took; the
 * claim hands the slots out round-robin across tenants within those allowances (store.ts claimDue),
 * so a tenant with a backlog of thousands gets its rate and no more, and another tenant's delivery
 * is claimed at the next round. Buckets that are full again are forgotten (the map holds only
 * tenants that sent lately).
 */

export interface TenantBudgetOptions {
  /** Tokens a second per tenant; 0: no rate limit. */
  ratePerSecond: number;
  /** The bucket's size: deliveries a quiet tenant may send at once. */
  burst: number;
  /** Deliveries one tenant may have in flight in this process. */
  concurrency: number;
}

export interface Allowances {
  /** What any tenant not listed may take. */
  fallback: number;
  /** Tenants that may take less than the fallback (0: none now). */
  limited: Record<string, number>;
}

export class TenantBudget {
  private readonly o: TenantBudgetOptions;
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  private readonly inFlight = new Map<string, number>();

  constructor(o: TenantBudgetOptions) {
    this.o = o;
  }

  private tokens(tenant: string, nowMs: number): number {
    const b = this.buckets.get(tenant);
    if (!b || this.o.ratePerSecond <= 0) return Infinity;
    const tokens = Math.min(this.o.burst, b.tokens + ((nowMs - b.at) * this.o.ratePerSecond) / 1000);
    if (tokens >= this.o.burst) {
      this.buckets.delete(tenant);
      return Infinity;
    }
    return tokens;
  }

  /** How many deliveries each tenant may be given by the next claim. */
  allowances(nowMs: number): Allowances {
    const fallback = this.o.ratePerSecond > 0 ? Math.min(this.o.burst, this.o.concurrency) : this.o.concurrency;
    const limited: Record<string, number> = {};
    for (const tenant of new Set([...this.buckets.keys(), ...this.inFlight.keys()])) {
      const n = Math.max(0, Math.min(Math.floor(this.tokens(tenant, nowMs)), this.o.concurrency - (this.inFlight.get(tenant) ?? 0)));
      if (n < fallback) limited[tenant] = n;
    }
    return { fallback, limited };
  }

  /** A claim gave this tenant one delivery: a token spent, a slot taken until done(). */
  took(tenant: string, nowMs: number): void {
    if (this.o.ratePerSecond > 0) {
      const t = this.tokens(tenant, nowMs);
      this.buckets.set(tenant, { tokens: (t === Infinity ? this.o.burst : t) - 1, at: nowMs });
    }
    this.inFlight.set(tenant, (this.inFlight.get(tenant) ?? 0) + 1);
  }

  /** The delivery's attempt ended: its slot is free. */
  done(tenant: string): void {
    const n = (this.inFlight.get(tenant) ?? 0) - 1;
    if (n > 0) this.inFlight.set(tenant, n);
    else this.inFlight.delete(tenant);
  }

  /** Milliseconds until a tenant out of tokens has one again (null: none is out). */
  nextTokenInMs(nowMs: number): number | null {
    let soonest: number | null = null;
    for (const tenant of [...this.buckets.keys()]) {
      const t = this.tokens(tenant, nowMs);
      if (t >= 1) continue;
      const ms = Math.ceil(((1 - t) * 1000) / this.o.ratePerSecond);
      soonest = soonest === null ? ms : Math.min(soonest, ms);
    }
    return soonest;
  }
}
