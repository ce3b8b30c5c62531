/**
 * The key-change notice: whoever changes a tenant's keys or what its cached record carries
 * (rotate, revoke, suspend, resume, update limits, delete) sends
 * `pg_notify('sluice_auth', '{"tenantId":"<id>"}')` in the same transaction. Every process
 * LISTENs: the key cache drops the tenant's entries (tenants/key-cache.ts) and the graphql-ws
 * connections of that tenant are re-validated (http/ws-auth.ts).
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';

export const AUTH_CHANNEL = 'sluice_auth';

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

