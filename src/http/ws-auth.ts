/**
 * graphql-ws connections and the keys they were opened with.
 *
 * Close codes (documented in the README):
 *   4401  unknown, missing or revoked credential: at connection_init, and
 *         within a second of a key being revoked on any node;
 *   4403  a forbidden operation (a tenant key asking for an admin field, or
 *         the reverse): the connection is closed, not just the operation;
 *   1013  the database is unreachable right now: try again later;
 *   1001  the server is stopping.
 *
 * Revocation contract: whoever revokes or deletes keys sends
 * `pg_notify('sluice_auth', '{"tenantId":"<id>"}')` in the same transaction
 * (notifyAuthChanged). Every node LISTENs; on a notification it re-validates
 * the open connections of that tenant against the database and closes the
 * ones whose key no longer authenticates as that tenant. After the LISTEN
 * connection comes back (a Postgres outage), every connection is re-validated,
 * since a notification may have been missed meanwhile.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import { isTransientOutage } from '../db/availability.ts';
import type { Auth } from '../graphql/context.ts';

export const AUTH_CHANNEL = 'sluice_auth';

export const WS_CLOSE = {
  unauthorized: 4401,
  forbidden: 4403,
  tryAgainLater: 1013,
  goingAway: 1001,
} as const;

/** The notice's payload (the contract other modules send). Pure. */
export function authNoticePayload(tenantId: string): string {
  return JSON.stringify({ tenantId });
}

/** Sends the revocation notice for a tenant, inside the transaction that revoked or deleted its keys. */
export async function notifyAuthChanged(tx: Sql | postgres.TransactionSql, tenantId: string): Promise<void> {
  await tx`select pg_notify(${AUTH_CHANNEL}, ${authNoticePayload(tenantId)})`;
}

/** Parses a notification payload; null when it is not ours. Pure. */
export function parseAuthNotice(payload: string): { tenantId: string } | null {
  try {
    const v = JSON.parse(payload) as { tenantId?: unknown };
    return typeof v?.tenantId === 'string' ? { tenantId: v.tenantId } : null;
  } catch {
    return null;
  }
}

interface Closable {
  close(code: number, reason: string): void;
  once(event: 'close', fn: () => void): unknown;
}

interface Open {
  tenantId: string | null; // null: the admin token (not revocable by a tenant notice)
  authorization: string;
}

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
    this.open.set(socket, { tenantId: auth.kind === 'tenant' ? auth.tenant.id : null, authorization });
    socket.once('close', () => this.open.delete(socket));
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
      let auth: Auth;
      try {
        auth = await this.authenticate(conn.authorization);
      } catch (err) {
        if (isTransientOutage(err)) return closed; // the next notice, or the re-LISTEN after recovery, tries again
        throw err;
      }
      const still = conn.tenantId === null ? auth.kind === 'admin' : auth.kind === 'tenant' && auth.tenant.id === conn.tenantId;
      if (!still) {
        this.open.delete(socket);
        socket.close(WS_CLOSE.unauthorized, 'API key revoked: reconnect with a valid key');
        closed++;
      }
    }
    return closed;
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
