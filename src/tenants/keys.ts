/**
 * Secrets Sluice hands out (tenant API keys, the admin token): shown once,
 * stored only as a SHA-256 hash. The keys are 256 random bits, so a plain hash
 * is enough; a slow KDF would only add latency to every request.
 *
 * Tenant keys carry a checksum, the way GitHub's tokens do:
 * `slc_<43 characters of base64url randomness>_<8 characters of checksum>`,
 * the checksum an HMAC-SHA256 of the random part under this installation's
 * checksum secret (the `settings` table, made at first start). A key of that
 * shape whose checksum is wrong, and any token of no known shape, is refused
 * without a database lookup: guessing costs the guesser, not Postgres. Keys
 * issued before the checksum (`slc_` + 43 characters) still work and are
 * looked up as before; rotating them gives the tenant a checksummed key.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

export const TENANT_KEY_PREFIX = 'slc_';
export const ADMIN_TOKEN_PREFIX = 'slcadm_';

export function generateSecret(prefix: string): string {
  return prefix + randomBytes(32).toString('base64url');
}

/** Characters of the checksum: 48 bits, so a forged key passes one time in 2^48. */
export const CHECKSUM_CHARS = 8;
const RANDOM_CHARS = 43; // 32 bytes in base64url
const CHECKSUMMED = new RegExp(`^${TENANT_KEY_PREFIX}([A-Za-z0-9_-]{${RANDOM_CHARS}})_([A-Za-z0-9_-]{${CHECKSUM_CHARS}})$`);
const LEGACY = new RegExp(`^${TENANT_KEY_PREFIX}[A-Za-z0-9_-]{${RANDOM_CHARS}}$`);

/** The checksum of a key's random part under the installation's secret. Pure. */
export function keyChecksum(random: string, checksumSecret: string): string {
  return createHmac('sha256', checksumSecret).update(random).digest('base64url').slice(0, CHECKSUM_CHARS);
}

/** A new tenant key, with its checksum. */
export function generateTenantKey(checksumSecret: string): string {
  const random = randomBytes(32).toString('base64url');
  return `${TENANT_KEY_PREFIX}${random}_${keyChecksum(random, checksumSecret)}`;
}

/**
 * What a presented tenant-key token is, from its text alone. Pure.
 *  - `checked`: the checksummed shape with the right checksum: worth a lookup;
 *  - `legacy`: a key of the shape issued before checksums: looked up (it may be a real old key);
 *  - `forged`: the checksummed shape with a wrong checksum, or no known shape at all: refused unread.
 */
export function tenantKeyShape(token: string, checksumSecret: string): 'checked' | 'legacy' | 'forged' {
  const m = CHECKSUMMED.exec(token);
  if (m) {
    const want = Buffer.from(keyChecksum(m[1]!, checksumSecret));
    const got = Buffer.from(m[2]!);
    return want.length === got.length && timingSafeEqual(want, got) ? 'checked' : 'forged';
  }
  return LEGACY.test(token) ? 'legacy' : 'forged';
}

export function hashSecret(secret: string): string {
  return createHash('sha256').update(secret).digest('hex');
}

/** Constant-time comparison of two hex hashes. */
export function sameHash(a: string, b: string): boolean {
  const x = Buffer.from(a, 'hex');
  const y = Buffer.from(b, 'hex');
  return x.length === y.length && timingSafeEqual(x, y);
}

/** `Authorization: Bearer <token>` → the token, or null. */
export function bearerToken(header: string | null | undefined): string | null {
  if (!header) return null;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1] ?? null;
}
