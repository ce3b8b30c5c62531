/**
 * Batching decisions, as pure functions: how many jobs a lease takes when the
 * queue's head API batches, and the deduplication key of an input. (Which
 * leased jobs form a batch call is decided by the lease itself: a batch turn
 * of sluice_lease, modelled by scheduler/lease.ts planPicks.)
 *
 * Accounting (see docs/ARCHITECTURE.md, "Batching"):
 * - a job is one reservation and one in-flight slot on its tenant (cap, I3),
 *   one item of fair share (virtual time advances by jobs), whether or not it
 *   batches;
 * - the pacer takes one token per item SENT (after deduplication);
 * - a batch call holds one window pool slot, like a single call.
 */
import type { ApiCatalog } from '../config/apis.ts';
import { BATCH_MAX_ITEMS } from '../provider/batch-wire.ts';

/** A JSON value with object keys sorted at every level: equal inputs give equal strings. */
export function stableStringify(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map((v) => (v === undefined ? 'null' : stableStringify(v))).join(',')}]`;
  const obj = value as Record<string, unknown>;
  const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${stableStringify(obj[k])}`).join(',')}}`;
}

/** Identical inputs: same API, same params (key order does not matter). */
export function dedupKey(api: string, params: Record<string, unknown>): string {
  return `${api}\u0000${stableStringify(params)}`;
}

/** Whether an API batches, and its size bounds (null: it does not). */
export function batchSpec(catalog: ApiCatalog, api: string): { maxSize: number; minSize: number } | null {
  const spec = catalog.get(api);
  if (!spec || !spec.batch.enabled) return null;
  return { maxSize: Math.min(spec.batch.maxSize, BATCH_MAX_ITEMS), minSize: Math.max(1, spec.batch.minSize) };
}

/**
 * How many jobs to lease when the head API batches: one batch needs one pool
 * slot (room >= 1 is checked by the caller) and one token per item, and each
 * job takes one of the tenant's free cap slots. Bounded by BATCH_MAX and the
 * API's maxSize. Never less than the single-call take.
 */
export function batchTake(o: { tokens: number; batchMax: number; apiMaxSize: number; capFree: number; singleTake: number }): number {
  const take = Math.min(Math.floor(o.tokens), o.batchMax, o.apiMaxSize, o.capFree);
  return Math.max(o.singleTake, take, 1);
}
