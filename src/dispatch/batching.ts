/**
 * Batching decisions, as pure functions: how many jobs a lease takes when the
 * queue's head API batches, how leased jobs are grouped into batch calls and
 * single calls, and the deduplication key of an input.
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

export interface Leased {
  api: string;
  params: Record<string, unknown>;
}

/** One upstream item of a batch: the jobs (indexes into the leased list) that share its input. First = the one sent. */
export interface PlannedItem {
  key: string;
  jobs: number[];
}

export interface PlannedBatch {
  api: string;
  items: PlannedItem[];
}

export interface LeasePlan {
  batches: PlannedBatch[];
  /** Indexes of jobs called one by one. */
  singles: number[];
  /** Indexes of jobs that do not fit the window's room: they go back to the queue. */
  back: number[];
  /** Tokens the plan needs: one per single, one per distinct batch item. */
  tokens: number;
  /** Window pool slots the plan needs: one per single, one per batch. */
  slots: number;
}

/**
 * Groups leased jobs (in queue order) by API. An API that batches, with at
 * least minSize distinct inputs among the jobs, is sent as batches of at most
 * maxSize distinct items; duplicates ride on the first job with their input.
 * Other jobs are single calls. At most `room` pool slots are used: what does
 * not fit (later groups first) goes back to the queue.
 */
export function planLease(jobs: readonly Leased[], catalog: ApiCatalog, room: number, batchMax: number): LeasePlan {
  const byApi = new Map<string, number[]>();
  for (let i = 0; i < jobs.length; i++) {
    const list = byApi.get(jobs[i]!.api);
    if (list) list.push(i);
    else byApi.set(jobs[i]!.api, [i]);
  }
  // Units in queue order of their first job: a batch or a single, each one slot.
  const units: Array<{ first: number; batch?: PlannedBatch; single?: number }> = [];
  for (const [api, idx] of byApi) {
    const spec = batchMax > 1 ? batchSpec(catalog, api) : null;
    const items = new Map<string, PlannedItem>();
    for (const i of idx) {
      const key = dedupKey(api, jobs[i]!.params);
      const item = items.get(key);
      if (item) item.jobs.push(i);
      else items.set(key, { key, jobs: [i] });
    }
    if (spec && items.size >= spec.minSize) {
      const all = [...items.values()];
      const size = Math.max(1, Math.min(spec.maxSize, batchMax));
      for (let s = 0; s < all.length; s += size) {
        const chunk = all.slice(s, s + size);
        units.push({ first: Math.min(...chunk.flatMap((c) => c.jobs)), batch: { api, items: chunk } });
      }
    } else {
      for (const i of idx) units.push({ first: i, single: i });
    }
  }
  units.sort((a, b) => a.first - b.first);
  const plan: LeasePlan = { batches: [], singles: [], back: [], tokens: 0, slots: 0 };
  for (const u of units) {
    if (plan.slots >= room) {
      if (u.batch) plan.back.push(...u.batch.items.flatMap((it) => it.jobs));
      else plan.back.push(u.single!);
      continue;
    }
    plan.slots++;
    if (u.batch) {
      plan.batches.push(u.batch);
      plan.tokens += u.batch.items.length;
    } else {
      plan.singles.push(u.single!);
      plan.tokens++;
    }
  }
  plan.back.sort((a, b) => a - b);
  return plan;
}
