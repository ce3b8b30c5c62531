/**
 * Owns the settings table, and the admin token that lives there.
 */
import type { Sql } from './client.ts';
import { randomBytes } from 'node:crypto';
import { ADMIN_TOKEN_PREFIX, generateSecret, hashSecret } from '../tenants/keys.ts';

const ADMIN_TOKEN_HASH = 'admin_token_hash';

/** A setting's value, or null when it was never written. */
export async function readSetting(sql: Sql, key: string): Promise<string | null> {
  const [row] = await sql`select value from settings where key = ${key}`;
  return (row?.value as string | undefined) ?? null;
}

export async function writeSetting(sql: Sql, key: string, value: string): Promise<void> {
  await sql`insert into settings (key, value) values (${key}, ${value}) on conflict (key) do update set value = excluded.value`;
}

/**
 * The admin token's hash. From SLUICE_ADMIN_TOKEN when set; otherwise the one
 * stored on first start. Returns `generated` only to the one process that
 * created it (the insert is race-safe), which prints it once.
 */
export async function resolveAdminToken(
  sql: Sql,
  fromEnv: string | undefined,
): Promise<{ hash: string; generated: string | null }> {
  if (fromEnv) return { hash: hashSecret(fromEnv), generated: null };
  const token = generateSecret(ADMIN_TOKEN_PREFIX);
  const inserted = await sql`
    insert into settings (key, value) values (${ADMIN_TOKEN_HASH}, ${hashSecret(token)})
    on conflict (key) do nothing
    returning value`;
  if (inserted.length > 0) return { hash: inserted[0]!.value as string, generated: token };
  const [row] = await sql`select value from settings where key = ${ADMIN_TOKEN_HASH}`;
  return { hash: row!.value as string, generated: null };
}

/** The setting's value, writing `value` first when it has none (race-safe: every caller gets the one stored). */
export async function settingOrInsert(sql: Sql, key: string, value: string): Promise<string> {
  const inserted = await sql`insert into settings (key, value) values (${key}, ${value}) on conflict (key) do nothing returning value`;
  if (inserted.length > 0) return inserted[0]!.value as string;
  return (await readSetting(sql, key))!;
}

const KEY_CHECKSUM_SECRET = 'key_checksum_secret';

/**
 * The secret tenant keys' checksums are made with (tenants/keys.ts): made once
 * on first start and kept in the settings table, the same for every process of
 * the installation (the insert is race-safe: every process reads the one that
 * won). Read once at start.
 */
export async function resolveKeyChecksumSecret(sql: Sql): Promise<string> {
  return settingOrInsert(sql, KEY_CHECKSUM_SECRET, randomBytes(32).toString('base64url'));
}
