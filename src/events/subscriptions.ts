/**
 * Open graphql-ws connections and operations of this process: the caps
 * (MAX_SUBSCRIPTIONS_PER_TENANT, MAX_SUBSCRIPTIONS_PER_PROCESS, counted per
 * process: a tenant connected to N API processes may hold N × its cap), and
 * the sockets to close when a tenant's keys change.
 *
 * Closing on key changes is the minimal version of H10's listener (issue 10):
 * on `NOTIFY sluice_auth '{"tenantId": "…"}'` every connection of that tenant
 * whose credential no longer authenticates is closed with 4401. H10's version
 * replaces this one at merge.
 */
import { GraphQLError } from 'graphql';
import type { Sql } from '../db/client.ts';

/** Close codes Sluice uses on graphql-ws sockets (4400-4499 are graphql-ws's own; ours say what happened). */
export const CLOSE_CODES = {
  /** The connection's key was revoked or its tenant deleted. */
  UNAUTHORIZED: 4401,
  /** The subscriber did not read its events fast enough: its buffer passed SUBSCRIPTION_BUFFER_MAX. */
  SLOW_CONSUMER: 4408,
} as const;

export interface ClosableSocket {
  close(code: number, reason: string): void;
}

interface Connection {
  socket: ClosableSocket;
  tenantId: string | null;
  authorization: string | null;
  operations: Set<string>;
}

/** Whether one more operation may start; pure. */
export function subscriptionRefusal(counts: { tenant: number; process: number }, caps: { perTenant: number; perProcess: number }, isTenant: boolean): GraphQLError | null {
  if (counts.process >= caps.perProcess) {
    return new GraphQLError(`this server holds its maximum of ${caps.perProcess} open subscriptions; retry later or on another node`, {
      extensions: { code: 'TOO_MANY_SUBSCRIPTIONS', scope: 'PROCESS', limit: caps.perProcess },
    });
  }
  if (isTenant && counts.tenant >= caps.perTenant) {
    return new GraphQLError(`you have ${caps.perTenant} open subscriptions on this server, the maximum; complete one first`, {
      extensions: { code: 'TOO_MANY_SUBSCRIPTIONS', scope: 'TENANT', limit: caps.perTenant },
    });
  }
  return null;
}

export class SubscriptionRegistry {
  private readonly connections = new Map<object, Connection>();
  private readonly perTenant = new Map<string, number>();
  private total = 0;
  private unlisten: (() => Promise<void>) | null = null;
  readonly caps: { perTenant: number; perProcess: number };

  constructor(caps: { perTenant: number; perProcess: number }) {
    this.caps = caps;
  }

  /** Open operations: per tenant and in all. */
  counts(tenantId: string | null): { tenant: number; process: number } {
    return { tenant: tenantId ? (this.perTenant.get(tenantId) ?? 0) : 0, process: this.total };
  }

  connected(key: object, c: { socket: ClosableSocket; tenantId: string | null; authorization: string | null }): void {
    this.connections.set(key, { ...c, operations: new Set() });
  }

  /** Registers an operation, or returns the refusal. */
  start(key: object, id: string): GraphQLError | null {
    const c = this.connections.get(key);
    if (!c) return null;
    const refusal = subscriptionRefusal(this.counts(c.tenantId), this.caps, c.tenantId !== null);
    if (refusal) return refusal;
    c.operations.add(id);
    this.total++;
    if (c.tenantId) this.perTenant.set(c.tenantId, (this.perTenant.get(c.tenantId) ?? 0) + 1);
    return null;
  }

  end(key: object, id: string): void {
    const c = this.connections.get(key);
    if (!c || !c.operations.delete(id)) return;
    this.total--;
    if (c.tenantId) {
      const n = (this.perTenant.get(c.tenantId) ?? 1) - 1;
      if (n <= 0) this.perTenant.delete(c.tenantId);
      else this.perTenant.set(c.tenantId, n);
    }
  }

  disconnected(key: object): void {
    const c = this.connections.get(key);
    if (!c) return;
    for (const id of [...c.operations]) this.end(key, id);
    this.connections.delete(key);
  }

  /** Closes (4401) the tenant's connections whose credential `stillValid` refuses now. */
  async revalidate(tenantId: string, stillValid: (authorization: string | null) => Promise<boolean>): Promise<number> {
    let closed = 0;
    for (const [key, c] of [...this.connections]) {
      if (c.tenantId !== tenantId) continue;
      if (await stillValid(c.authorization)) continue;
      c.socket.close(CLOSE_CODES.UNAUTHORIZED, 'credential revoked');
      this.disconnected(key);
      closed++;
    }
    return closed;
  }

  /** LISTEN sluice_auth: one connection per process, like the job events. */
  async listen(sql: Sql, stillValid: (authorization: string | null) => Promise<boolean>, onError: (err: unknown) => void): Promise<void> {
    const { unlisten } = await sql.listen('sluice_auth', (payload) => {
      let tenantId: unknown;
      try {
        tenantId = (JSON.parse(payload) as { tenantId?: unknown }).tenantId;
      } catch {
        return;
      }
      if (typeof tenantId === 'string') this.revalidate(tenantId, stillValid).catch(onError);
    });
    this.unlisten = unlisten;
  }

  async stop(): Promise<void> {
    await this.unlisten?.();
    this.unlisten = null;
  }
}
