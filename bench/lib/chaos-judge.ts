/**
 * The chaos benchmark's judgement, as pure functions: attributing the
 * simulator's call log to jobs, and judging Sluice's record (jobs, ledger)
 * against it, plus the recovery and stall figures. No I/O: bench/chaos.ts
 * gathers the rows and calls these.
 *
 * Every job the bench submits carries a tag `<tenant>-<n>` three times: its
 * idempotency key, and its one identifying param (a dnslookup `domain` or an
 * emailvalidator `email`), so each upstream call names its job.
 */

export const TAG_PREFIX = 'chaos-';

export function idempotencyKeyFor(tag: string): string {
  return `${TAG_PREFIX}${tag}`;
}

/** The tag of an idempotency key the bench wrote, else null. */
export function tagOfKey(key: string | null): string | null {
  return key && key.startsWith(TAG_PREFIX) ? key.slice(TAG_PREFIX.length) : null;
}

export function paramsFor(api: 'dnslookup' | 'emailvalidator', tag: string): Record<string, string> {
  return api === 'dnslookup' ? { domain: `j${tag}.chaos.example` } : { email: `j${tag}@chaos.example` };
}

const TAGGED = /^j(\d+-\d+)[.@]chaos\.example$/;

/** The tag a call's params carry, else null. */
export function tagOfParams(params: Record<string, unknown>): string | null {
  const v = params.domain ?? params.email;
  const m = typeof v === 'string' ? TAGGED.exec(v) : null;
  return m ? m[1]! : null;
}

/** The tenant index a tag names. */
export function tenantOfTag(tag: string): number {
  return Number(tag.slice(0, tag.indexOf('-')));
}

export interface LoggedCall {
  params: Record<string, unknown>;
  status: number | null;
  credits: number;
}

export interface ProviderTally {
  /** Calls the provider received for the job (answered or not). */
  calls: number;
  /** Of those, calls it billed. */
  billedCalls: number;
  credits: number;
}

/** The call log summed per job tag; calls naming no job are counted apart. */
export function attribute(calls: readonly LoggedCall[]): { perTag: Map<string, ProviderTally>; unattributed: number } {
  const perTag = new Map<string, ProviderTally>();
  let unattributed = 0;
  for (const c of calls) {
    const tag = tagOfParams(c.params);
    if (tag === null) {
      unattributed += 1;
      continue;
    }
    const t = perTag.get(tag) ?? { calls: 0, billedCalls: 0, credits: 0 };
    t.calls += 1;
    if (c.credits > 0) t.billedCalls += 1;
    t.credits += c.credits;
    perTag.set(tag, t);
  }
  return { perTag, unattributed };
}

/** Sluice's record of one job (its jobs row, result and bill included). */
export interface JobRecord {
  id: string;
  tag: string | null;
  state: string;
  attempts: number;
  creditsBilled: number;
  /**
   * Attempts whose worker was lost with the call in flight: settled by lease expiry (`node_lost`)
   * and never corrected by a late settlement from that worker (it died with the answer). Each
   * such attempt may be followed by another call (I9: the lease is the one liveness authority).
   */
  lostWithWorker?: number;
}

export const FINAL_STATES: ReadonlySet<string> = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

export interface JobVerdict {
  /** Accepted ids (the client got them back) whose job is missing or has not ended. */
  lost: Array<{ id: string; state: string | null }>;
  /**
   * Jobs the provider billed more than once for a reason other than a lost worker, or that sent
   * more calls than Sluice counted attempts (`why` says which: `billedTwice`, `callsOverAttempts`,
   * or both).
   */
  doubleBilled: Array<{ tag: string; attempts: number; why: Array<'billedTwice' | 'callsOverAttempts'> } & ProviderTally>;
  /**
   * Jobs called again because the worker holding their call was lost (SIGKILL): one more billed
   * call per attempt lost with its worker, each charged once (the answer died with the worker;
   * the provider takes no idempotency key). Allowed by I9; not double billing.
   */
  rerunAfterWorkerLoss: Array<{ tag: string; attempts: number; lostWithWorker: number } & ProviderTally>;
  /** Jobs whose creditsBilled differs from what the provider billed for them. */
  perJobMismatches: Array<{ tag: string; creditsBilled: number; providerCredits: number; state: string }>;
  /** Tags the provider saw that no job carries. */
  callsForUnknownJobs: number;
}

export function judgeJobs(accepted: ReadonlyMap<string, string>, jobs: readonly JobRecord[], perTag: ReadonlyMap<string, ProviderTally>): JobVerdict {
  const byId = new Map(jobs.map((j) => [j.id, j]));
  const lost: JobVerdict['lost'] = [];
  for (const id of accepted.keys()) {
    const j = byId.get(id);
    if (!j || !FINAL_STATES.has(j.state)) lost.push({ id, state: j?.state ?? null });
  }
  const doubleBilled: JobVerdict['doubleBilled'] = [];
  const rerunAfterWorkerLoss: JobVerdict['rerunAfterWorkerLoss'] = [];
  const perJobMismatches: JobVerdict['perJobMismatches'] = [];
  const known = new Set<string>();
  for (const j of jobs) {
    if (j.tag === null) continue;
    known.add(j.tag);
    const p = perTag.get(j.tag) ?? { calls: 0, billedCalls: 0, credits: 0 };
    const why: JobVerdict['doubleBilled'][number]['why'] = [];
    const lostWithWorker = j.lostWithWorker ?? 0;
    if (p.billedCalls > 1 + lostWithWorker) why.push('billedTwice');
    if (p.calls > j.attempts) why.push('callsOverAttempts');
    if (why.length > 0) doubleBilled.push({ tag: j.tag, attempts: j.attempts, why, ...p });
    else if (p.billedCalls > 1) rerunAfterWorkerLoss.push({ tag: j.tag, attempts: j.attempts, lostWithWorker, ...p });
    if (p.credits !== j.creditsBilled) perJobMismatches.push({ tag: j.tag, creditsBilled: j.creditsBilled, providerCredits: p.credits, state: j.state });
  }
  let callsForUnknownJobs = 0;
  for (const [tag, p] of perTag) if (!known.has(tag)) callsForUnknownJobs += p.calls;
  return { lost, doubleBilled, rerunAfterWorkerLoss, perJobMismatches, callsForUnknownJobs };
}

/** Provider credits per tenant index, from the per-tag tally. */
export function creditsPerTenant(perTag: ReadonlyMap<string, ProviderTally>): Map<number, number> {
  const out = new Map<number, number>();
  for (const [tag, p] of perTag) out.set(tenantOfTag(tag), (out.get(tenantOfTag(tag)) ?? 0) + p.credits);
  return out;
}

/** The first instant in an ascending list strictly after `t`, else null. */
export function firstAfter(sorted: readonly number[], t: number): number | null {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid]! <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo < sorted.length ? sorted[lo]! : null;
}

/**
 * Seconds from a fault's end until every tenant has had a job finish AND a
 * submission answered again (the later of the two, for the slowest tenant);
 * null when some tenant never got either back.
 */
export function recoverySeconds(endMs: number, finishes: ReadonlyArray<readonly number[]>, answers: ReadonlyArray<readonly number[]>): number | null {
  let worst = 0;
  for (const list of [...finishes, ...answers]) {
    const t = firstAfter(list, endMs);
    if (t === null) return null;
    worst = Math.max(worst, t - endMs);
  }
  return worst / 1000;
}

/** The longest stretch (seconds) within [fromMs, toMs] with no instant of an ascending list in it. */
export function longestGapSeconds(sorted: readonly number[], fromMs: number, toMs: number): number {
  let prev = fromMs;
  let worst = 0;
  for (const t of sorted) {
    if (t < fromMs) continue;
    if (t > toMs) break;
    worst = Math.max(worst, t - prev);
    prev = t;
  }
  return Math.max(worst, toMs - prev) / 1000;
}

/**
 * Which fault a faulty job belongs to: the first fault whose span (from its
 * start minus `beforeMs` to its end plus `afterMs`) holds one of the job's
 * upstream calls. A job billed twice after a long outage has a call before the
 * outage and one after; a job a dead worker left behind has its call just
 * before the kill. Returns the fault index per tag, or -1 (outside every fault).
 */
export function faultOfJobs(
  tags: readonly string[],
  callTimes: ReadonlyMap<string, readonly number[]>,
  spans: ReadonlyArray<{ startMs: number; endMs: number }>,
  beforeMs: number,
  afterMs: number,
): Map<string, number> {
  const out = new Map<string, number>();
  for (const tag of tags) {
    const times = callTimes.get(tag) ?? [];
    const i = spans.findIndex((s) => times.some((t) => t >= s.startMs - beforeMs && t <= s.endMs + afterMs));
    out.set(tag, i);
  }
  return out;
}
