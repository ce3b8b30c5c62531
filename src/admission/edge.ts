/**
 * Where the edge screens submissions: under pressure, a process remembers
 * that a bound refused (the global one, or a tenant's) in the last moments,
 * and only then does a submission pay for the lock-free screen before the gate
 * (jobs/service.ts). With no refusal for `holdMs`, submissions go straight to
 * the gate again, as the accepting path always did: the screen costs accepts a
 * round trip, so it runs only while refusals are likely. Pure state: the
 * caller passes the time.
 */
export class Pressure {
  private global = Number.NEGATIVE_INFINITY;
  private readonly tenants = new Map<string, number>();
  private readonly holdMs: number;

  constructor(holdMs: number) {
    this.holdMs = holdMs;
  }

  /** A QUEUE_FULL refusal was answered (at the gate or the edge). */
  note(scope: 'TENANT' | 'GLOBAL', tenantId: string, nowMs: number): void {
    if (scope === 'GLOBAL') this.global = nowMs;
    else this.tenants.set(tenantId, nowMs);
    // Bounded by the tenants refused within holdMs: older entries are dropped as new ones come.
    if (this.tenants.size > 1_000) for (const [id, at] of this.tenants) if (nowMs - at > this.holdMs) this.tenants.delete(id);
  }

  /** Whether the global bound refused within holdMs (the screen then counts the global depth). */
  globalFull(nowMs: number): boolean {
    return nowMs - this.global <= this.holdMs;
  }

  /** Whether a submission of this tenant is screened at the edge. */
  applies(tenantId: string, nowMs: number): boolean {
    if (this.globalFull(nowMs)) return true;
    const at = this.tenants.get(tenantId);
    return at !== undefined && nowMs - at <= this.holdMs;
  }
}
