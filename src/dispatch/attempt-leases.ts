/**
 * The attempt leases of one process: its open attempts (called or settling),
 * their leases refreshed on a timer of their own (on a connection of their
 * own), each attempt's local deadline, the abort of a call whose lease could
 * not be refreshed in time or was taken by the sweeper, and the "sent" mark.
 *
 * Liveness has ONE authority: the attempt lease. Every reservation carries a
 * lease (reservations.lease_expires_at) that this process refreshes while the
 * attempt is open. The sweeper settles only expired leases; pg-boss's job
 * heartbeat is off. The "sent" mark makes a call's lease outlast the call's
 * own timeout, and a call whose lease this process could not refresh in time
 * is aborted before the lease can expire, so a second call is never made
 * while the first can still be in flight, and an outage (of Postgres, or of
 * this node's way to it) never cuts a call short: its outcome is kept until
 * it can be settled. The pure rules (how long a sent call's lease lasts,
 * deadlines, when a lease counts as lost) are in liveness.ts.
 */
import type { Logger } from 'pino';
import type { Sql } from '../db/client.ts';
import type { JobClass } from '../config/classes.ts';
import { markSent as markReservationsSent, refreshLeases } from '../scheduler/sql/reservations.ts';
import type { AttemptTrace, QueuedTrace } from '../tracing/job-trace.ts';
import { leaseDeadline, leaseLost, refreshDue, refreshedDeadline, sentLeaseMs } from './liveness.ts';

/** A leased job's pg-boss data; a traced job's also carries its trace (tracing/job-trace.ts). */
export interface JobData extends Partial<QueuedTrace> {
  tenantId: string;
  api: string;
  params: Record<string, unknown>;
}

/** One dispatched attempt: the fetched pg-boss job, its attempt number and its reservation. */
export interface Attempt {
  queue: string;
  jobClass: JobClass;
  job: { id: string; data: JobData };
  attempt: number;
  reservationId: string;
  credits: number;
  /**
   * Monotonic clock (performance.now, ms): the lease is surely live until then (from when the lease
   * returned, then from each refresh's send time; dispatch/liveness.ts).
   */
  deadline: number;
  /** Monotonic clock (performance.now, ms) when its lease returned: how long it holds its pool slot is counted from here. */
  leasedAt: number;
  /** Aborts the call: the lease could not be refreshed in time, or it was superseded. */
  abort: AbortController;
  /** The provider client said the request may have left (CallRequest.onSent): a throw after this may have been billed. */
  sent: boolean;
  /** Its outcome is queued for settlement (or landed): an unexpected throw after this needs no settling. */
  settling: boolean;
  /** A traced job's open lease span (tracing on and the job's data has a traceparent). */
  trace?: AttemptTrace | null;
}

/** One batch call: its distinct items, each with the attempts that share its input (the first is the one sent). */
export interface BatchAttempt {
  api: string;
  items: Array<{ attempts: Attempt[] }>;
}

export interface AttemptLeasesOptions {
  sql: Sql;
  /**
   * The refresh runs here: a connection of its own, so it never queues behind the hot path's
   * statements on `sql` (a refresh that waits there could let a live lease expire). Default `sql`.
   */
  leaseSql?: Sql | undefined;
  leaseSeconds: number;
  /** The provider client's per-call timeout (PROVIDER_TIMEOUT_MS): a sent call's lease outlasts it (liveness.ts sentLeaseMs). */
  callTimeoutMs: number;
  log: Logger;
}

export class AttemptLeases {
  private readonly options: AttemptLeasesOptions;
  /** This process's open attempts by reservation id: their leases are refreshed until they settle. */
  private readonly open = new Map<string, Attempt>();
  private timer: NodeJS.Timeout | null = null;
  private refreshing = false;
  private abandonedToLeases = false;

  constructor(options: AttemptLeasesOptions) {
    this.options = options;
  }

  /** The lease's length in ms. */
  get leaseMs(): number {
    return this.options.leaseSeconds * 1000;
  }

  /** Stopped past its grace: open attempts are left to their leases, nothing more is written. */
  get abandoned(): boolean {
    return this.abandonedToLeases;
  }

  get size(): number {
    return this.open.size;
  }

  has(reservationId: string): boolean {
    return this.open.has(reservationId);
  }

  /** The deadline of leases that returned just now (dispatch/liveness.ts leaseDeadline). */
  deadlineFromNow(): number {
    return leaseDeadline(performance.now(), this.leaseMs);
  }

  /** A leased attempt: its lease is refreshed from now until it is released. */
  add(a: Attempt): void {
    this.open.set(a.reservationId, a);
  }

  /** Its settlement landed (or it is left to its lease): its lease is no longer refreshed. */
  release(reservationId: string): void {
    this.open.delete(reservationId);
  }

  start(): void {
    this.timer = setInterval(() => this.tick(), this.leaseMs / 5);
  }

  stopTimer(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /**
   * Past the stop's grace: what is still open is left to its lease. Says which jobs, and whether
   * their outcome was known (it will be settled by the timeout rule, and the job called again),
   * and aborts their calls. Nothing is refreshed or written after this.
   */
  abandon(): void {
    this.abandonedToLeases = true;
    const open = [...this.open.values()];
    this.options.log.warn(
      { open: open.length, knownOutcomes: open.filter((a) => a.settling).map((a) => a.job.id), callsAborted: open.filter((a) => !a.settling).map((a) => a.job.id) },
      'stop grace over: open attempts are abandoned to their leases (known outcomes not stored)',
    );
    for (const a of open) a.abort.abort();
  }

  /**
   * The lease's own timer. Aborts a call whose lease this process could not
   * refresh for three quarters of its length (well before the database lets
   * the sweeper take it), then refreshes, in one statement, the leases of the
   * open attempts that have used a tenth of theirs (liveness.ts refreshDue).
   * An attempt the refresh does not find open was settled by the sweeper: its
   * call stops and its settlement will change nothing.
   */
  private tick(): void {
    const { sql, leaseSql, leaseSeconds, log } = this.options;
    const now = performance.now();
    for (const a of this.open.values()) if (leaseLost(now, a.deadline, this.leaseMs) && !a.abort.signal.aborted) a.abort.abort();
    if (this.refreshing || this.abandonedToLeases) return;
    const ids = [...this.open.values()].filter((a) => refreshDue(now, a.deadline, this.leaseMs)).map((a) => a.reservationId);
    if (ids.length === 0) return;
    this.refreshing = true;
    const sentAt = performance.now();
    refreshLeases(leaseSql ?? sql, ids, leaseSeconds)
      .then(({ live, settled }) => {
        for (const id of ids) {
          const a = this.open.get(id);
          if (!a) continue;
          if (live.has(id)) a.deadline = refreshedDeadline(a.deadline, sentAt, this.leaseMs);
          else if (settled.has(id)) a.abort.abort();
        }
      })
      .catch((err) => log.warn({ err }, 'attempt lease refresh failed'))
      .finally(() => {
        this.refreshing = false;
      });
  }

  /**
   * The "sent" mark: ONE statement for every reservation a lease returned, before any of their
   * calls is sent. `riders` (a batch's duplicates) are fenced but not marked sent: they never go
   * upstream themselves. Returns the reservations it fenced (both kinds); when the mark itself fails
   * we cannot know whether it committed, so none counts as marked (nothing is sent).
   * The same statement makes every fenced lease outlast the call's own timeout (riders too: their
   * jobs must not be leased again while the call that carries them runs); their local deadlines
   * count from the mark's send, before the database's `now()`.
   */
  async markSent(attempts: readonly Attempt[], riders: readonly Attempt[] = []): Promise<Set<string>> {
    const all = [...attempts, ...riders];
    const sentLease = sentLeaseMs(this.leaseMs, this.options.callTimeoutMs);
    const sentAt = performance.now();
    try {
      const fenced = await markReservationsSent(
        this.options.sql,
        all.map((a) => a.reservationId),
        riders.map((a) => a.reservationId),
        sentLease / 1000,
      );
      for (const a of all) if (fenced.has(a.reservationId)) a.deadline = refreshedDeadline(a.deadline, sentAt, sentLease);
      return fenced;
    } catch (err) {
      this.options.log.warn({ err, attempts: attempts.length + riders.length }, 'could not mark leased attempts sent: none is sent, all are put back');
      return new Set();
    }
  }
}
