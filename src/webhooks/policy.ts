/**
 * Webhook decisions, pure: which endpoint URLs and addresses may be called (server-side request
 * forgery), when a failed delivery is tried again, when an endpoint is disabled, and the body of
 * a job event. The I/O around them: store.ts (the tables), deliver.ts (HTTP), sender.ts (the loop).
 */
import { BlockList, isIP } from 'node:net';

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
  if (isIP(host) && !allowPrivate && isPrivateAddress(host)) return `url names a private or special-use address (${host}); allowed only with WEBHOOK_ALLOW_PRIVATE=true`;
  return null;
}

/**
 * The special-use blocks of the IANA IPv4 Special-Purpose Address Registry (and multicast, the
 * reserved 240/4 and the limited broadcast): none is a place a tenant's receiver can legitimately
 * live, so all are refused, the few the registry marks globally reachable included (the anycast
 * services in 192.0.0.0/24, AS112, AMT, the 6to4 relay anycast).
 */
export const SPECIAL_V4: ReadonlyArray<readonly [string, number, string]> = [
  ['0.0.0.0', 8, 'this network'],
  ['10.0.0.0', 8, 'private'],
  ['100.64.0.0', 10, 'shared address space (carrier-grade NAT)'],
  ['127.0.0.0', 8, 'loopback'],
  ['169.254.0.0', 16, 'link-local (cloud metadata services)'],
  ['172.16.0.0', 12, 'private'],
  ['192.0.0.0', 24, 'IETF protocol assignments'],
  ['192.0.2.0', 24, 'documentation (TEST-NET-1)'],
  ['192.31.196.0', 24, 'AS112-v4'],
  ['192.52.193.0', 24, 'AMT'],
  ['192.88.99.0', 24, 'deprecated 6to4 relay anycast'],
  ['192.168.0.0', 16, 'private'],
  ['192.175.48.0', 24, 'direct delegation AS112 service'],
  ['198.18.0.0', 15, 'benchmarking'],
  ['198.51.100.0', 24, 'documentation (TEST-NET-2)'],
  ['203.0.113.0', 24, 'documentation (TEST-NET-3)'],
  ['224.0.0.0', 4, 'multicast'],
  ['240.0.0.0', 4, 'reserved, and the limited broadcast 255.255.255.255'],
];

/**
 * IPv6 blocks refused whole (the IANA IPv6 Special-Purpose Address Registry, and the deprecated
 * site-local and IPv4-compatible ranges). Two more are judged by the IPv4 address inside them
 * instead (isPrivateAddress): IPv4-mapped ::ffff:0:0/96 and the well-known NAT64 prefix
 * 64:ff9b::/96, which DNS64 gives every IPv4-only receiver on an IPv6-only network.
 */
export const SPECIAL_V6: ReadonlyArray<readonly [string, number, string]> = [
  ['::', 96, 'unspecified, loopback and the deprecated IPv4-compatible addresses'],
  ['::ffff:0:0:0', 96, 'IPv4-translated (SIIT)'],
  ['64:ff9b:1::', 48, 'local-use IPv4/IPv6 translation'],
  ['100::', 64, 'discard-only'],
  ['2001::', 23, 'IETF protocol assignments (Teredo 2001::/32, benchmarking, ORCHID, anycast services)'],
  ['2001:db8::', 32, 'documentation'],
  ['2002::', 16, '6to4 (the IPv4 inside is not judged: refused whole)'],
  ['3fff::', 20, 'documentation'],
  ['5f00::', 16, 'segment routing (SRv6) SIDs'],
  ['fc00::', 7, 'unique local'],
  ['fe80::', 10, 'link-local'],
  ['fec0::', 10, 'deprecated site-local'],
  ['ff00::', 8, 'multicast'],
];

const v4List = new BlockList();
for (const [a, bits] of SPECIAL_V4) v4List.addSubnet(a, bits, 'ipv4');
const v6List = new BlockList();
for (const [a, bits] of SPECIAL_V6) v6List.addSubnet(a, bits, 'ipv6');
/** Global unicast: 2000::/3. Everything else in IPv6 (but the two embedding prefixes) is unassigned or special. */
const v6Global = new BlockList();
v6Global.addSubnet('2000::', 3, 'ipv6');

/** The 16 bytes of an IPv6 address (with an embedded dotted IPv4 tail), or null. */
function v6Bytes(a: string): number[] | null {
  let s = a.toLowerCase();
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(s);
  if (dotted) {
    const [x, y, z, w] = dotted.slice(1).map(Number) as [number, number, number, number];
    s = s.slice(0, -dotted[0].length) + `${((x << 8) | y).toString(16)}:${((z << 8) | w).toString(16)}`;
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

/**
 * True for any address a webhook must not reach without WEBHOOK_ALLOW_PRIVATE (unparseable counts
 * as private). IPv4 is judged by SPECIAL_V4; IPv6 must be global unicast (2000::/3) outside
 * SPECIAL_V6, or an IPv4-mapped or NAT64 address whose IPv4 passes.
 */
export function isPrivateAddress(address: string): boolean {
  // A zone (fe80::1%eth0) names an interface, never a public address: drop it and judge the rest.
  const plain = address.split('%')[0]!;
  const family = isIP(plain);
  if (family === 4) return v4List.check(plain, 'ipv4');
  if (family !== 6) return true;
  const b = v6Bytes(plain);
  if (!b) return true;
  const v4 = () => `${b[12]}.${b[13]}.${b[14]}.${b[15]}`;
  const zero = (from: number, to: number) => b.slice(from, to).every((x) => x === 0);
  // ::ffff:a.b.c.d (IPv4-mapped) and 64:ff9b::a.b.c.d (NAT64): the connection ends at that IPv4.
  if (zero(0, 10) && b[10] === 0xff && b[11] === 0xff) return v4List.check(v4(), 'ipv4');
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && zero(4, 12)) return v4List.check(v4(), 'ipv4');
  if (v6List.check(plain, 'ipv6')) return true;
  return !v6Global.check(plain, 'ipv6');
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
  /** A traced job's traceparent (never in the body: its delivery's span joins the job's trace). */
  traceParent?: string;
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
