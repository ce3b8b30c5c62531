/**
 * Signing secrets encrypted at rest. The sender needs each endpoint's secret itself (an HMAC key,
 * unlike API keys, which are stored hashed), so it is stored encrypted with AES-256-GCM under a key
 * the database does not hold when WEBHOOK_SECRET_KEY is set. Stored form:
 * `v1:<keyId>:<iv>:<tag>:<ciphertext>` (base64url; keyId: the first 8 hex of SHA-256 of the key),
 * so a row says which key sealed it. A value without the `v1:` prefix is a plaintext secret written
 * before encryption: still readable, and sealed by the start's pass (resealSecrets in store.ts).
 *
 * Several keys open; the first seals. Key rotation: set the new key as WEBHOOK_SECRET_KEY and the
 * old one as WEBHOOK_SECRET_KEY_PREVIOUS; each start reseals every secret not under the new key, after
 * which the previous key can be removed.
 */
import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';

const VERSION = 'v1';
/** Binds a ciphertext to its use: a sealed webhook secret opens as nothing else. */
const AAD = Buffer.from('sluice webhook signing secret');

export class SecretKeyError extends Error {
  override name = 'SecretKeyError';
}

/** A 32-byte key from base64 (or base64url) or hex; throws a SecretKeyError saying what is wrong. */
export function parseSecretKey(text: string): Buffer {
  const t = text.trim();
  const key = /^[0-9a-fA-F]{64}$/.test(t) ? Buffer.from(t, 'hex') : Buffer.from(t.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
  if (key.length !== 32) throw new SecretKeyError(`must be 32 bytes, as 64 hex digits or base64 (got ${key.length} bytes); make one with: openssl rand -base64 32`);
  return key;
}

export function keyId(key: Buffer): string {
  return createHash('sha256').update(key).digest('hex').slice(0, 8);
}

export function isSealed(stored: string): boolean {
  return stored.startsWith(`${VERSION}:`);
}

export class SecretBox {
  private readonly keys: Array<{ id: string; key: Buffer }>;

  /** keys: the sealing key first, then those that still open older rows. */
  constructor(keys: readonly Buffer[]) {
    if (keys.length === 0) throw new SecretKeyError('a secret box needs a key');
    this.keys = keys.map((key) => ({ id: keyId(key), key }));
  }

  /** The id of the key that seals: a row sealed under it needs no resealing. */
  get sealingKeyId(): string {
    return this.keys[0]!.id;
  }

  seal(plain: string): string {
    const { id, key } = this.keys[0]!;
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', key, iv).setAAD(AAD);
    const ct = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()]);
    return [VERSION, id, iv.toString('base64url'), cipher.getAuthTag().toString('base64url'), ct.toString('base64url')].join(':');
  }

  /** The secret; a legacy plaintext value as is. Throws a SecretKeyError when no key opens it. */
  open(stored: string): string {
    if (!isSealed(stored)) return stored;
    const [, id, iv, tag, ct] = stored.split(':');
    const entry = this.keys.find((k) => k.id === id);
    if (!entry || iv === undefined || tag === undefined || ct === undefined) {
      throw new SecretKeyError(`a webhook secret is sealed under key ${id}, which is not configured (WEBHOOK_SECRET_KEY / WEBHOOK_SECRET_KEY_PREVIOUS)`);
    }
    try {
      const decipher = createDecipheriv('aes-256-gcm', entry.key, Buffer.from(iv, 'base64url')).setAAD(AAD);
      decipher.setAuthTag(Buffer.from(tag, 'base64url'));
      return Buffer.concat([decipher.update(Buffer.from(ct, 'base64url')), decipher.final()]).toString('utf8');
    } catch {
      throw new SecretKeyError(`a webhook secret sealed under key ${id} does not open (damaged)`);
    }
  }

  /** True when the value is sealed under the sealing key (nothing to redo). */
  isCurrent(stored: string): boolean {
    return stored.startsWith(`${VERSION}:${this.sealingKeyId}:`);
  }
}
