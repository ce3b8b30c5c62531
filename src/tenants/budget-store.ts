/**
 * Owns tenant_request_budgets: each tenant's request budget, a token bucket of
 * cost points shared by every API node. One statement per charge and per
 * refund, each a single conditional upsert, so two nodes never both spend the
 * last points (the pacer's shape, src/scheduler/pacer.ts, for requests).
 *
 * The bucket is restored lazily: points = min(burst, points + rate × elapsed).
 * `updated_at` only moves forward (a statement that waited for the row lock
 * with an earlier now() must not restore the same time twice).
 */
import type { Sql } from '../db/client.ts';
import type { RequestBudgetLimits } from './policy.ts';

export interface Charge {
  /** True when the points were taken. */
  granted: boolean;
  /** Points left after this statement (before any refund). */
  available: number;
}

/**
 * Takes `cost` points when the bucket holds them, else nothing. A new tenant
 * starts full. `cost` must not exceed `limits.burst` (the caller refuses such
 * a request without asking: it could never be granted).
 */
export async function chargeBudget(sql: Sql, tenantId: string, limits: RequestBudgetLimits, cost: number): Promise<Charge> {
  const { burst, rate } = limits;
  // The restored level, written once for the condition and once for the new value.
  const [row] = await sql`
    insert into tenant_request_budgets as b (tenant_id, tokens, updated_at)
    values (${tenantId}, ${burst}::float8 - ${cost}::float8, now())
    on conflict (tenant_id) do update set
      tokens = least(${burst}::float8, b.tokens + ${rate}::float8 * greatest(0, extract(epoch from now() - b.updated_at))) - ${cost}::float8,
      updated_at = greatest(b.updated_at, now())
    where least(${burst}::float8, b.tokens + ${rate}::float8 * greatest(0, extract(epoch from now() - b.updated_at))) >= ${cost}::float8
    returning tokens`;
  if (row) return { granted: true, available: Number(row.tokens) };
  // Refused (the only path with a second statement): how much there is now, for Retry-After.
  return { granted: false, available: await availableBudget(sql, tenantId, limits) };
}

/** Points in the bucket now (a full bucket for a tenant that never spent any). */
export async function availableBudget(sql: Sql, tenantId: string, limits: RequestBudgetLimits): Promise<number> {
  const [row] = await sql`
    select least(${limits.burst}::float8, tokens + ${limits.rate}::float8 * greatest(0, extract(epoch from now() - updated_at))) as available
    from tenant_request_budgets where tenant_id = ${tenantId}`;
  return row ? Number(row.available) : limits.burst;
}

/** Gives back `points` (an operation cost less than it asked for), never past the burst. */
export async function refundBudget(sql: Sql, tenantId: string, limits: RequestBudgetLimits, points: number): Promise<void> {
  if (points <= 0) return;
  await sql`
    update tenant_request_budgets set tokens = least(${limits.burst}::float8, tokens + ${points}::float8)
    where tenant_id = ${tenantId}`;
}
