/**
 * Submission and cancellation: the front half of a job's path. Validation is
 * pure (validate.ts), so is the group's decision (admission/plan.ts); here the
 * accepted jobs are written to our jobs table and to the tenants' pg-boss
 * queues in ONE transaction, so a job is either fully accepted (a row we can
 * report on and a queue entry the dispatcher will find) or not at all.
 *
 * Single submissions (submitJob, or submitJobs of one) are group-committed:
 * concurrent ones share a transaction (jobs/group-commit.ts). A bulk
 * submission is a group of one. Either way a transaction takes the admission
 * gate first (admission/store.ts), so bounds are exact across processes, and
 * answers only after commit.
 */
import { randomUUID } from 'node:crypto';
import type { PgBoss } from 'pg-boss';
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import { SluiceError, withoutStack } from '../errors.ts';
import { publishJobEvents } from '../events/bus.ts';
import { inTransaction, lockBossJob, lockBossJobs, queueName } from '../queue/boss.ts';
import { type JobClass } from '../config/classes.ts';
import { cancelQueuedJob, cancelQueuedJobs, getJob, insertJobsQueued, jobClassOf, originalsByIdempotencyKey, waitingJobsMatching, type JobFilter, type JobRow, type JobState, type NewJob, type NewJobRow, visibleJobState } from './store.ts';
import { newJobIds } from './ids.ts';
import { DEFAULT_SCHEDULE_MAX_AHEAD_SECONDS, validateSubmission, type JobInput, type ParamLimits } from './validate.ts';
import type { CommitGate } from '../http/deadline.ts';
import { databaseUnavailable } from '../db/availability.ts';
import postgres from 'postgres';
import { retryAfterSeconds, tenantDrainRate, type Refusal } from '../admission/rules.ts';
import { edgeRefusals, planGroup, type KnownJob, type PlanInput, type SubmissionPlan } from '../admission/plan.ts';
import { Pressure } from '../admission/edge.ts';
import { addAdmitted, claimRoom, countWaiting, lockGate, readTenants, reconcileGate, reserveRoom, type ReservedRoom, type TenantAdmissionState } from '../admission/store.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import { markManyQueuesReady } from '../scheduler/sql/queues.ts';
import { busyWeights, lockTenants, tenantSchedState } from '../scheduler/sql/tenants.ts';
import { readWindows } from '../scheduler/sql/windows.ts';
import { effectiveLimits, quotaPeriod, type TenantRecord } from '../tenants/policy.ts';
import { endSpan, startSpan, traceparentOf, tracing } from '../tracing/tracer.ts';
import { GroupCommit, type ItemResult } from './group-commit.ts';

/** States a job can be submitted again from (retryJob). */
export const RETRYABLE_STATES: readonly JobState[] = ['FAILED', 'CANCELLED'];

/** Why this job cannot be retried, or null when it can; pure. */
export function retryRefusal(job: Pick<JobRow, 'id' | 'state'>): SluiceError | null {
  if (RETRYABLE_STATES.includes(job.state)) return null;
  return new SluiceError('NOT_RETRYABLE', `job ${job.id} is ${job.state}; only FAILED or CANCELLED jobs can be retried`, { state: job.state });
}

/** Channel the dispatcher listens on to wake up when new work arrives. */
export const WORK_CHANNEL = 'sluice_work';

/**
 * One notification per transaction, not one per tenant: every listener wakes
 * once per group. The payload names the tenants with new work (comma-separated)
 * while that fits a NOTIFY payload, else it is empty ("several").
 */
export function workPayload(tenantIds: readonly string[]): string {
  const text = [...new Set(tenantIds)].join(',');
  return text.length <= 7_000 ? text : '';
}

/** Submissions of at least this many jobs reserve their room and write outside the gate. */
export const BULK_RESERVE_MIN = 500;

/**
 * Whether a submission takes the reservation path: large enough that holding
 * the gate while it writes would stall other admissions (in every process),
 * keyed or not. Keys written outside the gate can race a concurrent writer of
 * the same key; the unique index decides, and the loser decides again
 * (`KeyRace`). Pure.
 */
export function reservesRoom(jobs: ReadonlyArray<{ idempotencyKey: string | null }>, min: number): boolean {
  return jobs.length >= min;
}

/**
 * A write stored fewer jobs than it decided to: another transaction stored one
 * of its idempotency keys after the decision (a keyed bulk writes outside the
 * gate). The transaction is rolled back and the submission decided again, when
 * the other's jobs are visible (replayed, or a conflict).
 */
class KeyRace extends Error {}

/** How many times a submission is decided after losing key races, before it is answered DATABASE_UNAVAILABLE (retryable). */
const KEY_RACE_ATTEMPTS = 4;

/** Accepted jobs per class (the gate's counts). Pure. */
function perClass(jobs: ReadonlyArray<{ priority: JobClass }>): Partial<Record<JobClass, number>> {
  const out: Partial<Record<JobClass, number>> = {};
  for (const j of jobs) out[j.priority] = (out[j.priority] ?? 0) + 1;
  return out;
}

/** The idempotency keys of submissions' jobs, with their tenants (to look up the originals). Pure. */
function keysOf(subs: readonly Submission[]): Array<{ tenantId: string; key: string }> {
  return subs.flatMap((s) => s.jobs.filter((j) => j.idempotencyKey !== null).map((j) => ({ tenantId: s.tenant.id, key: j.idempotencyKey! })));
}

/** Waiting jobs of all classes, from per-class counts. Pure. */
function sumClasses(d: Partial<Record<JobClass, number>>): number {
  return Object.values(d).reduce((a, n) => a + (n ?? 0), 0);
}

/** The room accepted jobs take, per tenant and class (an admission reservation's rows). Pure. */
function roomOf(jobs: ReadonlyArray<{ tenantId: string; priority: JobClass }>): ReservedRoom[] {
  const room = new Map<string, ReservedRoom>();
  for (const j of jobs) {
    const key = `${j.tenantId}:${j.priority}`;
    const r = room.get(key) ?? { tenantId: j.tenantId, jobClass: j.priority, jobs: 0 };
    r.jobs++;
    room.set(key, r);
  }
  return [...room.values()];
}

export interface SubmittedJob {
  id: string;
  state: JobState;
}

export interface JobServiceDeps {
  sql: Sql;
  boss: PgBoss;
  catalog: ApiCatalog;
  maxJobsPerSubmission: number;
  /** MAX_PARAM_KEYS / MAX_PARAMS_BYTES; defaults in validate.ts. */
  paramLimits?: ParamLimits;
  /** JOB_RUN_AT_MAX_SECONDS: how far ahead a job's runAt may be (default 30 days). */
  runAtMaxSeconds?: number;
  admission: AdmissionConfig;
  /** Submissions of at least this many jobs reserve room under the gate and write outside it (default 500). */
  bulkReserveMin?: number;
  /** An admission reservation whose jobs never came is reclaimed after this long (ADMISSION_RESERVATION_SECONDS). */
  reservationSeconds?: number;
  /** Group commit of single submissions; maxItems 1 turns it off. */
  groupCommit?: { windowMs: number; maxItems: number };
  /** Counts refusals (metrics). */
  onRefused?: (code: string, jobClass: JobClass | null) => void;
  /** Observes each committed group's size (metrics). */
  onGroupCommitted?: (size: number) => void;
  /** How long after a QUEUE_FULL refusal submissions (all, or the tenant's) are screened at the edge first (default 2,000 ms). */
  pressureHoldMs?: number;
}

export interface AdmissionConfig {
  globalBound: number;
  classShare: Partial<Record<JobClass, number>>;
  /** The windows, for drain-time estimates (paced rates, which classes use them). */
  windows: readonly WindowSpec[];
}

/** One submission, validated, with ids assigned: what a group carries. */
interface Submission {
  tenant: TenantRecord;
  jobs: NewJob[];
  /** submitJobs (errors name an index) or submitJob. */
  bulk: boolean;
  /** The request deadline's gate: once it has answered, this submission must not commit (http/deadline.ts). */
  gate: CommitGate | undefined;
}

const RETRYABLE_TX_ERRORS = new Set(['40P01', '40001']); // deadlock, serialization failure
const TX_ATTEMPTS = 3;

/** A transaction that surely did not commit (so its submissions may be retried); wraps the cause. */
class NotCommitted extends Error {
  override readonly cause: unknown;
  constructor(cause: unknown) {
    super(cause instanceof Error ? cause.message : String(cause));
    this.cause = cause;
  }
}

/**
 * What readTenants reads for a group's tenants: the current quota period's credits only for a
 * tenant whose policy refuses on them (FAIL, tenantRefusal); the others' ledger is not read. Pure.
 */
function tenantReads(subs: readonly Submission[], now: Date): Array<{ id: string; periodStart: Date | null }> {
  return subs.map((s) => ({ id: s.tenant.id, periodStart: s.tenant.quotaPolicy === 'FAIL' ? quotaPeriod(s.tenant.periodAnchor, now).start : null }));
}

/** What a committed group decided for one submission: its answer, or the refusal to turn into an error. */
type Outcome = SubmissionPlan<NewJob> | SluiceError;

/**
 * How long a refusal's drain-rate reads (windows, busy weights, the tenant's scheduler row) are
 * reused for the next refusals' Retry-After: an estimate either way, and under pressure thousands
 * of refusals a second would otherwise each read them (the busy weights are O(tenants)).
 */
const RATE_READ_TTL_MS = 1_000;

export class JobService {
  private readonly deps: JobServiceDeps;
  private readonly group: GroupCommit<Submission, Outcome> | null;
  /** The edge: concurrent screens share one lock-free read round (no transaction, no gate). */
  private readonly edge: GroupCommit<Submission, Outcome | null>;
  private readonly pressure: Pressure;
  private readonly rateReads = new Map<string, { at: number; value: Promise<unknown> }>();
  constructor(deps: JobServiceDeps) {
    this.deps = deps;
    const gc = deps.groupCommit ?? { windowMs: 2, maxItems: 200 };
    this.group =
      gc.maxItems > 1
        ? new GroupCommit((subs) => this.commit(subs), { ...gc, onGroup: deps.onGroupCommitted, splittable: (err) => err instanceof NotCommitted })
        : null;
    this.edge = new GroupCommit((subs) => this.screen(subs), { windowMs: gc.windowMs, maxItems: Math.max(gc.maxItems, 200) });
    this.pressure = new Pressure(deps.pressureHoldMs ?? 2_000);
  }

  async submit(tenant: TenantRecord, inputs: readonly JobInput[], opts: { bulk?: boolean; gate?: CommitGate } = {}): Promise<SubmittedJob[]> {
    const valid = validateSubmission(inputs, this.deps.catalog, this.deps.maxJobsPerSubmission, this.deps.paramLimits, {
      now: new Date(),
      maxAheadSeconds: this.deps.runAtMaxSeconds ?? DEFAULT_SCHEDULE_MAX_AHEAD_SECONDS,
    });
    const ids = newJobIds(valid.length);
    // Traced (tracing on): one submit span for the submission, under the request's span (whose
    // parent is the client's traceparent, if it sent one); its traceparent is stored with every job.
    const span = tracing.on ? startSpan('sluice.submit', { attributes: { 'sluice.tenant.id': tenant.id, 'sluice.job.count': valid.length, 'sluice.job.api': valid.length === 1 ? valid[0]!.api : undefined } }) : null;
    const traceParent = span ? traceparentOf(span) : null;
    const sub: Submission = { tenant, jobs: valid.map((j, i) => ({ ...j, id: ids[i]!, ...(traceParent ? { traceParent } : {}) })), bulk: opts.bulk ?? inputs.length > 1, gate: opts.gate };
    if (!span) return this.submitValid(sub);
    try {
      const jobs = await this.submitValid(sub);
      endSpan(span, { attributes: valid.length === 1 ? { 'sluice.job.id': jobs[0]?.id, 'sluice.job.priority': valid[0]!.priority } : {} });
      return jobs;
    } catch (err) {
      endSpan(span, { error: err instanceof SluiceError ? err.code : 'exception' });
      throw err;
    }
  }

  private async submitValid(sub: Submission): Promise<SubmittedJob[]> {
    // Under pressure, a submission that surely cannot fit is refused at the edge, without the
    // gate: the gate then serves only submissions that could fit (screen).
    if (this.pressure.applies(sub.tenant.id, Date.now())) {
      const refused = await this.edge.submit(sub);
      if (refused) return this.answer(sub, refused);
    }
    let outcome: Outcome;
    for (let attempt = 1; ; attempt++) {
      try {
        if (sub.jobs.length === 1 && this.group) {
          outcome = await this.group.submit(sub);
        } else if (reservesRoom(sub.jobs, this.deps.bulkReserveMin ?? BULK_RESERVE_MIN)) {
          outcome = await this.submitBulk(sub);
        } else {
          const [result] = await this.commit([sub]);
          outcome = (result as { value: Outcome }).value;
        }
        break;
      } catch (err) {
        const cause = err instanceof NotCommitted ? err.cause : err;
        // Rolled back because a concurrent writer stored one of our keys first: decide again. Lost
        // every time: a coded, retryable answer (a resubmission replays what the others stored).
        if (cause instanceof KeyRace) {
          if (attempt < KEY_RACE_ATTEMPTS) continue;
          throw databaseUnavailable('other submissions kept storing the same idempotency keys first; nothing of this one was stored: submit it again');
        }
        throw cause;
      }
    }
    // After the group is answered, off its critical path: the next group need not wait for Retry-After estimates.
    return this.answer(sub, outcome);
  }

  /** One transaction for a group of submissions; one outcome per submission. */
  private async commit(subs: readonly Submission[]): Promise<Array<ItemResult<Outcome>>> {
    const outcomes = await this.inTransaction((tx) => this.decideAndWrite(tx, subs));
    return outcomes.map((value) => ({ ok: true, value }));
  }

  /**
   * A transaction, retried on deadlock or serialization failure (up to 3
   * times). A failure that surely did not commit is a NotCommitted (its
   * submissions may be retried one by one); a lost connection at COMMIT may
   * hide a commit and is thrown as is.
   */
  private async inTransaction<T>(fn: (tx: postgres.TransactionSql) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      let beforeCommit = false;
      try {
        return (await this.deps.sql.begin(async (tx) => {
          try {
            return await fn(tx);
          } catch (err) {
            beforeCommit = true; // thrown before COMMIT was sent: rolled back
            throw err;
          }
        })) as T;
      } catch (err) {
        const code = (err as { code?: string }).code;
        if (attempt < TX_ATTEMPTS && code && RETRYABLE_TX_ERRORS.has(code)) continue;
        // The server's own error (even at COMMIT) means it rolled back; a lost connection at COMMIT may hide a commit.
        throw beforeCommit || err instanceof postgres.PostgresError ? new NotCommitted(err) : err;
      }
    }
  }

  /** The answer to one submission, or its refusal as the client sees it. */
  private async answer(sub: Submission, plan: Outcome): Promise<SubmittedJob[]> {
    if (plan instanceof SluiceError) throw plan;
    if (plan.kind === 'accept') return plan.answers as SubmittedJob[];
    if (plan.kind === 'conflict') {
      const where = sub.bulk ? `jobs[${plan.index}]: ` : '';
      throw new SluiceError(
        'IDEMPOTENCY_CONFLICT',
        `${where}idempotencyKey "${plan.key}" was already used for job ${plan.originalId} with a different api or params`,
        { jobId: plan.originalId, idempotencyKey: plan.key, ...(sub.bulk ? { index: plan.index } : {}) },
        409,
      );
    }
    throw await this.refusalError(sub, plan.refusal);
  }

  /**
   * The whole group in one transaction: the gate, the decision, the writes.
   * The gate is held until commit, so inserting 10,000 jobs here would hold
   * every other admission for as long: large submissions take `submitBulk`
   * instead.
   */
  private async decideAndWrite(tx: postgres.TransactionSql, subs: readonly Submission[]): Promise<Outcome[]> {
    const { out, accepted } = await this.decide(tx, subs);
    if (accepted.length > 0) await this.write(tx, accepted, [addAdmitted(tx, perClass(accepted))]);
    this.enterCommit(subs, out);
    return out;
  }

  /**
   * Under the gate (taken here, held until commit): every submission's
   * outcome, in order, and the job rows the accepted ones write. Reads the
   * gate, the tenants (one statement for the group) and, for keyed jobs, the original jobs
   * of their keys; writes nothing.
   */
  private async decide(tx: postgres.TransactionSql, subs: readonly Submission[]): Promise<{ out: Outcome[]; accepted: NewJobRow[] }> {
    const now = new Date();
    // Lock order: the gate, then the inserts (admission/store.ts).
    // The three reads are pipelined: one round trip under the gate, not three. Postgres still runs
    // them in order, each with its own snapshot taken when it starts, so the reads see everything
    // the previous gate holder committed (a read folded into the locking statement would not).
    // While the global bound refuses, the gate's estimate (which only drifts upward) is over the
    // bound at every group, and each would reconcile before deciding: a fourth round trip under the
    // gate, paid by the accepts. Then the exact count is sent with the lock, in the same round trip
    // (after it, so it counts what the previous holder committed).
    const exactFirst = this.pressure.globalFull(now.getTime());
    const keyed = keysOf(subs);
    const [gate, exact, tenants, originals] = await Promise.all([
      lockGate(tx),
      exactFirst ? reconcileGate(tx) : null,
      readTenants(tx, tenantReads(subs, now)),
      originalsByIdempotencyKey(tx, keyed),
    ]);

    // Refusals that do not depend on the queues: one place for the tenant's own state.
    const early = subs.map((s) => this.tenantRefusal(s, tenants.get(s.tenant.id), now));
    const open = subs.map((s, i) => ({ s, i })).filter(({ i }) => early[i] === null);
    const plan = (globalDepth: number) => planGroup(this.planInput(open.map(({ s }) => s), tenants, originals, globalDepth));
    let plans = plan(sumClasses(exact ?? gate));
    const refusedGlobally = plans.some((p) => p.kind === 'refuse' && p.refusal.scope === 'GLOBAL' && p.refusal.retryable);
    if (refusedGlobally && !exact) {
      // The gate's estimate only drifts upward (dispatch does not lower it): count exactly before
      // refusing. O(queues), once per refusing group; on the accepting path only under pressure (above).
      plans = plan(sumClasses(await reconcileGate(tx)));
    }

    const accepted = plans.flatMap((p, k) => (p.kind === 'accept' ? p.insert.map((j) => ({ ...j, tenantId: open[k]!.s.tenant.id, state: 'QUEUED' as const })) : []));
    const out: Outcome[] = early.map((e) => e ?? (null as never));
    open.forEach(({ i }, k) => (out[i] = plans[k]!));
    return { out, accepted };
  }

  /** What planGroup and edgeRefusals decide on: the submissions and the depths read for them. */
  private planInput(subs: readonly Submission[], tenants: ReadonlyMap<string, TenantAdmissionState>, originals: ReadonlyMap<string, KnownJob>, globalDepth: number): PlanInput<NewJob> {
    const { admission } = this.deps;
    return {
      subs: subs.map((s) => ({ tenantId: s.tenant.id, tenantBound: effectiveLimits(s.tenant).queueBound, jobs: s.jobs })),
      originals,
      tenantDepth: new Map([...tenants].map(([id, t]) => [id, t.depth])),
      newState: (id) => visibleJobState('QUEUED', tenants.get(id)?.quotaBlocked ?? false) as 'QUEUED' | 'WAITING_QUOTA',
      globalDepth,
      globalBound: admission.globalBound,
      classShare: admission.classShare,
    };
  }

  /**
   * The edge, for submissions arriving under pressure: one round of lock-free reads for the
   * whole screen group, outside any transaction (the group's tenants, their keys' originals and,
   * while the global bound refuses, the exact waiting jobs per class), then each submission judged
   * alone (edgeRefusals). A submission that surely cannot fit, or that its tenant's state refuses,
   * gets its refusal here (null: on to the gate). Nothing is locked or written, so refusals never
   * queue behind the gate and cost the gate nothing; what could fit is decided exactly under it.
   */
  private async screen(subs: readonly Submission[]): Promise<Array<ItemResult<Outcome | null>>> {
    const { sql } = this.deps;
    const now = new Date();
    const keyed = keysOf(subs);
    const [tenants, originals, waiting] = await Promise.all([
      readTenants(sql, tenantReads(subs, now)),
      originalsByIdempotencyKey(sql, keyed),
      this.pressure.globalFull(now.getTime()) ? countWaiting(sql) : null,
    ]);
    // Without the global count (only tenants refuse), a global depth of 0: the global bound then
    // refuses only what can never fit, whatever the depth.
    const refusals = edgeRefusals(this.planInput(subs, tenants, originals, waiting ? sumClasses(waiting) : 0));
    return subs.map((s, i): ItemResult<Outcome | null> => {
      const early = this.tenantRefusal(s, tenants.get(s.tenant.id), now);
      const refusal = refusals[i];
      return { ok: true, value: early ?? (refusal ? { kind: 'refuse', refusal } : null) };
    });
  }

  /**
   * Set-based writes of accepted jobs: jobs rows, pg-boss rows, ready marks,
   * one work notice, awaited with `also`: statements the caller has already
   * sent (the gate's counts, a reservation's claim), so they run first.
   * Pipelined: one round trip for all of them. Postgres runs them in the order
   * sent (postgres.js sends a query when it is first awaited: array order
   * here); if one fails, the rest fail with it and the transaction rolls back.
   */
  private async write(tx: postgres.TransactionSql, accepted: readonly NewJobRow[], also: ReadonlyArray<Promise<unknown>> = []): Promise<void> {
    const queues = new Map(accepted.map((j) => [`${j.tenantId}:${j.priority}`, { tenantId: j.tenantId, jobClass: j.priority }]));
    const [stored] = await Promise.all([
      insertJobsQueued(tx, accepted),
      markManyQueuesReady(tx, [...queues.values()]),
      tx`select pg_notify(${WORK_CHANNEL}, ${workPayload(accepted.map((j) => j.tenantId))})`,
      ...also,
    ]);
    // A skipped row: a concurrent writer (a keyed bulk writes outside the gate) stored one of these
    // keys after the decision. Rolled back; the submission is decided again (submit).
    if (stored.jobs !== accepted.length) throw new KeyRace(`stored ${stored.jobs} of ${accepted.length} jobs: an idempotency key was stored meanwhile`);
    if (stored.queued !== accepted.length) throw new Error(`pg-boss insert stored ${stored.queued} of ${accepted.length} jobs (a queue is missing or an id repeats)`);
  }

  /**
   * Last thing before COMMIT: a submission whose request has already been answered (the deadline's
   * 503) must not be stored. Rolling back splits a group, so only that submission fails.
   */
  private enterCommit(subs: readonly Submission[], out: readonly Outcome[]): void {
    for (let k = 0; k < subs.length; k++) {
      const o = out[k];
      if (o && !(o instanceof SluiceError) && o.kind === 'accept' && subs[k]!.gate && !subs[k]!.gate!.enterCommit()) {
        throw databaseUnavailable('the submission outlived the request deadline and was not stored');
      }
    }
  }

  /**
   * A large submitJobs without holding the gate while it writes:
   *  1. a short transaction under the gate decides it (same rules, same
   *     plan) and, if admitted, adds its jobs to the gate's counts and reserves
   *     the room (admission_reservations), then commits: other admissions go on;
   *  2. a second transaction claims the reservation (deleting it: from now on
   *     the room is held by the jobs themselves, atomically) and writes the
   *     jobs set-based, then commits. Whole or nothing: if the reservation is
   *     gone (reclaimed after expiry) or anything fails, nothing is written and
   *     the room is given back (here, or by the sweeper once it expires).
   * Bounds stay exact: a reservation counts against the tenant and global
   * bounds from its gate transaction until its jobs replace it.
   */
  private async submitBulk(sub: Submission): Promise<Outcome> {
    const reservation = randomUUID();
    const decided = await this.inTransaction(async (tx) => {
      const { out, accepted } = await this.decide(tx, [sub]);
      if (accepted.length > 0) {
        await Promise.all([addAdmitted(tx, perClass(accepted)), reserveRoom(tx, reservation, roomOf(accepted), this.deps.reservationSeconds ?? 30)]);
      }
      return { outcome: out[0]!, accepted };
    });
    if (decided.accepted.length === 0) return decided.outcome;
    try {
      await this.inTransaction(async (tx) => {
        // The claim goes first in the pipeline: its rows are locked before anything is written.
        let held = 0;
        await this.write(tx, decided.accepted, [claimRoom(tx, reservation).then((n) => void (held = n))]);
        if (held !== decided.accepted.length) {
          // Reclaimed after expiry: its room was given back, so these jobs must not be stored (rolled back).
          throw databaseUnavailable('the submission took too long between admission and storage and was not stored: submit it again');
        }
        this.enterCommit([sub], [decided.outcome]);
      });
    } catch (err) {
      // Give the room back now rather than at expiry (harmless if the insert did commit: nothing left to delete).
      await claimRoom(this.deps.sql, reservation).catch(() => {});
      throw err;
    }
    return decided.outcome;
  }

  /**
   * Refusals from the tenant's own state, before its queues are looked at.
   * The single place for tenant-state checks at the front door (a suspended
   * tenant belongs here). `state` is the tenant's row as read under the gate.
   */
  private tenantRefusal(sub: Submission, state: TenantAdmissionState | undefined, now: Date): SluiceError | null {
    const { tenant } = sub;
    if (state?.suspended || tenant.suspendedAt) {
      return new SluiceError('TENANT_SUSPENDED', 'your tenant is suspended: submissions are refused until an operator resumes it', {}, 403);
    }
    if (tenant.quotaPolicy !== 'FAIL') return null;
    const limits = effectiveLimits(tenant);
    const period = quotaPeriod(tenant.periodAnchor, now);
    const cheapest = Math.min(...sub.jobs.map((j) => this.deps.catalog.get(j.api)?.creditCost ?? 1));
    const remaining = limits.monthlyQuota - (state?.creditsUsed ?? 0);
    if (remaining >= cheapest) return null;
    return new SluiceError('QUOTA_EXCEEDED', `your monthly credit quota is spent (${remaining} of ${limits.monthlyQuota} left until ${period.end.toISOString()})`, {
      quota: limits.monthlyQuota,
      creditsRemaining: Math.max(0, remaining),
      periodEnd: period.end.toISOString(),
    });
  }

  /**
   * A refusal as the client sees it. Retryable: 429 with Retry-After from how
   * long the excess takes to drain (drain rates are read only here, when
   * refusing). Never fits: 413, `retryable: false`, no Retry-After.
   */
  private async refusalError(sub: Submission, r: Refusal): Promise<SluiceError> {
    this.deps.onRefused?.(r.code, r.jobClass);
    const ext = { scope: r.scope, retryable: r.retryable, ...(r.jobClass ? { priority: r.jobClass } : {}) };
    if (!r.retryable) return withoutStack(() => new SluiceError('QUEUE_FULL', r.message, ext, 413));
    this.pressure.note(r.scope, sub.tenant.id, Date.now());
    const classes = [...new Set(sub.jobs.map((j) => j.priority))].sort();
    const rates = await this.refusalRates(sub.tenant, classes);
    const seconds = retryAfterSeconds(r.excess, r.scope === 'TENANT' ? rates.tenant : rates.global);
    return withoutStack(() => new SluiceError('QUEUE_FULL', r.message, { ...ext, retryAfterSeconds: seconds }, 429, { 'Retry-After': String(seconds) }));
  }

  /** Drain rates (jobs/s) for Retry-After: the tenant's fair share of its classes' pace, and the whole pace. */
  async drainRates(sql: Sql | postgres.TransactionSql, tenant: TenantRecord, classes: readonly JobClass[]): Promise<{ tenant: number; global: number }> {
    // Independent reads, side by side: a refusal's answer waits for them.
    const [windows, state, busy] = await Promise.all([readWindows(sql), tenantSchedState(sql, tenant.id), busyWeights(sql, classes)]);
    return this.drainRatesFrom(tenant, classes, { windows, state, busy });
  }

  /** drainRates for a refusal's Retry-After, from reads reused for RATE_READ_TTL_MS. */
  private async refusalRates(tenant: TenantRecord, classes: readonly JobClass[]): Promise<{ tenant: number; global: number }> {
    const { sql } = this.deps;
    const [windows, state, busy] = await Promise.all([
      this.reused('windows', () => readWindows(sql)),
      this.reused(`tenant:${tenant.id}`, () => tenantSchedState(sql, tenant.id)),
      this.reused(`busy:${classes.join(',')}`, () => busyWeights(sql, classes)),
    ]);
    return this.drainRatesFrom(tenant, classes, { windows, state, busy });
  }

  /** A read shared by every caller within RATE_READ_TTL_MS of it (a failed one is not kept). */
  private reused<T>(key: string, read: () => Promise<T>): Promise<T> {
    const now = Date.now();
    const hit = this.rateReads.get(key);
    if (hit && now - hit.at < RATE_READ_TTL_MS) return hit.value as Promise<T>;
    // Bounded by the tenants refused within the TTL: expired entries go once the map grows.
    if (this.rateReads.size > 10_000) for (const [k, v] of this.rateReads) if (now - v.at >= RATE_READ_TTL_MS) this.rateReads.delete(k);
    const value = read();
    value.catch(() => this.rateReads.delete(key));
    this.rateReads.set(key, { at: now, value });
    return value;
  }

  /** drainRates from reads the caller already made (the queue status reads windows and the scheduler row once for every class). */
  drainRatesFrom(
    tenant: TenantRecord,
    classes: readonly JobClass[],
    r: { windows: Awaited<ReturnType<typeof readWindows>>; state: Awaited<ReturnType<typeof tenantSchedState>>; busy: number },
  ): { tenant: number; global: number } {
    const { windows, state, busy } = r;
    const rateOf = (name: string) => {
      const spec = this.deps.admission.windows.find((w) => w.name === name);
      const row = windows.find((w) => w.name === name);
      const latency = Math.max(0.001, (row?.latencyP50Ms ?? 1000) / 1000);
      // An unlimited window drains at its pool's pace: pool / latency (Little's law).
      return spec?.pacedPerMinute != null ? spec.pacedPerMinute / 60 : (row?.poolSize ?? 1) / latency;
    };
    const global = this.deps.admission.windows.reduce((s, w) => s + rateOf(w.name), 0);
    const mine = this.deps.admission.windows.filter((w) => w.classes.some((c) => classes.includes(c)));
    const paced = mine.reduce((s, w) => s + rateOf(w.name), 0);
    const latency = Math.max(0.001, (windows.find((w) => mine.some((m) => m.name === w.name))?.latencyP50Ms ?? 1000) / 1000);
    const limits = effectiveLimits(tenant);
    return {
      tenant: tenantDrainRate({ pacedPerSecond: paced, weight: limits.weight, busyWeights: busy, cap: state?.cap ?? limits.concurrencyCap, latencySeconds: latency }),
      global,
    };
  }

  /**
   * Submits a FAILED or CANCELLED job again as a new job of its tenant, with
   * its api, params, class and fairness key (no idempotency key: the original keeps its
   * own), linked back through `retry_of`. The new job goes through admission
   * like any submission (bounds, quota, suspension).
   */
  async retry(tenant: TenantRecord, original: JobRow, opts: { gate?: CommitGate } = {}): Promise<SubmittedJob> {
    const refusal = retryRefusal(original);
    if (refusal) throw refusal;
    const [job] = await this.submit(tenant, [{ api: original.api, params: original.params, priority: original.priority, fairnessKey: original.fairnessKey ?? null, retryOf: original.id }], { bulk: false, gate: opts.gate });
    return job!;
  }

  /** Cancels a queued job of the calling tenant. */
  async cancel(tenantId: string, jobId: string) {
    const { sql, boss } = this.deps;
    const cancelled = await sql.begin(async (tx) => {
      const priority = await jobClassOf(tx, tenantId, jobId);
      if (!priority) return false;
      // The lock order (docs/ARCHITECTURE.md), the one a lease follows: the tenant's row, then the
      // pg-boss job, then our job row (whose depth trigger locks sched_queues).
      await lockTenants(tx, [tenantId]);
      await lockBossJob(tx, queueName(tenantId, priority), jobId);
      const jobClass = await cancelQueuedJob(tx, tenantId, jobId);
      if (!jobClass) return false;
      await boss.cancel(queueName(tenantId, jobClass), jobId, { db: inTransaction(tx) });
      await publishJobEvents(tx, [{ jobId, tenantId, state: 'CANCELLED' }]);
      return true;
    });
    const job = await getJob(sql, tenantId, jobId);
    if (!job) throw new SluiceError('NOT_FOUND', `no job with id ${jobId}`);
    if (!cancelled) throw new SluiceError('NOT_CANCELLABLE', `job ${jobId} is ${job.state}; only QUEUED or WAITING_QUOTA jobs can be cancelled`, { state: job.state });
    return job;
  }

  /**
   * Cancels the tenant's waiting jobs matching `filter`, the oldest `limit` of them, in one
   * transaction (cancel's lock order: the tenant's row, the pg-boss jobs, our rows). Returns how
   * many were cancelled and whether matching waiting jobs remain (call again for the rest).
   */
  async cancelMany(tenantId: string, filter: JobFilter, limit: number): Promise<{ cancelled: number; more: boolean }> {
    const { sql, boss } = this.deps;
    const cancelled = await sql.begin(async (tx) => {
      await lockTenants(tx, [tenantId]);
      const picked = await waitingJobsMatching(tx, tenantId, filter, limit);
      if (picked.length === 0) return 0;
      await lockBossJobs(tx, [...new Set(picked.map((j) => queueName(tenantId, j.priority)))], picked.map((j) => j.id));
      const done = await cancelQueuedJobs(tx, tenantId, picked.map((j) => j.id));
      const byClass = new Map<JobClass, string[]>();
      for (const j of done) byClass.set(j.priority, [...(byClass.get(j.priority) ?? []), j.id]);
      for (const [jobClass, ids] of byClass) await boss.cancel(queueName(tenantId, jobClass), ids, { db: inTransaction(tx) });
      await publishJobEvents(tx, done.map((j) => ({ jobId: j.id, tenantId, state: 'CANCELLED' })));
      return done.length;
    });
    const more = (await waitingJobsMatching(sql, tenantId, filter, 1)).length > 0;
    return { cancelled, more };
  }
}
