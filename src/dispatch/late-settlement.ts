/**
 * A settlement that arrives after its reservation was already settled by
 * lease expiry (the sweeper's `node_lost` or `never_sent`) is RECONCILED,
 * never silently dropped and never billed twice.
 *
 * How it happens: the call was answered, but its settlement could not land
 * (a database outage, a partition) until after the attempt lease expired and
 * a sweeper settled the reservation by the timeout rule and put the job back.
 * The late settlement knows what the provider actually did; the expiry only
 * guessed.
 *
 * The rules (`planLateSettlement`, pure; docs/ARCHITECTURE.md "Late
 * settlements"):
 * 1. Only an expiry's settlement, once. A reservation settled by anything
 *    else was settled by this very settlement (a retry after a commit whose
 *    acknowledgement was lost): nothing to do. `reconciled_at` fences a
 *    second reconciliation.
 * 2. The bill becomes what the provider billed when the late outcome KNOWS it
 *    (an answer, or a request never written): the ledger, the reservation,
 *    the job's creditsBilled and the usage history move by the same
 *    difference. A late outcome without an answer (a timeout after sending)
 *    knows no more than the expiry did: the expiry's bill stands, unless the
 *    expiry refunded it as never sent, which the node's sending disproves.
 * 3. The job is finished with the late result instead of calling the
 *    provider again only when the outcome ends a job by its nature (a
 *    success, or an answer no retry can change: reaction `complete` or
 *    `fail`) and the job still waits where the expiry put it (QUEUED or
 *    WAITING_QUOTA, on the same attempt: not leased again). Its waiting
 *    pg-boss job is deleted in the same transaction. Otherwise (leased again,
 *    finished, cancelled, or an outcome that would retry anyway) the job is
 *    left as it is and only the bill is corrected.
 */
import type { Logger } from 'pino';
import type { Sql } from '../db/client.ts';
import { publishJobEvents, type JobEvent } from '../events/bus.ts';
import { addJobCredits, finishWaitingJob, jobStateOf, type JobState } from '../jobs/store.ts';
import { reactionTo } from '../provider/classify.ts';
import type { CallOutcome } from '../provider/types.ts';
import { deleteWaitingBossJob, lockBossJob } from '../queue/boss.ts';
import { correctLedger } from '../scheduler/sql/ledger.ts';
import { lockSettledReservations, reconcileReservation } from '../scheduler/sql/reservations.ts';
import { lockTenants } from '../scheduler/sql/tenants.ts';
import { addUsageCorrection } from '../usage/store.ts';
import { resultOf } from './retry.ts';

/** The expiry's settlement of the reservation, as the sweeper wrote it. */
export interface ExpiredSettlement {
  outcome: string;
  billed: number;
  credits: number;
  reconciled: boolean;
}

export interface LateOutcome {
  attempt: number;
  /** The bill this settlement would have made (billedCredits of its outcome). */
  billed: number;
  /** The bill is the timeout rule's guess (no answer to a sent request). */
  billedIsGuess: boolean;
  /** reactionTo(outcome): complete and fail end a job by the outcome's nature. */
  reaction: ReturnType<typeof reactionTo>;
}

export type LatePlan =
  | { action: 'none'; why: 'settled by this settlement' | 'reconciled already' }
  | { action: 'reconcile'; billed: number; billedDelta: number; finish: 'SUCCEEDED' | 'FAILED' | null };

/** The outcomes the sweeper writes (scheduler/ledger.ts expirySettlement). */
export const EXPIRY_OUTCOMES: readonly string[] = ['node_lost', 'never_sent'];

/** What to do with a settlement that found its reservation settled (rules in the header). */
export function planLateSettlement(expiry: ExpiredSettlement, job: { state: JobState; attempts: number } | null, late: LateOutcome): LatePlan {
  if (!EXPIRY_OUTCOMES.includes(expiry.outcome)) return { action: 'none', why: 'settled by this settlement' };
  if (expiry.reconciled) return { action: 'none', why: 'reconciled already' };
  const known = !late.billedIsGuess || expiry.outcome === 'never_sent';
  const billed = known ? Math.min(expiry.credits, Math.max(0, late.billed)) : expiry.billed;
  const waiting = job !== null && (job.state === 'QUEUED' || job.state === 'WAITING_QUOTA') && job.attempts === late.attempt;
  const final = late.reaction === 'complete' ? 'SUCCEEDED' : late.reaction === 'fail' ? 'FAILED' : null;
  return { action: 'reconcile', billed, billedDelta: billed - expiry.billed, finish: waiting ? final : null };
}

/** One settlement that found its reservation settled already. */
export interface LateItem {
  reservationId: string;
  jobId: string;
  tenantId: string;
  queue: string;
  attempt: number;
  outcome: CallOutcome;
  billed: number;
}

/**
 * Reconciles late settlements in one transaction. Lock order: reservations
 * (id order), the jobs' rows (job id order: the bill), tenants (id
 * order), then per tenant and job its waiting pg-boss row and its jobs row,
 * the result, the ledger. Returns how many it reconciled.
 */
export async function reconcileLateSettlements(sql: Sql, items: readonly LateItem[], log: Logger): Promise<number> {
  if (items.length === 0) return 0;
  return sql.begin(async (tx) => {
    const expired = await lockSettledReservations(tx, items.map((x) => x.reservationId));
    const todo = items.flatMap((x) => {
      const r = expired.get(x.reservationId);
      // Gone: deleted with its tenant, or by retention. Nothing is left to correct; say so.
      if (!r) log.warn({ jobId: x.jobId, reservationId: x.reservationId, late: { kind: x.outcome.kind, billed: x.billed } }, `late settlement of job ${x.jobId} found no reservation: nothing corrected`);
      return r ? [{ x, r }] : [];
    });
    if (todo.length === 0) return 0;
    const lateOf = (x: LateItem): LateOutcome => ({ attempt: x.attempt, billed: x.billed, billedIsGuess: x.outcome.billedIsGuess === true, reaction: reactionTo(x.outcome) });
    // The jobs' bills first, in job id order, under the reservations' locks and before the tenants'
    // rows, as a settlement group takes them (a job leased again may be settling right now: its
    // group holds the job's row, then waits for the tenant). The bill does not depend on
    // the job's state.
    todo.sort((a, b) => (a.x.jobId < b.x.jobId ? -1 : a.x.jobId > b.x.jobId ? 1 : 0));
    for (const { x, r } of todo) {
      const bill = planLateSettlement(r, null, lateOf(x));
      if (bill.action === 'reconcile' && bill.billedDelta !== 0) await addJobCredits(tx, x.jobId, bill.billedDelta);
    }
    await lockTenants(tx, todo.map(({ x }) => x.tenantId));
    // Then per tenant (id order), its jobs in id order: waiting jobs, the ledger, history.
    todo.sort((a, b) => (a.x.tenantId < b.x.tenantId ? -1 : a.x.tenantId > b.x.tenantId ? 1 : 0));
    const events: JobEvent[] = [];
    let reconciled = 0;
    for (const { x, r } of todo) {
      const job = await jobStateOf(tx, x.jobId);
      const plan = planLateSettlement(r, job, lateOf(x));
      if (plan.action === 'none') {
        log.debug({ jobId: x.jobId, reservationId: x.reservationId, why: plan.why }, 'settlement found its reservation settled: nothing to reconcile');
        continue;
      }
      let finished = false;
      if (plan.finish) {
        await lockBossJob(tx, x.queue, x.jobId);
        finished = await finishWaitingJob(tx, x.jobId, x.attempt, plan.finish, resultOf(x.outcome));
        if (finished) {
          await deleteWaitingBossJob(tx, x.queue, x.jobId);
          events.push({ jobId: x.jobId, tenantId: x.tenantId, state: plan.finish });
        }
      }
      await reconcileReservation(tx, x.reservationId, plan.billed);
      if (plan.billedDelta !== 0) {
        await correctLedger(tx, x.tenantId, r.periodStart, plan.billedDelta);
        await addUsageCorrection(tx, {
          tenantId: x.tenantId,
          periodStart: r.periodStart,
          api: r.api,
          jobClass: r.jobClass,
          billedDelta: plan.billedDelta,
          // The expiry counted a failed call; a late success turns it into a succeeded one.
          succeededDelta: x.outcome.kind === 'billed' ? 1 : 0,
        });
      }
      reconciled++;
      log.warn(
        {
          jobId: x.jobId,
          reservationId: x.reservationId,
          expiry: { outcome: r.outcome, billed: r.billed },
          late: { kind: x.outcome.kind, billed: x.billed, guess: x.outcome.billedIsGuess === true },
          billedDelta: plan.billedDelta,
          finished: finished ? plan.finish : null,
        },
        `late settlement of job ${x.jobId} reconciled after its lease expired`,
      );
    }
    await publishJobEvents(tx, events);
    return reconciled;
  });
}
