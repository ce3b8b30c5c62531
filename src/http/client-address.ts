/**
 * The client's address as seen through the proxies this deployment trusts
 * (TRUST_PROXY). Pure: the socket's peer and the request's forwarding header
 * in, one address out.
 *
 * The address list is the peer, then the forwarding header's entries from the
 * right (each proxy appends the address it received the request from). The
 * walk starts at the peer and moves left while the address it stands on is
 * trusted; the first untrusted address is the client. Whatever lies further
 * left was written by the client itself and is never believed (the way
 * Express's proxy-addr works). An entry that is not an IP address (RFC 7239's
 * obfuscated identifiers such as `_hidden`, `unknown`, garbage) stops the
 * walk: the address is then the last proxy's, which is where the request
 * demonstrably came from.
 *
 * Trust is one of:
 *  - none (the default): the peer is the client, forwarding headers are ignored;
 *  - a hop count n: the n addresses nearest the server (the peer first) are proxies;
 *  - a list of addresses and CIDR ranges: any address inside them is a proxy.
 *
 * Only one header is read (TRUST_PROXY_HEADER): a proxy that appends to
 * X-Forwarded-For leaves a `Forwarded` header from the client untouched, so
 * reading both would let a client choose its own address.
 */
import { isIP } from 'node:net';

export type TrustProxy = { kind: 'none' } | { kind: 'hops'; hops: number } | { kind: 'ranges'; ranges: readonly Range[] };

export type ForwardedHeader = 'x-forwarded-for' | 'forwarded';

interface Range {
  /** 4 or 16 bytes. */
  bytes: Uint8Array;
  prefix: number;
  text: string;
}

/** Named ranges accepted in TRUST_PROXY besides CIDRs. */
const NAMED: Record<string, string[]> = {
  loopback: ['127.0.0.0/8', '::1/128'],
  private: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', 'fc00::/7'],
  linklocal: ['169.254.0.0/16', 'fe80::/10'],
};

/**
 * TRUST_PROXY's value → what is trusted; throws an Error naming the bad part. Pure.
 * Empty, `false`, `0`, `none`: nothing. A whole number: that many hops. Otherwise
 * a comma-separated list of IPs, CIDRs and the names loopback, private, linklocal.
 * `true` is refused: trusting every hop lets any client choose its address.
 */
export function parseTrustProxy(value: string | undefined): TrustProxy {
  const v = (value ?? '').trim().toLowerCase();
  if (v === '' || v === 'false' || v === 'none' || v === '0' || v === 'no') return { kind: 'none' };
  if (v === 'true' || v === 'yes' || v === '*') {
    throw new Error('trusting every hop lets any client choose its own address: give the number of proxies in front of Sluice (e.g. 1) or their addresses (e.g. 10.0.0.0/8)');
  }
  if (/^\d+$/.test(v)) {
    const hops = Number(v);
    if (!Number.isSafeInteger(hops) || hops > 32) throw new Error(`${v} hops: at most 32`);
    return { kind: 'hops', hops };
  }
  const ranges: Range[] = [];
  for (const part of v.split(',').map((s) => s.trim()).filter(Boolean)) {
    for (const text of NAMED[part] ?? [part]) {
      const range = parseRange(text);
      if (!range) throw new Error(`"${part}" is neither an IP address, a CIDR range (10.0.0.0/8, fd00::/8), a hop count, nor one of ${Object.keys(NAMED).join(', ')}`);
      ranges.push(range);
    }
  }
  return ranges.length === 0 ? { kind: 'none' } : { kind: 'ranges', ranges };
}

function parseRange(text: string): Range | null {
  const slash = text.indexOf('/');
  const ip = slash < 0 ? text : text.slice(0, slash);
  const bytes = ipBytes(ip);
  if (!bytes) return null;
  const max = bytes.length * 8;
  const prefixText = slash < 0 ? String(max) : text.slice(slash + 1);
  if (!/^\d{1,3}$/.test(prefixText)) return null;
  const prefix = Number(prefixText);
  if (prefix > max) return null;
  return { bytes, prefix, text };
}

/** An IP address's bytes (IPv4-mapped IPv6 as IPv4), or null when it is not one. Pure. */
export function ipBytes(address: string): Uint8Array | null {
  const a = normalizeAddress(address);
  if (a === null) return null;
  if (isIP(a) === 4) return Uint8Array.from(a.split('.').map(Number));
  const [head, tail = null] = a.includes('::') ? a.split('::') : [a, null];
  const groups = (s: string) => (s === '' ? [] : s.split(':'));
  let left = groups(head!);
  let right = tail === null ? [] : groups(tail);
  // An embedded IPv4 tail (::a.b.c.d) is two groups.
  const expand = (g: string[]) => g.flatMap((x) => (x.includes('.') ? (() => { const [p, q, r, s] = x.split('.').map(Number); return [((p! << 8) | q!).toString(16), ((r! << 8) | s!).toString(16)]; })() : [x]));
  left = expand(left);
  right = expand(right);
  const fill = tail === null ? [] : Array.from({ length: 8 - left.length - right.length }, () => '0');
  const all = [...left, ...fill, ...right];
  if (all.length !== 8) return null;
  const out = new Uint8Array(16);
  all.forEach((g, i) => {
    const n = parseInt(g, 16);
    out[i * 2] = n >> 8;
    out[i * 2 + 1] = n & 0xff;
  });
  return out;
}

/**
 * An address as the budget keys it: IPv4-mapped IPv6 (`::ffff:10.0.0.1`, how a
 * dual-stack socket reports IPv4 peers) as plain IPv4, IPv6 lower-cased, a zone
 * id dropped; null when it is not an IP address. Pure.
 */
export function normalizeAddress(address: string): string | null {
  let a = address.trim().toLowerCase();
  const zone = a.indexOf('%');
  if (zone >= 0) a = a.slice(0, zone);
  const mapped = /^::ffff:(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})$/.exec(a);
  if (mapped) a = mapped[1]!;
  return isIP(a) === 0 ? null : a;
}

function inRange(bytes: Uint8Array, r: Range): boolean {
  if (bytes.length !== r.bytes.length) return false;
  const full = r.prefix >> 3;
  for (let i = 0; i < full; i++) if (bytes[i] !== r.bytes[i]) return false;
  const rest = r.prefix & 7;
  if (rest === 0) return true;
  const mask = (0xff << (8 - rest)) & 0xff;
  return (bytes[full]! & mask) === (r.bytes[full]! & mask);
}

/**
 * One forwarded-for node → an IP address, or null (an obfuscated identifier,
 * `unknown`, or not an address). Accepts `1.2.3.4`, `1.2.3.4:80`, `[2001:db8::1]`,
 * `[2001:db8::1]:443`, bare IPv6, each optionally quoted. Pure.
 */
export function parseNode(node: string): string | null {
  let n = node.trim();
  if (n.startsWith('"') && n.endsWith('"') && n.length >= 2) n = n.slice(1, -1).replace(/\\(.)/g, '$1');
  if (n.startsWith('[')) {
    const end = n.indexOf(']');
    if (end < 0) return null;
    const rest = n.slice(end + 1);
    if (rest !== '' && !/^:(\d{1,5}|_[A-Za-z0-9._-]+)$/.test(rest)) return null;
    const v6 = normalizeAddress(n.slice(1, end));
    return v6 !== null && v6.includes(':') ? v6 : null;
  }
  const v4port = /^(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})(?::(?:\d{1,5}|_[A-Za-z0-9._-]+))?$/.exec(n);
  if (v4port) return normalizeAddress(v4port[1]!);
  return normalizeAddress(n); // bare IPv6 (X-Forwarded-For writes it without brackets)
}

/** X-Forwarded-For (all its lines, in order) → its entries, left to right. Pure. */
export function parseXForwardedFor(values: readonly string[]): string[] {
  return values.flatMap((v) => v.split(',')).map((s) => s.trim());
}

/**
 * RFC 7239 Forwarded (all its lines, in order) → each element's `for=` node,
 * left to right; an element without `for=` or one that cannot be read is an
 * empty string (it stops the walk like an obfuscated identifier). Pure.
 */
export function parseForwarded(values: readonly string[]): string[] {
  const out: string[] = [];
  for (const value of values) {
    // Split on commas and semicolons outside quoted strings.
    let element: string[] = [];
    let pair = '';
    let quoted = false;
    const endPair = () => {
      element.push(pair.trim());
      pair = '';
    };
    const endElement = () => {
      endPair();
      let forNode = '';
      for (const p of element) {
        const eq = p.indexOf('=');
        if (eq > 0 && p.slice(0, eq).trim().toLowerCase() === 'for') forNode = p.slice(eq + 1).trim();
      }
      out.push(forNode);
      element = [];
    };
    for (let i = 0; i < value.length; i++) {
      const c = value[i]!;
      if (quoted) {
        pair += c;
        if (c === '\\' && i + 1 < value.length) pair += value[++i];
        else if (c === '"') quoted = false;
      } else if (c === '"') {
        quoted = true;
        pair += c;
      } else if (c === ';') endPair();
      else if (c === ',') endElement();
      else pair += c;
    }
    endElement();
  }
  return out;
}

/**
 * The client's address: the peer, or, when the peer is a trusted proxy, the
 * forwarded entry it names, and so on leftwards (see the header). `peer`
 * undefined (a destroyed socket) is 'unknown'. Pure.
 */
export function clientAddress(peer: string | undefined, forwarded: readonly string[], trust: TrustProxy): string {
  const start = peer === undefined ? null : normalizeAddress(peer);
  if (start === null) return peer ?? 'unknown';
  if (trust.kind === 'none') return start;
  let address = start;
  let hop = 0;
  for (let i = forwarded.length - 1; i >= 0; i--) {
    const trusted = trust.kind === 'hops' ? hop < trust.hops : trust.ranges.some((r) => inRange(ipBytes(address)!, r));
    if (!trusted) return address;
    const next = parseNode(forwarded[i]!);
    if (next === null) return address; // an obfuscated or unreadable entry: the proxy that wrote it is what we know
    address = next;
    hop++;
  }
  return address;
}

/** The forwarding header's values from Node's headers (`x-forwarded-for` is joined by Node; `forwarded` too). */
export function forwardedEntries(headers: Record<string, string | string[] | undefined>, header: ForwardedHeader): string[] {
  const raw = headers[header];
  const values = raw === undefined ? [] : Array.isArray(raw) ? raw : [raw];
  return header === 'forwarded' ? parseForwarded(values) : parseXForwardedFor(values);
}
