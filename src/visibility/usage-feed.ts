/**
 * One poller per key (a tenant) per process, however many subscribers: the
 * `tenantUsage` subscription used to poll Postgres once a second per
 * subscriber, so 20 subscriptions of one tenant were 20 pollers' worth of
 * reads. Now the first subscriber starts `changes()` (status.ts) for its key,
 * every subscriber receives what it yields, and the last one to leave stops
 * it. A subscriber that joins late gets the latest value at once; one that
 * reads slowly gets the newest value, not a backlog (these are snapshots).
 */
import { effectiveLimits, type TenantRecord } from '../tenants/policy.ts';
import { changes } from './status.ts';

interface Subscriber<T> {
  /** The newest value not yet taken, if any. */
  pending: { value: T } | null;
  failed: unknown;
  wake: (() => void) | null;
}

interface Feed<T> {
  subscribers: Set<Subscriber<T>>;
  last: { value: T } | null;
  stop(): void;
}

export class SharedFeeds {
  private readonly feeds = new Map<string, Feed<unknown>>();
  private readonly intervalMs: number;

  constructor(intervalMs = 1_000) {
    this.intervalMs = intervalMs;
  }

  /** Pollers running now (one per key with subscribers). */
  get running(): number {
    return this.feeds.size;
  }

  /** The values of `read` for `key`, as `changes()` yields them, shared with every other subscriber of `key`. */
  subscribeKey<T>(key: string, read: () => Promise<T>): AsyncIterableIterator<T> {
    let feed = this.feeds.get(key) as Feed<T> | undefined;
    if (!feed) feed = this.start(key, read);
    const me: Subscriber<T> = { pending: feed.last, failed: undefined, wake: null };
    feed.subscribers.add(me);
    let done = false;
    const leave = () => {
      if (done) return;
      done = true;
      feed!.subscribers.delete(me);
      if (feed!.subscribers.size === 0 && this.feeds.get(key) === feed) {
        this.feeds.delete(key);
        feed!.stop();
      }
      me.wake?.();
    };
    const iterator: AsyncIterableIterator<T> = {
      next: async () => {
        while (!done) {
          if (me.failed !== undefined) {
            leave();
            throw me.failed;
          }
          if (me.pending) {
            const { value } = me.pending;
            me.pending = null;
            return { value, done: false };
          }
          await new Promise<void>((r) => (me.wake = r));
          me.wake = null;
        }
        return { value: undefined, done: true };
      },
      return: async () => {
        leave();
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]() {
        return iterator;
      },
    };
    return iterator;
  }

  private start<T>(key: string, read: () => Promise<T>): Feed<T> {
    const polls = changes(read, this.intervalMs);
    const feed: Feed<T> = { subscribers: new Set(), last: null, stop: () => void polls.return?.() };
    this.feeds.set(key, feed as Feed<unknown>);
    void (async () => {
      try {
        for await (const value of polls) {
          feed.last = { value };
          for (const s of feed.subscribers) {
            s.pending = { value };
            s.wake?.();
          }
        }
      } catch (err) {
        if (this.feeds.get(key) === feed) this.feeds.delete(key);
        for (const s of feed.subscribers) {
          s.failed = err;
          s.wake?.();
        }
      }
    })();
    return feed;
  }

  /**
   * A tenant's feed. The key carries the limits the read depends on (quota,
   * tier), so a subscriber that authenticated after `updateTenant` does not
   * share the poller of a record that is out of date.
   */
  subscribe<T>(tenant: TenantRecord, read: () => Promise<T>): AsyncIterableIterator<T> {
    const key = `${tenant.id}:${tenant.tier}:${JSON.stringify(effectiveLimits(tenant))}:${tenant.periodAnchor.getTime()}`;
    return this.subscribeKey(key, read);
  }
}

/** This process's tenantUsage pollers. */
export const tenantUsageFeed = new SharedFeeds();
