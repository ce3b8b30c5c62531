/**
 * Secrets Sluice hands out (tenant API keys, the admin token): shown once,
 * stored only as a SHA-256 hash. The keys are 256 random bits, so a plain hash
 * is enough; a slow KDF would only add latency to every request.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';

export const TENANT_KEY_PREFIX = 'slc_';
export const ADMIN_TOKEN_PREFIX = 'slcadm_';

export function generateSecret(prefix: string): string {
  return prefix + randomBytes(32).toString('base64url');
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
