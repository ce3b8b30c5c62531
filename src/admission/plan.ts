/**
 * The decision of one group commit, pure: for each submission in order,
 * idempotent replays and conflicts first, then admission of its new jobs
 * against the depths plus what the submissions before it were admitted.
 * The service reads the inputs under the gate, calls this, and writes what
 * it says; see jobs/service.ts.
 */
import type { JobClass } from '../config/classes.ts';
import { admit, type Refusal } from './rules.ts';

export interface PlannedJob {
  id: string;
  api: string;
  params: Record<string, unknown>;
  priority: JobClass;
  idempotencyKey: string | null;
}

export interface PlanSubmission<J extends PlannedJob = PlannedJob> {
  tenantId: string;
  tenantBound: number;
  jobs: readonly J[];
}

export interface KnownJob {
  id: string;
  state: string;
  api: string;
  params: Record<string, unknown>;
}

export interface PlanInput<J extends PlannedJob = PlannedJob> {
  subs: readonly PlanSubmission<J>[];
  /** `${tenantId}:${key}` → the job stored under that idempotency key. */
  originals: ReadonlyMap<string, KnownJob>;
  tenantDepth: ReadonlyMap<string, number>;
  /** State new jobs of a tenant show (WAITING_QUOTA while it waits for quota; they are stored QUEUED either way). */
  newState: (tenantId: string) => 'QUEUED' | 'WAITING_QUOTA';
  globalDepth: number;
  globalBound: number;
  classShare: Partial<Record<JobClass, number>>;
}

export type SubmissionPlan<J extends PlannedJob = PlannedJob> =
  | { kind: 'accept'; insert: J[]; state: 'QUEUED' | 'WAITING_QUOTA'; answers: Array<{ id: string; state: string }> }
  | { kind: 'conflict'; index: number; key: string; originalId: string }
  | { kind: 'refuse'; refusal: Refusal };

/** Same api and same params (key order does not matter): a replay, not a conflict. */
export function sameRequest(a: { api: string; params: Record<string, unknown> }, b: { api: string; params: Record<string, unknown> }): boolean {
  const canon = (p: Record<string, unknown>) => JSON.stringify(Object.keys(p).sort().map((k) => [k, p[k]]));
  return a.api === b.api && canon(a.params) === canon(b.params);
}

export function planGroup<J extends PlannedJob>(input: PlanInput<J>): Array<SubmissionPlan<J>> {
  const known = new Map(input.originals);
  const tenantDepth = new Map(input.tenantDepth);
  let globalDepth = input.globalDepth;
  return input.subs.map((sub): SubmissionPlan<J> => {
    const state = input.newState(sub.tenantId);
    const insert: J[] = [];
    const answers: Array<{ id: string; state: string }> = [];
    for (const [index, job] of sub.jobs.entries()) {
      const original = job.idempotencyKey === null ? undefined : known.get(`${sub.tenantId}:${job.idempotencyKey}`);
      if (!original) {
        insert.push(job);
        answers.push({ id: job.id, state });
      } else if (sameRequest(job, original)) {
        answers.push({ id: original.id, state: original.state });
      } else {
        return { kind: 'conflict', index, key: job.idempotencyKey!, originalId: original.id };
      }
    }
    if (insert.length > 0) {
      const incoming: Partial<Record<JobClass, number>> = {};
      for (const j of insert) incoming[j.priority] = (incoming[j.priority] ?? 0) + 1;
      const verdict = admit({
        incoming,
        tenantDepth: tenantDepth.get(sub.tenantId) ?? 0,
        tenantBound: sub.tenantBound,
        globalDepth,
        globalBound: input.globalBound,
        classShare: input.classShare,
      });
      if (!verdict.ok) return { kind: 'refuse', refusal: verdict };
    }
    tenantDepth.set(sub.tenantId, (tenantDepth.get(sub.tenantId) ?? 0) + insert.length);
    globalDepth += insert.length;
    for (const j of insert) {
      if (j.idempotencyKey !== null) known.set(`${sub.tenantId}:${j.idempotencyKey}`, { id: j.id, state, api: j.api, params: j.params });
    }
    return { kind: 'accept', insert, state, answers };
  });
}

/**
 * The edge's decision, before the gate (jobs/service.ts): which submissions
 * surely cannot fit, each judged alone against a lock-free snapshot of the
 * depths (no running totals: a submission refused here would not fit even if
 * every other one of its group were refused at the gate). A refusal here is
 * what the gate would answer on the same snapshot; anything that could fit,
 * replays and conflicts go on to the gate, which decides exactly. Pure.
 */
export function edgeRefusals<J extends PlannedJob>(input: PlanInput<J>): Array<Refusal | null> {
  return input.subs.map((sub) => {
    const [plan] = planGroup({ ...input, subs: [sub] });
    return plan!.kind === 'refuse' ? plan!.refusal : null;
  });
}
