/**
 * Named API keys: what a key may do (its scopes), whether it still
 * authenticates, and when its last use is worth writing down. Pure: the
 * store (tenants/store.ts) reads and writes the rows, the key cache
 * (tenants/key-cache.ts) keeps them per process.
 */
import { SluiceError } from '../errors.ts';
import type { TenantRecord } from './policy.ts';

/** SUBMIT: submit, cancel and retry jobs. READ: queries, subscriptions, and what jobs carry (params, results). */
export const SCOPES = ['SUBMIT', 'READ'] as const;
export type Scope = (typeof SCOPES)[number];

/**
 * Managing keys and webhook endpoints needs both scopes: a new key could do everything, and an
 * endpoint receives every job's params and result, so a narrower key must not create or redirect one.
 */
export const MANAGE: readonly Scope[] = ['SUBMIT', 'READ'];

/** What a presented key carries besides its tenant (cached with it). */
export interface KeyGrant {
  id: string;
  scopes: readonly Scope[];
  /** Epoch ms after which the key no longer authenticates; null: until revoked. */
  expiresAtMs: number | null;
}

/** A live key and its tenant: what one key-cache entry holds. */
export interface KeyHolder {
  tenant: TenantRecord;
  key: KeyGrant;
}

/** A key as listed (never its secret). */
export interface ApiKeyRecord {
  id: string;
  tenantId: string;
  name: string;
  /** The first characters of the secret, to tell keys apart. */
  prefix: string;
  scopes: Scope[];
  createdAt: Date;
  expiresAt: Date | null;
  lastUsedAt: Date | null;
  revokedAt: Date | null;
}

/** At most this many unrevoked keys per tenant: a leaked admin script cannot mint keys without end. */
export const MAX_LIVE_KEYS = 50;

/** Whether a cached key still authenticates at `nowMs` (expiry is checked per request, not per cache entry). Pure. */
export function keyLive(key: KeyGrant, nowMs: number): boolean {
  return key.expiresAtMs === null || key.expiresAtMs > nowMs;
}

/** The scopes among `needed` this key lacks. Pure. */
export function missingScopes(key: KeyGrant, needed: Iterable<Scope>): Scope[] {
  const missing: Scope[] = [];
  for (const s of needed) if (!key.scopes.includes(s) && !missing.includes(s)) missing.push(s);
  return missing;
}

/** When a rotation's old keys stop working: `overlapSeconds` from now, or sooner if they already expire sooner. Pure. */
export function rotationExpiry(current: Date | null, now: Date, overlapSeconds: number): Date {
  const end = new Date(now.getTime() + overlapSeconds * 1000);
  return current !== null && current < end ? current : end;
}

/** LAST_USED_INTERVAL_MS: a key's lastUsedAt is written at most this often per process. */
export const LAST_USED_INTERVAL_MS = 60_000;

/** Whether this use of a key should be written down (its last write was at least `intervalMs` ago). Pure. */
export function lastUseDue(lastWrittenMs: number | undefined, nowMs: number, intervalMs = LAST_USED_INTERVAL_MS): boolean {
  return lastWrittenMs === undefined || nowMs - lastWrittenMs >= intervalMs;
}

/** A createApiKey input, checked: a name of 1-100 characters, at least one known scope, an expiry in the future. Pure. */
export function checkNewKey(input: { name: string; scopes: readonly string[]; expiresAt?: Date | null | undefined }, now: Date): { name: string; scopes: Scope[]; expiresAt: Date | null } {
  const name = input.name.trim();
  if (name.length < 1 || name.length > 100) throw new SluiceError('BAD_USER_INPUT', 'name must be 1 to 100 characters', { field: 'name' });
  const scopes = [...new Set(input.scopes)];
  if (scopes.length === 0) throw new SluiceError('BAD_USER_INPUT', 'a key needs at least one scope (SUBMIT, READ)', { field: 'scopes' });
  for (const s of scopes) if (!(SCOPES as readonly string[]).includes(s)) throw new SluiceError('BAD_USER_INPUT', `unknown scope ${s}: SUBMIT or READ`, { field: 'scopes' });
  const expiresAt = input.expiresAt ?? null;
  if (expiresAt !== null && !(expiresAt.getTime() > now.getTime())) {
    throw new SluiceError('BAD_USER_INPUT', 'expiresAt must be in the future', { field: 'expiresAt' });
  }
  return { name, scopes: SCOPES.filter((s) => scopes.includes(s)), expiresAt };
}

/**
 * What a new key made with a tenant key may be: never more than its maker. Its scopes must be
 * among the maker's (FORBIDDEN otherwise: a key cannot grant what it lacks), and it ends no later
 * than the maker does: a key requested without an end, or with a later one, is given the maker's
 * (`expiresAtShortened` says so). For a key in a rotation's overlap that is the overlap's end, so a
 * leaked key cannot outlive the rotation meant to evict it. `maker` null: the admin token, which is
 * not bounded. Pure.
 */
export function boundByMaker(
  key: { scopes: readonly Scope[]; expiresAt: Date | null },
  maker: Pick<KeyGrant, 'scopes' | 'expiresAtMs'> | null,
  now: Date,
): { expiresAt: Date | null; expiresAtShortened: boolean } {
  if (maker === null) return { expiresAt: key.expiresAt, expiresAtShortened: false };
  const missing = missingScopes({ id: '', scopes: maker.scopes, expiresAtMs: null }, key.scopes);
  if (missing.length > 0) {
    throw new SluiceError('FORBIDDEN', `a key cannot grant a scope it lacks: this key has no ${missing.join(' or ')} scope`, { field: 'scopes', missingScopes: missing });
  }
  if (maker.expiresAtMs === null) return { expiresAt: key.expiresAt, expiresAtShortened: false };
  if (maker.expiresAtMs <= now.getTime()) throw new SluiceError('UNAUTHENTICATED', 'this API key has expired');
  if (key.expiresAt !== null && key.expiresAt.getTime() <= maker.expiresAtMs) return { expiresAt: key.expiresAt, expiresAtShortened: false };
  return { expiresAt: new Date(maker.expiresAtMs), expiresAtShortened: true };
}
