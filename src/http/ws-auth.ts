/**
 * graphql-ws connections and the keys they were opened with.
 *
 * Close codes (documented in the README):
 *   4401  unknown, missing or revoked credential: at connection_init, and
 *         within a second of a key being revoked on any node;
 *   1009  a message too big: before connection_init is accepted, more than
 *         UNAUTHENTICATED_MAX_BODY_BYTES; after, more than MAX_BODY_BYTES;
 *   4429  TOO_MANY_AUTH_FAILURES: a failing credential from an address past
 *         AUTH_FAILURES_PER_MINUTE; the reason says when to retry
 *         ("TOO_MANY_AUTH_FAILURES: retry in 42 s"). A valid key from the same
 *         address still connects;
 *   1013  the database is unreachable right now: try again later;
 *   1001  the server is stopping.
 * Close codes are for the connection itself. A forbidden operation (a tenant
 * key asking for an admin field, or the reverse) is refused alone: an `error`
 * message with extensions.code FORBIDDEN for that operation id, and the
 * connection and its other operations carry on (4403 is no longer sent).
 * The WebSocket upgrade itself is refused only off /graphql (404); failed
 * authentications are judged per credential at connection_init (http/front-door.ts).
 *
 * Revocation contract: whoever revokes or deletes keys sends
 * `pg_notify('sluice_auth', '{"tenantId":"<id>"}')` in the same transaction
 * (notifyAuthChanged, src/tenants/auth-notice.ts). Every node LISTENs; on a notification it re-validates
 * the open connections of that tenant against the database and closes the
 * ones whose key no longer authenticates as that tenant. After the LISTEN
 * connection comes back (a Postgres outage), every connection is re-validated,
 * since a notification may have been missed meanwhile. A key with an expiry
 * (createApiKey's expiresAt, a rotation's overlap) is re-validated when it
 * expires, so its connections close then (4401) without a notice.
 */
import type { Sql } from '../db/client.ts';
import { isTransientOutage } from '../db/availability.ts';
import type { Auth } from '../graphql/context.ts';
import { AUTH_CHANNEL, parseAuthNotice } from '../tenants/auth-notice.ts';

export const WS_CLOSE = {
  unauthorized: 4401,
  tooManyAuthFailures: 4429,
  tryAgainLater: 1013,
  goingAway: 1001,
} as const;

interface Closable {
  close(code: number, reason: string): void;
  once(event: 'close', fn: () => void): unknown;
}

interface Open {
  tenantId: string | null; // null: the admin token (not revocable by a tenant notice)
  authorization: string;
  /** Re-validates at the key's expiry (absent: the key does not expire). */
  expiry?: NodeJS.Timeout;
}

/** setTimeout's longest delay (~24.8 days); a later expiry is re-armed from there. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export class WsConnections {
  private readonly open = new Map<Closable, Open>();
  private unlisten: (() => Promise<void>) | null = null;
  private readonly authenticate: (authorization: string) => Promise<Auth>;

  constructor(authenticate: (authorization: string) => Promise<Auth>) {
    this.authenticate = authenticate;
  }

  get size(): number {
    return this.open.size;
  }

  /** Tracks an accepted connection until its socket closes. */
  add(socket: Closable, auth: Auth, authorization: string): void {
    const conn: Open = { tenantId: auth.kind === 'tenant' ? auth.tenant.id : null, authorization };
    this.open.set(socket, conn);
    this.armExpiry(socket, conn, auth);
    socket.once('close', () => {
      clearTimeout(conn.expiry);
      this.open.delete(socket);
    });
  }

  /** (Re)arms the connection's check at its key's expiry, as the key says now. */
  private armExpiry(socket: Closable, conn: Open, auth: Auth): void {
    clearTimeout(conn.expiry);
    delete conn.expiry;
    const at = auth.kind === 'tenant' ? auth.key.expiresAtMs : null;
    if (at === null) return;
    // A little past the instant: the key is then expired for the database and the cache alike.
    conn.expiry = setTimeout(() => {
      if (this.open.get(socket) === conn) this.revalidateOne(socket, conn).catch(() => {});
    }, Math.min(MAX_TIMER_MS, Math.max(0, at - Date.now()) + 50)).unref();
  }

  /**
   * Re-validates the connections of one tenant (or all, with null) and closes
   * with 4401 those whose key no longer authenticates as the same caller.
   * Returns how many were closed.
   */
  async revalidate(tenantId: string | null): Promise<number> {
    let closed = 0;
    for (const [socket, conn] of [...this.open]) {
      if (tenantId !== null && conn.tenantId !== tenantId) continue;
      const result = await this.revalidateOne(socket, conn);
      if (result === 'outage') return closed; // the next notice, or the re-LISTEN after recovery, tries again
      if (result === 'closed') closed++;
    }
    return closed;
  }

  private async revalidateOne(socket: Closable, conn: Open): Promise<'kept' | 'closed' | 'outage'> {
    let auth: Auth;
    try {
      auth = await this.authenticate(conn.authorization);
    } catch (err) {
      if (isTransientOutage(err)) return 'outage';
      throw err;
    }
    const still = conn.tenantId === null ? auth.kind === 'admin' : auth.kind === 'tenant' && auth.tenant.id === conn.tenantId;
    if (still) {
      this.armExpiry(socket, conn, auth); // a rotation may have given the key an expiry since
      return 'kept';
    }
    clearTimeout(conn.expiry);
    this.open.delete(socket);
    socket.close(WS_CLOSE.unauthorized, 'API key revoked or expired: reconnect with a valid key');
    return 'closed';
  }

  /** LISTENs for revocation notices; re-validates everything after each re-LISTEN (a notice may have been missed). */
  async start(sql: Sql, onError: (err: unknown) => void): Promise<void> {
    let first = true;
    const { unlisten } = await sql.listen(
      AUTH_CHANNEL,
      (payload) => {
        const notice = parseAuthNotice(payload);
        if (notice) this.revalidate(notice.tenantId).catch(onError);
      },
      () => {
        if (first) first = false;
        else this.revalidate(null).catch(onError);
      },
    );
    this.unlisten = unlisten;
  }

  async stop(): Promise<void> {
    await this.unlisten?.().catch(() => {});
    this.unlisten = null;
  }
}
