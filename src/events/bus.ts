/**
 * Job events travel through Postgres NOTIFY, so a subscriber connected to one
 * process sees jobs finished by another. Each process holds one LISTEN
 * connection and fans events out to its own subscribers in memory.
 *
 * Events are published inside the transaction that changes the job, so they
 * are delivered only if (and when) the change commits.
 *
 * An event of a final state carries the job's row as it commits (read by the
 * statement that sends the NOTIFY, inside the same transaction), so a process
 * delivers it to all its subscribers without reading anything: a read per
 * event per process was what made fan-out slow. A row too big for
 * a NOTIFY payload travels as ids only, and each process then reads it ONCE
 * for all the subscribers the event wakes (`jobOf`).
 *
 * A process that settles a job hears of the commit twice: the settling statement hands back the
 * payloads it sent (sluice_settle_group), and the NOTIFY comes back on the LISTEN connection. It
 * delivers a final event from whichever comes first (`settling` / `settled`: its own copy only once
 * the commit is acknowledged), and drops the other copy, so its subscribers get each event once,
 * without waiting for the NOTIFY's trip through Postgres and the LISTEN connection. Other processes
 * get it by NOTIFY only.
 */
import { endSpan, SpanKind, startSpan, tracing } from '../tracing/tracer.ts';
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import type { JobRow } from '../jobs/store.ts';

export const JOB_EVENTS_CHANNEL = 'sluice_job_events';

export interface JobEvent {
  /** '' for a tenant-wide event (allWaiting). */
  jobId: string;
  tenantId: string;
  state: string;
  /** The committed row, for a final state whose row fits in the payload. */
  job?: JobRow;
  /**
   * A tenant-wide event: every waiting job of the tenant now shows `state`. The lease's quota WAIT
   * sends one (WAITING_QUOTA) instead of one per job: the jobs stay QUEUED and show WAITING_QUOTA
   * while the tenant is blocked (visibleJobState), so the block writes no job and sends one NOTIFY
   * whatever the backlog. A subscriber to one job re-reads it (jobUpdated).
   */
  allWaiting?: true;
}

/**
 * Yielded (to subscribers that ask for it) after the LISTEN connection came
 * back: events committed while it was down were never delivered, so the
 * subscriber re-reads the state it follows and sends what changed.
 */
export const RESYNC = Symbol('resync');
export type BusItem = JobEvent | typeof RESYNC;

/** Returns true when it took the event (a subscriber's buffer got it). */
type Listener = (event: JobEvent | typeof RESYNC) => boolean;

/**
 * One NOTIFY per event (in the order given). A final state's payload is
 * `{jobId, tenantId, state, job}` with the row as it stands in this
 * transaction, i.e. as it commits; when that text would pass the payload
 * limit (a large result or params), just `{jobId, tenantId, state}`.
 */
export async function publishJobEvents(tx: Sql | postgres.TransactionSql, events: readonly JobEvent[]): Promise<void> {
  if (events.length === 0) return;
  const ids = events.map((e) => ({ jobId: e.jobId, tenantId: e.tenantId, state: e.state }));
  // sluice_job_events (drizzle/functions/): the one place the payload is made, so a settlement's
  // events sent from inside its SQL function are the same as these.
  await tx`select sluice_job_events(${JSON.stringify(ids)}::text::jsonb)`;
}

/**
 * A job row from its NOTIFY JSON (see drizzle/functions/sluice_job_json.sql): the same JobRow a read
 * gives, dates back to Date. Null when the JSON is not a job row.
 */
export function jobFromJson(json: unknown): JobRow | null {
  if (typeof json !== 'object' || json === null) return null;
  const j = json as Record<string, unknown>;
  if (typeof j.id !== 'string' || typeof j.tenantId !== 'string' || typeof j.createdAt !== 'string') return null;
  const date = (v: unknown) => (typeof v === 'string' ? new Date(v) : null);
  return {
    id: j.id,
    tenantId: j.tenantId,
    api: j.api as string,
    params: (j.params ?? {}) as Record<string, unknown>,
    priority: j.priority as JobRow['priority'],
    state: j.state as JobRow['state'],
    idempotencyKey: (j.idempotencyKey ?? null) as string | null,
    fairnessKey: (j.fairnessKey ?? null) as string | null,
    attempts: j.attempts as number,
    createdAt: new Date(j.createdAt),
    createdAtMicros: String(j.createdAtMicros),
    ...(typeof j.runAfter === 'string' ? { runAfter: new Date(j.runAfter) } : {}),
    startedAt: date(j.startedAt),
    finishedAt: date(j.finishedAt),
    result: j.result ?? null,
    errorCode: (j.errorCode ?? null) as string | null,
    errorMessage: (j.errorMessage ?? null) as string | null,
    httpStatus: (j.httpStatus ?? null) as number | null,
    creditsBilled: (j.creditsBilled ?? 0) as number,
    // sluice_job_json leaves it out when null (an untraced job's event is no longer for it).
    traceParent: typeof j.traceParent === 'string' ? j.traceParent : null,
  };
}

/** A NOTIFY payload as an event (its row parsed once, for every subscriber); null when it is not one. */
export function eventFromPayload(payload: string): JobEvent | null {
  let raw: { jobId?: unknown; tenantId?: unknown; state?: unknown; job?: unknown; allWaiting?: unknown };
  try {
    raw = JSON.parse(payload) as typeof raw;
  } catch {
    return null;
  }
  if (raw?.allWaiting === true && typeof raw.tenantId === 'string' && typeof raw.state === 'string') return { jobId: '', tenantId: raw.tenantId, state: raw.state, allWaiting: true };
  if (typeof raw?.jobId !== 'string' || typeof raw.tenantId !== 'string' || typeof raw.state !== 'string') return null;
  const event: JobEvent = { jobId: raw.jobId, tenantId: raw.tenantId, state: raw.state };
  const job = raw.job === undefined ? null : jobFromJson(raw.job);
  if (job) event.job = job;
  return event;
}

/** The socket of a graphql-ws subscriber, closed when it falls behind. */
export interface SubscriberSocket {
  close(code: number, reason: string): void;
}

/** Close code for a subscriber whose buffer overflowed (src/events/subscriptions.ts lists the codes). */
export const SLOW_CONSUMER_CLOSE = 4408;

/**
 * How long a copy of this process's own final event waits for its twin (OwnEvents) before it is
 * forgotten: the twin is the NOTIFY of a commit already made, normally a few ms behind. One coming
 * later than this (a LISTEN connection that lagged this long) would be delivered a second time.
 */
export const OWN_EVENT_TTL_MS = 30_000;

/**
 * A final event of this process's own settlement, by job id: `pending` while its statement runs,
 * then which copy was delivered (`notify`: the NOTIFY came first; `own`: the statement's result
 * did), with its payload, until the other copy comes.
 */
interface OwnEvent {
  via: 'pending' | 'notify' | 'own';
  payload: string | null;
  at: number;
}

/** What the settler tells the bus about its own settlements (EventBus implements it). */
export interface OwnEvents {
  /** Before a settling statement: these jobs may get a final event from this process. */
  settling(jobIds: readonly string[]): void;
  /** After it: the payloads it sent, committed (null: it failed, and this process delivers nothing of it). */
  settled(jobIds: readonly string[], payloads: readonly string[] | null): void;
}

export class EventBus implements OwnEvents {
  /** Every subscriber (RESYNC goes to all). */
  private readonly listeners = new Set<Listener>();
  /**
   * Subscribers that named their tenant, by tenant: an event is offered to its tenant's and to the
   * unkeyed ones only, not to every subscriber of the process (a burst of events to many
   * subscribers was events × subscribers filter calls).
   */
  private readonly byTenant = new Map<string, Set<Listener>>();
  private readonly unkeyed = new Set<Listener>();
  private unlisten: (() => Promise<void>) | null = null;
  /** This process's own final events whose other copy may still come (OwnEvent), oldest first. */
  private readonly own = new Map<string, OwnEvent>();
  /**
   * The payloads of own events delivered from the settlement's result, to their job: the NOTIFY
   * copy that comes back is recognised by its text and dropped without being parsed again.
   */
  private readonly ownPayloads = new Map<string, string>();
  /** Final events this process delivered from its own settlement's result, before their NOTIFY (for tests and metrics). */
  ownDelivered = 0;
  /** Copies of an event already delivered, dropped (for tests and metrics). */
  twinsDropped = 0;
  /** Events one subscriber may have waiting (SUBSCRIPTION_BUFFER_MAX); past it the subscriber is closed. */
  readonly maxBuffer: number;
  /** Subscribers closed for being too slow (for metrics and tests). */
  slowConsumersClosed = 0;

  constructor(opts: { maxBuffer?: number } = {}) {
    this.maxBuffer = opts.maxBuffer ?? 1_000;
  }

  /** The row reads of events that came without their row (too big for a NOTIFY), by event. */
  private readonly reads = new WeakMap<JobEvent, Promise<JobRow | null>>();
  /** Rows this process read because they did not fit in the NOTIFY (for tests and metrics). */
  rowReads = 0;

  /**
   * The job row of an event: the one it carries, or else ONE read per event
   * in this process, shared by every subscriber the event woke (they hold the
   * same event object), however late each gets to it. A failed read is
   * forgotten, so the next subscriber tries again.
   */
  jobOf(event: JobEvent, load: () => Promise<JobRow | null>): Promise<JobRow | null> {
    if (event.job) return Promise.resolve(event.job);
    const pending = this.reads.get(event);
    if (pending) return pending;
    this.rowReads++;
    const p = load();
    this.reads.set(event, p);
    p.catch(() => this.reads.delete(event));
    return p;
  }

  /** How many times the LISTEN connection came back after a loss (a Postgres outage). */
  relistens = 0;

  async start(sql: Sql, onRelisten?: () => void): Promise<void> {
    let first = true;
    const { unlisten } = await sql.listen(
      JOB_EVENTS_CHANNEL,
      (payload) => {
        const twinOf = this.ownPayloads.get(payload);
        if (twinOf !== undefined) {
          // Its settlement's result delivered it already.
          this.ownPayloads.delete(payload);
          this.own.delete(twinOf);
          this.twinsDropped++;
          return;
        }
        const event = eventFromPayload(payload);
        if (!event) return;
        // Not a twin of an own delivery (those are dropped above, by their text): the NOTIFY came
        // first, and the statement's copy is the one to drop.
        const mine = event.job ? this.own.get(event.jobId) : undefined;
        if (mine?.via === 'pending') Object.assign(mine, { via: 'notify', payload });
        this.deliver(event);
      },
      // postgres.js re-LISTENs by itself when its connection comes back; this runs each time.
      () => {
        if (first) {
          first = false;
          return;
        }
        this.relistens++;
        onRelisten?.();
        for (const listener of this.listeners) listener(RESYNC);
      },
    );
    this.unlisten = unlisten;
  }

  async stop(): Promise<void> {
    await this.unlisten?.();
    this.unlisten = null;
    this.own.clear();
    this.ownPayloads.clear();
  }

  /** An event to every subscriber of its tenant, and every unkeyed one, whose filter takes it. */
  private deliver(event: JobEvent): void {
    let pushed = 0;
    const keyed = this.byTenant.get(event.tenantId);
    if (keyed) for (const listener of keyed) if (listener(event)) pushed++;
    for (const listener of this.unkeyed) if (listener(event)) pushed++;
    // A traced job's event (its row carries its traceparent) pushed to subscribers here: one span in its trace.
    if (pushed > 0 && tracing.on && event.job?.traceParent) pushSpan(event, event.job.traceParent, pushed);
  }

  /** Forgets own events whose twin did not come within OWN_EVENT_TTL_MS (the map is oldest first). */
  private forgetOld(now: number): void {
    for (const [jobId, e] of this.own) {
      if (e.at > now - OWN_EVENT_TTL_MS) return;
      this.own.delete(jobId);
      if (e.via === 'own') this.ownPayloads.delete(e.payload!);
    }
  }

  settling(jobIds: readonly string[]): void {
    // Not listening (stopped, or never started): there is no NOTIFY copy to pair with.
    if (!this.unlisten) return;
    const now = Date.now();
    this.forgetOld(now);
    for (const jobId of jobIds) {
      // Delivered by an earlier try of this settlement whose NOTIFY is still to come: kept, so that
      // copy is dropped (this try finds the job settled and sends nothing).
      if (this.own.get(jobId)?.via === 'own') continue;
      this.own.delete(jobId);
      this.own.set(jobId, { via: 'pending', payload: null, at: now });
    }
  }

  settled(jobIds: readonly string[], payloads: readonly string[] | null): void {
    for (const payload of payloads ?? []) {
      const event = eventFromPayload(payload);
      const mine = event ? this.own.get(event.jobId) : undefined;
      // Delivered only while its NOTIFY has not come: a copy without its row is left to the NOTIFY
      // (read once there), and so is one this process did not announce (not listening).
      if (!event?.job || mine?.via !== 'pending') continue;
      Object.assign(mine, { via: 'own', payload });
      this.ownPayloads.set(payload, event.jobId);
      this.ownDelivered++;
      this.deliver(event);
    }
    for (const jobId of jobIds) {
      const mine = this.own.get(jobId);
      if (!mine || mine.via === 'own') continue;
      // No event of its own (superseded, requeued, too big, or the statement failed), or its
      // NOTIFY came first and delivered it: nothing more to pair.
      if (mine.via === 'notify' && payloads?.includes(mine.payload!)) this.twinsDropped++;
      this.own.delete(jobId);
    }
  }

  /**
   * Events matching `filter`, as an async iterator for a GraphQL subscription.
   * Buffers while the consumer is slow, up to `maxBuffer` events: one more and
   * the subscriber is dropped (its buffer freed, its socket closed with
   * SLOW_CONSUMER_CLOSE, its iterator ended), so a consumer that does not read
   * never grows the process's memory. `return()` (client unsubscribes)
   * removes the listener. `tenantId`: the one tenant whose events `filter`
   * can take, if there is one; the subscriber is then offered only that
   * tenant's events (the filter still decides which).
   */
  subscribe(filter: (event: JobEvent) => boolean, opts?: { socket?: SubscriberSocket | undefined; tenantId?: string | undefined }): AsyncIterableIterator<JobEvent>;
  /** With `resync`, RESYNC is yielded after each re-LISTEN (at most one pending at a time). */
  subscribe(filter: (event: JobEvent) => boolean, opts: { resync: true; socket?: SubscriberSocket | undefined; tenantId?: string | undefined }): AsyncIterableIterator<BusItem>;
  subscribe(filter: (event: JobEvent) => boolean, opts: { resync?: boolean; socket?: SubscriberSocket | undefined; tenantId?: string | undefined } = {}): AsyncIterableIterator<BusItem> {
    const buffer: BusItem[] = [];
    let wake: (() => void) | null = null;
    let done = false;
    const listener: Listener = (event) => {
      if (done) return false;
      if (event === RESYNC) {
        if (!opts.resync || buffer.includes(RESYNC)) return false;
      } else if (!filter(event)) return false;
      if (buffer.length >= this.maxBuffer) {
        buffer.length = 0;
        this.slowConsumersClosed++;
        finish();
        opts.socket?.close(SLOW_CONSUMER_CLOSE, 'subscriber too slow: event buffer full');
        return false;
      }
      buffer.push(event);
      wake?.();
      return true;
    };
    this.listeners.add(listener);
    const keyed = opts.tenantId === undefined ? this.unkeyed : this.byTenant.get(opts.tenantId) ?? new Set<Listener>();
    if (opts.tenantId !== undefined && keyed.size === 0) this.byTenant.set(opts.tenantId, keyed);
    keyed.add(listener);
    const finish = () => {
      if (done) return;
      done = true;
      this.listeners.delete(listener);
      keyed.delete(listener);
      if (opts.tenantId !== undefined && keyed.size === 0 && this.byTenant.get(opts.tenantId) === keyed) this.byTenant.delete(opts.tenantId);
      wake?.();
    };
    const iterator: AsyncIterableIterator<BusItem> = {
      next: async () => {
        while (!done && buffer.length === 0) await new Promise<void>((r) => (wake = r));
        wake = null;
        if (buffer.length > 0) return { value: buffer.shift()!, done: false };
        return { value: undefined, done: true };
      },
      return: async () => {
        finish();
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]() {
        return iterator;
      },
    };
    return iterator;
  }
}

/** The push of a traced job's event to this node's subscribers (a PRODUCER span: they read it later). */
function pushSpan(event: JobEvent, traceParent: string, subscribers: number): void {
  const span = startSpan('sluice.subscription.push', {
    parent: traceParent,
    kind: SpanKind.PRODUCER,
    attributes: { 'sluice.tenant.id': event.tenantId, 'sluice.job.id': event.jobId, 'sluice.job.state': event.state, 'sluice.subscription.subscribers': subscribers },
  });
  endSpan(span);
}
