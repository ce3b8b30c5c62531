/**
 * Owns the tenants and tenant_api_keys tables.
 */
import { randomUUID } from 'node:crypto';
import { and, asc, eq, gt, inArray, isNull, or, sql } from 'drizzle-orm';
import type { Db, Tx } from '../db/client.ts';
import { tenantApiKeys, tenants } from '../db/schema.ts';
import type { TierName } from '../config/tiers.ts';
import { SluiceError } from '../errors.ts';
import { generateTenantKey, hashSecret } from './keys.ts';
import type { TenantRecord } from './policy.ts';
import { AUTH_CHANNEL, authNoticePayload } from './auth-notice.ts';
import { boundByMaker, MAX_LIVE_KEYS, rotationExpiry, type ApiKeyRecord, type KeyHolder, type Scope } from './api-keys.ts';
// The bound the scheduler reads the backlogged shares at: the admin API keeps every tenant's sum there.
import { RESERVED_MAX } from '../scheduler/lease.ts';

type Row = typeof tenants.$inferSelect;
type KeyRow = typeof tenantApiKeys.$inferSelect;

function toKeyRecord(row: KeyRow): ApiKeyRecord {
  return {
    id: row.id,
    tenantId: row.tenantId,
    name: row.name,
    prefix: row.keyPrefix,
    scopes: row.scopes as Scope[],
    createdAt: row.createdAt,
    expiresAt: row.expiresAt,
    lastUsedAt: row.lastUsedAt,
    revokedAt: row.revokedAt,
  };
}

function toHolder(tenant: Row, key: Pick<KeyRow, 'id' | 'scopes' | 'expiresAt'>): KeyHolder {
  return { tenant: toRecord(tenant), key: { id: key.id, scopes: key.scopes as Scope[], expiresAtMs: key.expiresAt?.getTime() ?? null } };
}

/** A key authenticates until revoked or past its expiry (the key cache checks the expiry again per request). */
const keyIsLive = () => and(isNull(tenantApiKeys.revokedAt), or(isNull(tenantApiKeys.expiresAt), gt(tenantApiKeys.expiresAt, sql`now()`)));

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
    reservedShare: row.reservedShare,
  };
}

/**
 * In the transaction that writes a tenant's reserved share, after the write: the sum over every
 * tenant stays <= RESERVED_MAX, else RESERVATION_OVERCOMMITTED (the transaction rolls back).
 * A transaction-scoped advisory lock, taken before the write, orders the writers of reserved
 * shares, so two concurrent writes cannot both pass on a sum that counts neither.
 */
async function lockReservedShares(tx: { execute(q: ReturnType<typeof sql>): Promise<unknown> }): Promise<void> {
  await tx.execute(sql`select pg_advisory_xact_lock(hashtext('sluice_reserved_share'))`);
}

async function checkReservedShares(tx: { execute(q: ReturnType<typeof sql>): Promise<unknown> }, tenantId: string): Promise<void> {
  const rows = (await tx.execute(sql`
    select coalesce(sum(reserved_share) filter (where id <> ${tenantId}), 0)::float8 as elsewhere,
      coalesce(sum(reserved_share), 0)::float8 as total
    from tenants where reserved_share > 0`)) as unknown as Array<{ elsewhere: number; total: number }>;
  const { elsewhere, total } = rows[0]!;
  // A float sum: 0.1 + 0.7 may land a hair past 0.8.
  if (total > RESERVED_MAX + 1e-9) {
    throw new SluiceError('RESERVATION_OVERCOMMITTED', `reserved shares would add up to ${round(total)}, past ${RESERVED_MAX}: other tenants reserve ${round(elsewhere)}`, {
      field: 'reservedShare',
      reservedElsewhere: round(elsewhere),
      max: RESERVED_MAX,
    });
  }
}

const round = (x: number) => Math.round(x * 1e6) / 1e6;

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
  /** 0 to 1; null or 0 clears it (no reservation); undefined leaves it as is. */
  reservedShare?: number | null | undefined;
}

function isUniqueViolation(err: unknown): boolean {
  const e = err as { code?: string; cause?: { code?: string } };
  return e?.code === '23505' || e?.cause?.code === '23505';
}

export class TenantStore {
  private readonly db: Db;
  /** Called after a commit that changed a tenant's keys or record (the process's own key cache forgets it at once). */
  private readonly authChanged: (tenantId: string) => void;
  /** The installation's key checksum secret (db/settings.ts): every key minted here carries its checksum. */
  private readonly keyChecksumSecret: string;
  constructor(db: Db, opts: { keyChecksumSecret: string; authChanged?: (tenantId: string) => void }) {
    this.db = db;
    this.keyChecksumSecret = opts.keyChecksumSecret;
    this.authChanged = opts.authChanged ?? (() => {});
  }

  /** Creates a tenant and its first API key; the key is returned once and stored as a hash. */
  async create(input: { name: string; tier: TierName; reservedShare?: number | null | undefined }): Promise<{ tenant: TenantRecord; apiKey: string }> {
    const apiKey = generateTenantKey(this.keyChecksumSecret);
    const id = randomUUID();
    const reservedShare = input.reservedShare ? input.reservedShare : null;
    try {
      const row = await this.db.transaction(async (tx) => {
        if (reservedShare !== null) await lockReservedShares(tx);
        const [created] = await tx.insert(tenants).values({ id, name: input.name, tier: input.tier, reservedShare }).returning();
        if (reservedShare !== null) await checkReservedShares(tx, id);
        await tx.insert(tenantApiKeys).values({ tenantId: id, name: 'default', keyHash: hashSecret(apiKey), keyPrefix: apiKey.slice(0, 10) });
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

  /**
   * Issues a new key (both scopes) and gives the tenant's other live keys an expiry `overlapSeconds`
   * from now (KEY_ROTATION_OVERLAP_SECONDS), so the deployments still holding an old key keep
   * working while they are given the new one; 0 ends them at once.
   */
  async rotateKey(tenantId: string, overlapSeconds: number): Promise<{ tenant: TenantRecord; apiKey: string; key: ApiKeyRecord }> {
    const tenant = await this.get(tenantId);
    if (!tenant) throw new SluiceError('NOT_FOUND', `no tenant with id ${tenantId}`);
    const apiKey = generateTenantKey(this.keyChecksumSecret);
    const key = await this.db.transaction(async (tx) => {
      // The tenant's row first, as createKey locks it: a key made during a rotation is either seen
      // here (and given the overlap's end) or made after it (and bounded by its maker's new expiry).
      await tx.select({ id: tenants.id }).from(tenants).where(eq(tenants.id, tenantId)).for('update');
      const live = await tx
        .select({ id: tenantApiKeys.id, expiresAt: tenantApiKeys.expiresAt })
        .from(tenantApiKeys)
        .where(and(eq(tenantApiKeys.tenantId, tenantId), keyIsLive()))
        .for('update');
      const now = new Date();
      for (const k of live) {
        await tx.update(tenantApiKeys).set({ expiresAt: rotationExpiry(k.expiresAt, now, overlapSeconds) }).where(eq(tenantApiKeys.id, k.id));
      }
      const [row] = await tx
        .insert(tenantApiKeys)
        .values({ tenantId, name: `rotated ${now.toISOString()}`, keyHash: hashSecret(apiKey), keyPrefix: apiKey.slice(0, 10) })
        .returning();
      // Every node forgets the old keys' cached expiry (tenants/key-cache.ts) and closes the open
      // subscriptions of keys that no longer authenticate (http/ws-auth.ts), once this commits.
      await notifyAuth(tx, tenantId);
      return toKeyRecord(row!);
    });
    this.authChanged(tenantId);
    return { tenant, apiKey, key };
  }

  /**
   * A new named key for the tenant; its secret is returned once and stored as a hash. `makerKeyId`:
   * the tenant key asking (null: the admin token). The new key is bounded by that key as the
   * database has it now, not as a cache remembers it (boundByMaker): a rotation that just gave it
   * an expiry, or a revocation, counts at once.
   */
  async createKey(
    tenantId: string,
    input: { name: string; scopes: Scope[]; expiresAt: Date | null },
    makerKeyId: string | null = null,
  ): Promise<{ key: ApiKeyRecord; secret: string; expiresAtShortened: boolean }> {
    const secret = generateTenantKey(this.keyChecksumSecret);
    let expiresAtShortened = false;
    const key = await this.db.transaction(async (tx) => {
      // The tenant's row, locked: concurrent creations count the live keys one after the other (and
      // a rotation, which locks it too, is wholly before or after).
      const [tenant] = await tx.select({ id: tenants.id }).from(tenants).where(eq(tenants.id, tenantId)).for('update');
      if (!tenant) throw new SluiceError('NOT_FOUND', `no tenant with id ${tenantId}`);
      let expiresAt = input.expiresAt;
      if (makerKeyId !== null) {
        const [maker] = await tx
          .select({ scopes: tenantApiKeys.scopes, expiresAt: tenantApiKeys.expiresAt })
          .from(tenantApiKeys)
          .where(and(eq(tenantApiKeys.id, makerKeyId), eq(tenantApiKeys.tenantId, tenantId), keyIsLive()));
        if (!maker) throw new SluiceError('UNAUTHENTICATED', 'this API key was revoked or has expired');
        const bound = boundByMaker(input, { scopes: maker.scopes as Scope[], expiresAtMs: maker.expiresAt?.getTime() ?? null }, new Date());
        expiresAt = bound.expiresAt;
        expiresAtShortened = bound.expiresAtShortened;
      }
      const [{ live }] = (await tx.select({ live: sql<number>`count(*)::int` }).from(tenantApiKeys).where(and(eq(tenantApiKeys.tenantId, tenantId), keyIsLive()))) as [{ live: number }];
      if (live >= MAX_LIVE_KEYS) {
        throw new SluiceError('BAD_USER_INPUT', `a tenant has at most ${MAX_LIVE_KEYS} live keys: revoke one first`, { field: 'name', maxKeys: MAX_LIVE_KEYS });
      }
      const [row] = await tx
        .insert(tenantApiKeys)
        .values({ tenantId, name: input.name, scopes: input.scopes, expiresAt, keyHash: hashSecret(secret), keyPrefix: secret.slice(0, 10) })
        .returning();
      // Every node forgets the keys it saw unknown: the new key may be one of them.
      await notifyAuth(tx, tenantId);
      return toKeyRecord(row!);
    });
    this.authChanged(tenantId);
    return { key, secret, expiresAtShortened };
  }

  /** The tenant's keys, oldest first, revoked and expired ones included (never a secret). */
  async listKeys(tenantId: string): Promise<ApiKeyRecord[]> {
    const rows = await this.db.select().from(tenantApiKeys).where(eq(tenantApiKeys.tenantId, tenantId)).orderBy(asc(tenantApiKeys.createdAt), asc(tenantApiKeys.id));
    return rows.map(toKeyRecord);
  }

  /**
   * Revokes one key (`tenantId` null: the admin, any tenant's). Revoking a revoked key answers it
   * as it is. Every node closes the key's open subscriptions once this commits (http/ws-auth.ts).
   */
  async revokeKey(tenantId: string | null, keyId: string): Promise<ApiKeyRecord> {
    const key = await this.db.transaction(async (tx) => {
      const [row] = await tx
        .update(tenantApiKeys)
        .set({ revokedAt: sql`coalesce(${tenantApiKeys.revokedAt}, now())` })
        .where(and(eq(tenantApiKeys.id, keyId), tenantId === null ? undefined : eq(tenantApiKeys.tenantId, tenantId)))
        .returning();
      if (!row) throw new SluiceError('NOT_FOUND', `no API key with id ${keyId}`);
      await notifyAuth(tx, row.tenantId);
      return toKeyRecord(row);
    });
    this.authChanged(key.tenantId);
    return key;
  }

  /**
   * Writes the keys' last use (LastUseRecorder, at most once a minute per key and process) in one
   * statement; never moves a key's lastUsedAt back (another node may have written a later one).
   */
  async recordKeyUse(uses: ReadonlyMap<string, Date>): Promise<void> {
    if (uses.size === 0) return;
    const pairs = JSON.stringify([...uses].map(([id, at]) => ({ id, at: at.toISOString() })));
    await this.db.execute(sql`
      update tenant_api_keys k set last_used_at = u.at
      from jsonb_to_recordset(${pairs}::jsonb) as u(id uuid, at timestamptz)
      where k.id = u.id and (k.last_used_at is null or k.last_used_at < u.at)`);
  }

  async update(tenantId: string, patch: TenantPatch): Promise<TenantRecord> {
    const set: Partial<typeof tenants.$inferInsert> = { updatedAt: new Date() };
    for (const key of ['name', 'tier', 'weight', 'concurrencyCap', 'monthlyQuota', 'queueBound', 'requestBurst', 'requestRate', 'quotaPolicy'] as const) {
      if (patch[key] !== undefined) (set as Record<string, unknown>)[key] = patch[key];
    }
    // 0 is stored as null: one way to say "no reservation".
    if (patch.reservedShare !== undefined) set.reservedShare = patch.reservedShare ? patch.reservedShare : null;
    const raises = !!patch.reservedShare;
    try {
      const row = await this.db.transaction(async (tx) => {
        if (raises) await lockReservedShares(tx);
        const [updated] = await tx.update(tenants).set(set).where(eq(tenants.id, tenantId)).returning();
        if (!updated) throw new SluiceError('NOT_FOUND', `no tenant with id ${tenantId}`);
        if (raises) await checkReservedShares(tx, tenantId);
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

  /** byKeyHash for many keys in one statement (the key cache's background refreshes): hash → key and tenant, absent when no live key has it. */
  async byKeyHashes(keyHashes: readonly string[]): Promise<Map<string, KeyHolder>> {
    if (keyHashes.length === 0) return new Map();
    const rows = await this.db
      .select({ keyHash: tenantApiKeys.keyHash, id: tenantApiKeys.id, scopes: tenantApiKeys.scopes, expiresAt: tenantApiKeys.expiresAt, tenant: tenants })
      .from(tenantApiKeys)
      .innerJoin(tenants, eq(tenants.id, tenantApiKeys.tenantId))
      .where(and(inArray(tenantApiKeys.keyHash, [...keyHashes]), keyIsLive()));
    return new Map(rows.map((r) => [r.keyHash, toHolder(r.tenant, r)]));
  }

  /** The live (unrevoked, unexpired) key with this hash and its tenant, or null. Read through the key cache (key-cache.ts). */
  async byKeyHash(keyHash: string): Promise<KeyHolder | null> {
    const [row] = await this.db
      .select({ id: tenantApiKeys.id, scopes: tenantApiKeys.scopes, expiresAt: tenantApiKeys.expiresAt, tenant: tenants })
      .from(tenantApiKeys)
      .innerJoin(tenants, eq(tenants.id, tenantApiKeys.tenantId))
      .where(and(eq(tenantApiKeys.keyHash, keyHash), keyIsLive()));
    return row ? toHolder(row.tenant, row) : null;
  }
}
