/**
 * Owns the tenants and tenant_api_keys tables.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, inArray, isNull, sql } from 'drizzle-orm';
import type { Db, Tx } from '../db/client.ts';
import { tenantApiKeys, tenants } from '../db/schema.ts';
import type { TierName } from '../config/tiers.ts';
import { SluiceError } from '../errors.ts';
import { generateSecret, hashSecret, TENANT_KEY_PREFIX } from './keys.ts';
import type { TenantRecord } from './policy.ts';
import { AUTH_CHANNEL, authNoticePayload } from './auth-notice.ts';

type Row = typeof tenants.$inferSelect;

/* The lifecycle's statements (tenants/lifecycle.ts), on postgres.js transactions. */

/** Suspended (kept when already): submissions are refused. */
export async function markTenantSuspended(tx: Tx, id: string): Promise<void> {
  await tx`update tenants set suspended_at = coalesce(suspended_at, now()), updated_at = now() where id = ${id}`;
}

export async function clearTenantSuspended(tx: Tx, id: string): Promise<void> {
  await tx`update tenants set suspended_at = null, updated_at = now() where id = ${id}`;
}

/** Revokes every key of the tenant still valid. */
export async function revokeTenantKeys(tx: Tx, id: string): Promise<void> {
  await tx`update tenant_api_keys set revoked_at = now() where tenant_id = ${id} and revoked_at is null`;
}

/** The tenant's row; its jobs, results, keys, scheduler rows and ledger go with it (on delete cascade). */
export async function deleteTenantRow(tx: Tx, id: string): Promise<void> {
  await tx`delete from tenants where id = ${id}`;
}

/** notifyAuthChanged's notice, on a drizzle transaction. */
async function notifyAuth(tx: { execute(q: ReturnType<typeof sql>): Promise<unknown> }, tenantId: string): Promise<void> {
  await tx.execute(sql`select pg_notify(${AUTH_CHANNEL}, ${authNoticePayload(tenantId)})`);
}

function toRecord(row: Row): TenantRecord {
  return {
    id: row.id,
    name: row.name,
    tier: row.tier as TierName,
    weight: row.weight,
    concurrencyCap: row.concurrencyCap,
    monthlyQuota: row.monthlyQuota,
    queueBound: row.queueBound,
    requestBurst: row.requestBurst,
    requestRate: row.requestRate,
    quotaPolicy: row.quotaPolicy as 'WAIT' | 'FAIL',
    periodAnchor: row.periodAnchor,
    createdAt: row.createdAt,
    suspendedAt: row.suspendedAt,
  };
}

export interface TenantPatch {
  name?: string | undefined;
  tier?: TierName | undefined;
  /** null clears the override (back to the tier's value); undefined leaves it as is. */
  weight?: number | null | undefined;
  concurrencyCap?: number | null | undefined;
  monthlyQuota?: number | null | undefined;
  queueBound?: number | null | undefined;
  requestBurst?: number | null | undefined;
  requestRate?: number | null | undefined;
  quotaPolicy?: 'WAIT' | 'FAIL' | undefined;
}

function isUniqueViolation(err: unknown): boolean {
  const e = err as { code?: string; cause?: { code?: string } };
  return e?.code === '23505' || e?.cause?.code === '23505';
}

export class TenantStore {
  private readonly db: Db;
  /** Called after a commit that changed a tenant's keys or record (the process's own key cache forgets it at once). */
  private readonly authChanged: (tenantId: string) => void;
  constructor(db: Db, opts: { authChanged?: (tenantId: string) => void } = {}) {
    this.db = db;
    this.authChanged = opts.authChanged ?? (() => {});
  }

  /** Creates a tenant and its first API key; the key is returned once and stored as a hash. */
  async create(input: { name: string; tier: TierName }): Promise<{ tenant: TenantRecord; apiKey: string }> {
    const apiKey = generateSecret(TENANT_KEY_PREFIX);
    const id = randomUUID();
    try {
      const row = await this.db.transaction(async (tx) => {
        const [created] = await tx.insert(tenants).values({ id, name: input.name, tier: input.tier }).returning();
        await tx.insert(tenantApiKeys).values({ tenantId: id, keyHash: hashSecret(apiKey), keyPrefix: apiKey.slice(0, 10) });
        // Every node forgets the keys it saw unknown (tenants/key-cache.ts): the new key may be one of them.
        await notifyAuth(tx, id);
        return created!;
      });
      this.authChanged(id);
      return { tenant: toRecord(row), apiKey };
    } catch (err) {
      if (isUniqueViolation(err)) {
        throw new SluiceError('BAD_USER_INPUT', `a tenant named "${input.name}" already exists`, { field: 'name' });
      }
      throw err;
    }
  }

  /** Revokes every current key of the tenant and issues a new one. */
  async rotateKey(tenantId: string): Promise<{ tenant: TenantRecord; apiKey: string }> {
    const tenant = await this.get(tenantId);
    if (!tenant) throw new SluiceError('NOT_FOUND', `no tenant with id ${tenantId}`);
    const apiKey = generateSecret(TENANT_KEY_PREFIX);
    await this.db.transaction(async (tx) => {
      await tx
        .update(tenantApiKeys)
        .set({ revokedAt: new Date() })
        .where(and(eq(tenantApiKeys.tenantId, tenantId), isNull(tenantApiKeys.revokedAt)));
      await tx.insert(tenantApiKeys).values({ tenantId, keyHash: hashSecret(apiKey), keyPrefix: apiKey.slice(0, 10) });
      // Every node closes the open subscriptions of the revoked keys (http/ws-auth.ts) and forgets
      // them in its key cache (tenants/key-cache.ts), once this commits.
      await notifyAuth(tx, tenantId);
    });
    this.authChanged(tenantId);
    return { tenant, apiKey };
  }

  async update(tenantId: string, patch: TenantPatch): Promise<TenantRecord> {
    const set: Partial<typeof tenants.$inferInsert> = { updatedAt: new Date() };
    for (const key of ['name', 'tier', 'weight', 'concurrencyCap', 'monthlyQuota', 'queueBound', 'requestBurst', 'requestRate', 'quotaPolicy'] as const) {
      if (patch[key] !== undefined) (set as Record<string, unknown>)[key] = patch[key];
    }
    try {
      const row = await this.db.transaction(async (tx) => {
        const [updated] = await tx.update(tenants).set(set).where(eq(tenants.id, tenantId)).returning();
        if (!updated) throw new SluiceError('NOT_FOUND', `no tenant with id ${tenantId}`);
        // Limits and quota policy travel in the cached TenantRecord that admission reads: every node forgets it.
        await notifyAuth(tx, tenantId);
        return updated;
      });
      this.authChanged(tenantId);
      return toRecord(row);
    } catch (err) {
      if (isUniqueViolation(err)) throw new SluiceError('BAD_USER_INPUT', `a tenant named "${patch.name}" already exists`, { field: 'name' });
      throw err;
    }
  }

  async get(tenantId: string): Promise<TenantRecord | null> {
    const [row] = await this.db.select().from(tenants).where(eq(tenants.id, tenantId));
    return row ? toRecord(row) : null;
  }

  async list(): Promise<TenantRecord[]> {
    const rows = await this.db.select().from(tenants).orderBy(asc(tenants.createdAt), asc(tenants.id));
    return rows.map(toRecord);
  }

  /** byKeyHash for many keys in one statement (the key cache's background refreshes): hash → tenant, absent when no live key has it. */
  async byKeyHashes(keyHashes: readonly string[]): Promise<Map<string, TenantRecord>> {
    if (keyHashes.length === 0) return new Map();
    const rows = await this.db
      .select({ keyHash: tenantApiKeys.keyHash, tenant: tenants })
      .from(tenantApiKeys)
      .innerJoin(tenants, eq(tenants.id, tenantApiKeys.tenantId))
      .where(and(inArray(tenantApiKeys.keyHash, [...keyHashes]), isNull(tenantApiKeys.revokedAt)));
    return new Map(rows.map((r) => [r.keyHash, toRecord(r.tenant)]));
  }

  /** The tenant whose live (unrevoked) key has this hash, or null. Read through the key cache (key-cache.ts). */
  async byKeyHash(keyHash: string): Promise<TenantRecord | null> {
    const [row] = await this.db
      .select({ tenant: tenants })
      .from(tenantApiKeys)
      .innerJoin(tenants, eq(tenants.id, tenantApiKeys.tenantId))
      .where(and(eq(tenantApiKeys.keyHash, keyHash), isNull(tenantApiKeys.revokedAt)));
    return row ? toRecord(row.tenant) : null;
  }
}
