/**
 * Job events travel through Postgres NOTIFY, so a subscriber connected to one
 * process sees jobs finished by another. Each process holds one LISTEN
 * connection and fans events out to its own subscribers in memory.
 *
 * Events are published inside the transaction that changes the job, so they
 * are delivered only if (and when) the change commits.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';

export const JOB_EVENTS_CHANNEL = 'sluice_job_events';

export interface JobEvent {
  jobId: string;
  tenantId: string;
  state: string;
}

/**
 * Yielded (to subscribers that ask for it) after the LISTEN connection came
 * back: events committed while it was down were never delivered, so the
 * subscriber re-reads the state it follows and sends what changed.
 */
export const RESYNC = Symbol('resync');
export type BusItem = JobEvent | typeof RESYNC;

type Listener = (event: JobEvent | typeof RESYNC) => void;

export async function publishJobEvents(tx: Sql | postgres.TransactionSql, events: readonly JobEvent[]): Promise<void> {
  if (events.length === 0) return;
  // One NOTIFY per event keeps each payload small (the limit is 8000 bytes).
  await tx`select pg_notify(${JOB_EVENTS_CHANNEL}, e::text) from jsonb_array_elements(${tx.json(events as never)}::jsonb) as e`;
}

/** The socket of a graphql-ws subscriber, closed when it falls behind. */
export interface SubscriberSocket {
  close(code: number, reason: string): void;
}

/** Close code for a subscriber whose buffer overflowed (src/events/subscriptions.ts lists the codes). */
export const SLOW_CONSUMER_CLOSE = 4408;

export class EventBus {
  private readonly listeners = new Set<Listener>();
  private unlisten: (() => Promise<void>) | null = null;
  /** Events one subscriber may have waiting (SUBSCRIPTION_BUFFER_MAX); past it the subscriber is closed. */
  readonly maxBuffer: number;
  /** Subscribers closed for being too slow (for metrics and tests). */
  slowConsumersClosed = 0;

  constructor(opts: { maxBuffer?: number } = {}) {
    this.maxBuffer = opts.maxBuffer ?? 1_000;
  }

  private readonly loads = new Map<string, Promise<unknown>>();

  /**
   * One load per key while it is in flight: the subscribers an event wakes
   * (a tenant's 5 jobsCompleted subscribers) wake in the same tick and read
   * the job once instead of once each. Nothing is cached past the load.
   */
  shared<T>(key: string, load: () => Promise<T>): Promise<T> {
    const pending = this.loads.get(key);
    if (pending) return pending as Promise<T>;
    const p = load().finally(() => this.loads.delete(key));
    this.loads.set(key, p);
    return p;
  }

  /** How many times the LISTEN connection came back after a loss (a Postgres outage). */
  relistens = 0;

  async start(sql: Sql, onRelisten?: () => void): Promise<void> {
    let first = true;
    const { unlisten } = await sql.listen(
      JOB_EVENTS_CHANNEL,
      (payload) => {
        let event: JobEvent;
        try {
          event = JSON.parse(payload) as JobEvent;
        } catch {
          return;
        }
        for (const listener of this.listeners) listener(event);
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
  }

  /**
   * Events matching `filter`, as an async iterator for a GraphQL subscription.
   * Buffers while the consumer is slow, up to `maxBuffer` events: one more and
   * the subscriber is dropped (its buffer freed, its socket closed with
   * SLOW_CONSUMER_CLOSE, its iterator ended), so a consumer that does not read
   * never grows the process's memory. `return()` (client unsubscribes)
   * removes the listener.
   */
  subscribe(filter: (event: JobEvent) => boolean, opts?: { socket?: SubscriberSocket | undefined }): AsyncIterableIterator<JobEvent>;
  /** With `resync`, RESYNC is yielded after each re-LISTEN (at most one pending at a time). */
  subscribe(filter: (event: JobEvent) => boolean, opts: { resync: true; socket?: SubscriberSocket | undefined }): AsyncIterableIterator<BusItem>;
  subscribe(filter: (event: JobEvent) => boolean, opts: { resync?: boolean; socket?: SubscriberSocket | undefined } = {}): AsyncIterableIterator<BusItem> {
    const buffer: BusItem[] = [];
    let wake: (() => void) | null = null;
    let done = false;
    const listener: Listener = (event) => {
      if (done) return;
      if (event === RESYNC) {
        if (!opts.resync || buffer.includes(RESYNC)) return;
      } else if (!filter(event)) return;
      if (buffer.length >= this.maxBuffer) {
        buffer.length = 0;
        this.slowConsumersClosed++;
        finish();
        opts.socket?.close(SLOW_CONSUMER_CLOSE, 'subscriber too slow: event buffer full');
        return;
      }
      buffer.push(event);
      wake?.();
    };
    this.listeners.add(listener);
    const finish = () => {
      done = true;
      this.listeners.delete(listener);
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
