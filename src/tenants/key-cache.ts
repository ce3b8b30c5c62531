/**
 * A per-process cache of tenant API keys: authenticating a request was one
 * SQL round trip per request (a join of tenant_api_keys and tenants), the
 * largest share of a single submission's statements once group commit made
 * the write cheap.
 *
 * Freshness contract:
 *  - An entry lives at most `AUTH_CACHE_TTL_MS` (0 disables the cache).
 *  - Whoever revokes a key or changes what a TenantRecord carries (rotate,
 *    suspend, resume, update limits, delete) sends `pg_notify('sluice_auth',
 *    {"tenantId"})` in the same transaction (`notifyAuthChanged`). Every
 *    process LISTENs on the pool's one LISTEN connection (postgres.js shares
 *    it with the event bus and ws-auth) and drops that tenant's entries when
 *    the notice arrives, i.e. right after the commit. The process that made the
 *    change also drops them itself right after its commit (read your writes).
 *  - After the LISTEN connection comes back from a loss, everything is dropped:
 *    a notice may have been missed meanwhile.
 *  - A lookup that started before a notice does not store its (maybe stale)
 *    answer: each notice bumps an epoch the lookup compares before storing.
 *  - A key in use is read again in the background once half its TTL has passed
 *    (refresh-ahead), while the entry still answers: a busy key never makes a
 *    request wait for its reload (with 1,000 tenants' keys in turn and a 5 s
 *    TTL, ~200 requests a second did), and no answer comes from an entry older
 *    than the TTL.
 *  - Unknown keys are remembered for AUTH_NEGATIVE_CACHE_MS (short; at most
 *    `maxNegative` of them, oldest forgotten first), so a client repeating a
 *    wrong key does not reach Postgres each time. Creating a tenant and
 *    rotating a key send the same notice, and every notice forgets every
 *    unknown key (the notice names the tenant, not the new key's hash): a key
 *    works on every process as soon as its creation's notice arrives, however
 *    recently it was seen unknown, and the creating process forgets them itself
 *    right after its commit. The epoch check keeps a lookup that began before
 *    the notice from storing its "unknown".
 * So admission's limits (queue bound, quota policy) read from a cached record
 * are stale at most until the change's notice is delivered.
 */
import type { Sql } from '../db/client.ts';
import { AUTH_CHANNEL, parseAuthNotice } from './auth-notice.ts';
import type { KeyHolder } from './api-keys.ts';

/** What the cache keeps per key: the key's grant and its tenant (tenants/api-keys.ts), or anything naming a tenant. */
type Cached = KeyHolder | { id: string };

interface Entry<T> {
  tenant: T;
  expiresAt: number;
}

/** The tenant a cached value belongs to (notices name tenants). */
function tenantIdOf(v: Cached): string {
  return 'tenant' in v ? v.tenant.id : v.id;
}

export interface KeyCacheOptions<T extends Cached = KeyHolder> {
  /** AUTH_CACHE_TTL_MS; 0 disables caching (every lookup reads the database). */
  ttlMs: number;
  /** The live key with this hash (and its tenant), or null: the database read. */
  load: (keyHash: string) => Promise<T | null>;
  /**
   * The live keys among many hashes, in one read: background refreshes due
   * within REFRESH_GATHER_MS share it. Without it each refresh reads alone.
   */
  loadMany?: (keyHashes: readonly string[]) => Promise<ReadonlyMap<string, T>>;
  /** At most this many keys are kept (oldest dropped first). */
  maxEntries?: number;
  /** AUTH_NEGATIVE_CACHE_MS: how long an unknown key is answered "unknown" without a read (0 = never). */
  negativeTtlMs?: number;
  /** At most this many unknown keys are remembered (oldest dropped first). */
  maxNegative?: number;
  now?: () => number;
}

/** Whether a cached entry may answer at `now`. Pure. */
export function isFresh(entry: { expiresAt: number } | undefined, now: number): boolean {
  return entry !== undefined && entry.expiresAt > now;
}

/** Background refreshes due within this long are read together (loadMany). */
const REFRESH_GATHER_MS = 50;

/** Whether a fresh entry should be read again in the background: past half its life. Pure. */
export function needsRefresh(entry: { expiresAt: number }, now: number, ttlMs: number): boolean {
  return entry.expiresAt - now < ttlMs / 2;
}

export class KeyCache<T extends Cached = KeyHolder> {
  private readonly entries = new Map<string, Entry<T>>();
  /** Unknown keys → until when they are answered unknown without a read. */
  private readonly unknown = new Map<string, number>();
  /** One database read per key at a time: a cold start under 64 clients reads each key once. */
  private readonly pending = new Map<string, { epoch: number; promise: Promise<T | null> }>();
  private epoch = 0;
  private unlisten: (() => Promise<void>) | null = null;
  private readonly opts: Required<Omit<KeyCacheOptions<T>, 'loadMany'>> & Pick<KeyCacheOptions<T>, 'loadMany'>;
  /** Misses read together on the next turn (loadMany). */
  private missDue = new Map<string, { promise: Promise<T | null>; resolve: (t: T | null) => void; reject: (err: unknown) => void }>();
  /** Keys due for a background refresh, read together within REFRESH_GATHER_MS (loadMany). */
  private refreshDue = new Set<string>();
  /** Database reads made (hits are lookups minus this); for tests and metrics. */
  loads = 0;

  constructor(opts: KeyCacheOptions<T>) {
    this.opts = { maxEntries: 100_000, negativeTtlMs: 0, maxNegative: 10_000, now: Date.now, ...opts };
  }

  get size(): number {
    return this.entries.size;
  }

  /**
   * The tenant whose live key has this hash (tenants/keys.ts hashSecret: the
   * caller hashes once per request), or null. `fresh` reads the database
   * whatever the cache holds (ws-auth's re-validation after a notice is
   * authoritative) and refreshes the entry.
   */
  async lookup(hash: string, opts: { fresh?: boolean } = {}): Promise<T | null> {
    if (this.opts.ttlMs <= 0) return this.read(hash);
    if (!opts.fresh) {
      const hit = this.entries.get(hash);
      const now = this.opts.now();
      if (isFresh(hit, now)) {
        if (needsRefresh(hit!, now, this.opts.ttlMs) && !this.pending.has(hash)) this.refreshAhead(hash);
        return hit!.tenant;
      }
      const unknownUntil = this.unknown.get(hash);
      if (unknownUntil !== undefined) {
        if (unknownUntil > now) return null;
        this.unknown.delete(hash);
      }
      const inFlight = this.pending.get(hash);
      if (inFlight && inFlight.epoch === this.epoch) return inFlight.promise;
    }
    // `fresh` (ws-auth's re-validation) reads on its own, at once.
    return this.reload(hash, { alone: opts.fresh === true });
  }

  /**
   * Reads a key again in the background. A failed refresh changes nothing: the
   * entry expires as it would have, and a later lookup reads. With loadMany,
   * the refreshes due within REFRESH_GATHER_MS are one statement (1,000
   * tenants' keys in turn made ~200 single reads a second at the 5 s TTL).
   */
  private refreshAhead(hash: string): void {
    const loadMany = this.opts.loadMany;
    if (!loadMany) {
      this.reload(hash).catch(() => {});
      return;
    }
    if (this.refreshDue.has(hash)) return;
    this.refreshDue.add(hash);
    if (this.refreshDue.size > 1) return; // a flush is already scheduled
    // Not urgent (the entry answers for half a TTL more): gather for a while, so that keys in turn
    // are refreshed in a few statements a second, not one per turn of a busy event loop.
    setTimeout(() => {
      const hashes = [...this.refreshDue];
      this.refreshDue = new Set();
      // Reloads started in one turn: readSoon makes them one loadMany statement.
      for (const h of hashes) if (!this.pending.has(h)) this.reload(h).catch(() => {});
    }, Math.min(REFRESH_GATHER_MS, this.opts.ttlMs / 4)).unref();
  }

  /**
   * A miss's read with loadMany: the misses of one turn of the event loop are
   * one statement (a cold start under 64 clients over 1,000 tenants' keys was
   * 1,000 single reads queued on the pool in the first second).
   */
  private readSoon(hash: string): Promise<T | null> {
    let due = this.missDue.get(hash);
    if (!due) {
      let resolve!: (t: T | null) => void;
      let reject!: (err: unknown) => void;
      const promise = new Promise<T | null>((res, rej) => ((resolve = res), (reject = rej)));
      due = { promise, resolve, reject };
      this.missDue.set(hash, due);
      if (this.missDue.size === 1) setImmediate(() => this.flushMisses());
    }
    return due.promise;
  }

  private flushMisses(): void {
    const due = this.missDue;
    this.missDue = new Map();
    this.loads++;
    this.opts.loadMany!([...due.keys()]).then(
      (found) => {
        for (const [h, d] of due) d.resolve(found.get(h) ?? null);
      },
      (err) => {
        for (const d of due.values()) d.reject(err);
      },
    );
  }

  /** One database read of a key (shared by concurrent lookups of the same epoch); stores its answer unless a notice came meanwhile. */
  private async reload(hash: string, opts: { alone?: boolean } = {}): Promise<T | null> {
    const epoch = this.epoch;
    const read = this.opts.loadMany && !opts.alone ? this.readSoon(hash) : this.read(hash);
    const promise = read.then((tenant) => {
      // A notice since the read began may have changed what it returned: answer it, do not keep it.
      if (epoch === this.epoch) this.store(hash, tenant);
      return tenant;
    });
    this.pending.set(hash, { epoch, promise });
    try {
      return await promise;
    } finally {
      if (this.pending.get(hash)?.promise === promise) this.pending.delete(hash);
    }
  }

  /** Drops a tenant's keys (null: every key). Called on each notice, and by the process that changed it. */
  invalidate(tenantId: string | null): void {
    this.epoch++;
    this.pending.clear();
    // Any notice may be a key's creation (a new tenant, a rotation): no key stays "unknown" past it.
    this.unknown.clear();
    if (tenantId === null) {
      this.entries.clear();
      return;
    }
    for (const [hash, e] of this.entries) if (tenantIdOf(e.tenant) === tenantId) this.entries.delete(hash);
  }

  /** LISTENs on `sluice_auth` (the pool's shared LISTEN connection). */
  async start(sql: Sql): Promise<void> {
    if (this.opts.ttlMs <= 0) return;
    let first = true;
    const { unlisten } = await sql.listen(
      AUTH_CHANNEL,
      (payload) => {
        const notice = parseAuthNotice(payload);
        // A payload we cannot read is still a change: forget everything rather than keep a revoked key.
        this.invalidate(notice ? notice.tenantId : null);
      },
      () => {
        if (first) first = false;
        else this.invalidate(null); // back after a loss: notices may have been missed
      },
    );
    this.unlisten = unlisten;
  }

  async stop(): Promise<void> {
    await this.unlisten?.().catch(() => {});
    this.unlisten = null;
  }

  private async read(hash: string): Promise<T | null> {
    this.loads++;
    return this.opts.load(hash);
  }

  private store(hash: string, tenant: T | null): void {
    if (!tenant) {
      this.entries.delete(hash); // unknown or revoked: at most briefly remembered as unknown
      if (this.opts.negativeTtlMs > 0) {
        this.unknown.delete(hash);
        this.unknown.set(hash, this.opts.now() + this.opts.negativeTtlMs);
        while (this.unknown.size > this.opts.maxNegative) this.unknown.delete(this.unknown.keys().next().value!);
      }
      return;
    }
    this.unknown.delete(hash);
    this.entries.delete(hash); // re-insert at the end: the Map's order is the eviction order
    this.entries.set(hash, { tenant, expiresAt: this.opts.now() + this.opts.ttlMs });
    while (this.entries.size > this.opts.maxEntries) this.entries.delete(this.entries.keys().next().value!);
  }
}
