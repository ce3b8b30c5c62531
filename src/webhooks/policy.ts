/**
 * Webhook decisions, pure: which endpoint URLs and addresses may be called (server-side request
 * forgery), when a failed delivery is tried again, when an endpoint is disabled, and the body of
 * a job event. The I/O around them: store.ts (the tables), deliver.ts (HTTP), sender.ts (the loop).
 */
import { isIP } from 'node:net';

export const WEBHOOK_EVENTS = ['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED'] as const;
export type WebhookEvent = (typeof WEBHOOK_EVENTS)[number];
export const DELIVERY_STATUSES = ['PENDING', 'SENDING', 'SUCCEEDED', 'FAILED'] as const;
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number];

export const MAX_URL_LENGTH = 2048;

/** Why a URL is refused (null: accepted). Only literal addresses are judged here; names are resolved and checked at each delivery. */
export function urlRefusal(raw: string, allowPrivate: boolean): string | null {
  if (raw.length > MAX_URL_LENGTH) return `url must be at most ${MAX_URL_LENGTH} characters`;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return 'url is not a valid absolute URL';
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') return 'url must be https';
  if (url.protocol === 'http:' && !allowPrivate) return 'url must be https (plain http only with WEBHOOK_ALLOW_PRIVATE=true)';
  if (url.username || url.password) return 'url must not carry credentials';
  if (url.hash) return 'url must not have a fragment';
  const host = url.hostname.replace(/^\[|\]$/g, '');
  if (isIP(host) && !allowPrivate && isPrivateAddress(host)) return `url names a private, loopback or link-local address (${host}); allowed only with WEBHOOK_ALLOW_PRIVATE=true`;
  return null;
}

/** IPv4 blocks no webhook may reach: this network, private, shared (CGNAT), loopback, link-local, benchmarking, multicast, reserved. */
const V4_BLOCKED: ReadonlyArray<[number, number]> = [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
].map(([a, bits]) => [v4ToInt(a as string), bits as number]);

function v4ToInt(a: string): number {
  return a.split('.').reduce((n, part) => n * 256 + Number(part), 0);
}

function v4Blocked(a: string): boolean {
  const n = v4ToInt(a);
  return V4_BLOCKED.some(([base, bits]) => Math.floor(n / 2 ** (32 - bits)) === Math.floor(base / 2 ** (32 - bits)));
}

/** The 16 bytes of an IPv6 address (with an embedded dotted IPv4 tail), or null. */
function v6Bytes(a: string): number[] | null {
  let s = a.split('%')[0]!.toLowerCase();
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (dotted) {
    const n = v4ToInt(dotted[1]!);
    s = s.slice(0, -dotted[1]!.length) + `${(n >>> 16).toString(16)}:${(n & 0xffff).toString(16)}`;
  }
  const [head, tail] = s.includes('::') ? s.split('::') : [s, null];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups = tail === null ? h : [...h, ...Array(8 - h.length - t.length).fill('0'), ...t];
  if (groups.length !== 8) return null;
  return groups.flatMap((g) => {
    const v = parseInt(g, 16);
    return [v >> 8, v & 0xff];
  });
}

/** True for any address a webhook must not reach without WEBHOOK_ALLOW_PRIVATE (unparseable counts as private). */
export function isPrivateAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return v4Blocked(address);
  if (family !== 6) return true;
  const b = v6Bytes(address);
  if (!b) return true;
  const zeroTo = (n: number) => b.slice(0, n).every((x) => x === 0);
  if (zeroTo(15) && (b[15] === 0 || b[15] === 1)) return true; // :: and ::1
  // IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d) and NAT64 (64:ff9b::/96): judge the IPv4 inside.
  const v4 = () => `${b[12]}.${b[13]}.${b[14]}.${b[15]}`;
  if (zeroTo(10) && b[10] === 0xff && b[11] === 0xff) return v4Blocked(v4());
  if (zeroTo(12)) return v4Blocked(v4());
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && b.slice(4, 12).every((x) => x === 0)) return v4Blocked(v4());
  if ((b[0]! & 0xfe) === 0xfc) return true; // fc00::/7 unique local
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0x80) return true; // fe80::/10 link-local
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0xc0) return true; // fec0::/10 site-local (deprecated)
  if (b[0] === 0xff) return true; // multicast
  if (b[0] === 0x20 && b[1] === 0x01 && b[2] === 0x0d && b[3] === 0xb8) return true; // documentation
  return false;
}

export interface RetryPolicy {
  /** The first retry's delay; each next one doubles, up to maxMs. */
  baseMs: number;
  maxMs: number;
  /** A delivery still failing this long after its event is given up (FAILED). */
  retryForMs: number;
}

/**
 * What a finished attempt leaves the delivery as. attempts counts this one; ageMs is how long ago
 * its event happened (both clocks Postgres's, so nodes' clocks do not matter).
 */
export function afterAttempt(ok: boolean, attempts: number, ageMs: number, policy: RetryPolicy): { status: 'SUCCEEDED' | 'FAILED' } | { status: 'PENDING'; retryInMs: number } {
  if (ok) return { status: 'SUCCEEDED' };
  const delay = Math.min(policy.maxMs, policy.baseMs * 2 ** Math.min(30, Math.max(0, attempts - 1)));
  if (ageMs + delay > policy.retryForMs) return { status: 'FAILED' };
  return { status: 'PENDING', retryInMs: delay };
}

/** An endpoint failing without a single success since failingSince is disabled after disableAfterMs. */
export function shouldDisable(failingSince: Date, now: Date, disableAfterMs: number): boolean {
  return now.getTime() - failingSince.getTime() >= disableAfterMs;
}

/** A 2xx answer is a delivery; anything else (3xx included: redirects are not followed) is retried. */
export function isDelivered(status: number): boolean {
  return status >= 200 && status < 300;
}

/** The job row as sluice_job_json gives it (the fields an event carries). */
export interface JobJson {
  id: string;
  api: string;
  params: unknown;
  priority: string;
  state: string;
  idempotencyKey: string | null;
  /** Absent in rows stored before fairness keys. */
  fairnessKey?: string | null;
  attempts: number;
  createdAt: string;
  startedAt: string | null;
  finishedAt: string | null;
  result: unknown;
  errorCode: string | null;
  errorMessage: string | null;
  httpStatus: number | null;
  creditsBilled: number;
}

/**
 * The JSON body of a job event: `{ type, timestamp, data }`. Its timestamp is the job's finish,
 * so every retry of a delivery (built from the same stored row) sends the same bytes.
 */
export function eventBody(event: string, job: JobJson, fallbackAt: Date): string {
  const type = 'job.' + event.replace(/^JOB_/, '').toLowerCase();
  return JSON.stringify({
    type,
    timestamp: job.finishedAt ? new Date(job.finishedAt).toISOString() : fallbackAt.toISOString(),
    data: {
      id: job.id,
      state: job.state,
      api: job.api,
      priority: job.priority,
      params: job.params ?? null,
      idempotencyKey: job.idempotencyKey,
      fairnessKey: job.fairnessKey ?? null,
      result: job.state === 'SUCCEEDED' ? (job.result ?? null) : null,
      error: job.errorCode && job.state !== 'SUCCEEDED' ? { code: job.errorCode, message: job.errorMessage ?? job.errorCode } : null,
      httpStatus: job.httpStatus,
      creditsBilled: job.creditsBilled,
      attempts: job.attempts,
      createdAt: new Date(job.createdAt).toISOString(),
      startedAt: job.startedAt ? new Date(job.startedAt).toISOString() : null,
      finishedAt: job.finishedAt ? new Date(job.finishedAt).toISOString() : null,
    },
  });
}
