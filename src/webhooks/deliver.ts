/**
 * One webhook POST. The host name is resolved once, every address it gives is checked
 * (policy.ts isPrivateAddress) and the connection goes to the checked address: the `lookup`
 * hook hands Node the address we judged, so nothing resolves the name a second time (a DNS
 * answer that changes between a check and a connect cannot send us elsewhere). A kept-alive
 * socket is reused only for the same host and port, already connected to a checked address.
 * Redirects are not followed. The answer's body is read and dropped, up to a small bound.
 */
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { isIP, type LookupFunction } from 'node:net';
import { isPrivateAddress } from './policy.ts';

export type DeliveryResult =
  | { kind: 'answer'; status: number }
  | { kind: 'error'; error: 'TIMEOUT' | 'ADDRESS_REFUSED' | 'CONNECTION_FAILED' | 'BAD_URL'; message: string };

export interface DeliverOptions {
  timeoutMs: number;
  allowPrivate: boolean;
}

class Refused extends Error {}

/** A lookup that refuses private addresses (all of them, if any one is: a mixed answer is a rebinding attempt). */
function checkedLookup(allowPrivate: boolean): LookupFunction {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { all: true, family: options.family, hints: options.hints }, (err, addresses) => {
      if (err) return (callback as (e: Error) => void)(err);
      const refused = allowPrivate ? [] : addresses.filter((a) => isPrivateAddress(a.address));
      if (refused.length > 0 || addresses.length === 0) {
        return (callback as (e: Error) => void)(new Refused(`${hostname} resolves to a private, loopback or link-local address (${refused[0]?.address ?? 'none'})`));
      }
      if (options.all) return (callback as (e: null, a: dns.LookupAddress[]) => void)(null, addresses);
      (callback as (e: null, a: string, f: number) => void)(null, addresses[0]!.address, addresses[0]!.family);
    });
  };
}

export class WebhookClient {
  private readonly http: http.Agent;
  private readonly https: https.Agent;
  private readonly lookup: LookupFunction;
  private readonly opts: DeliverOptions & { maxSockets: number };
  constructor(opts: DeliverOptions & { maxSockets: number }) {
    this.opts = opts;
    this.lookup = checkedLookup(opts.allowPrivate);
    this.http = new http.Agent({ keepAlive: true, maxSockets: opts.maxSockets, lookup: this.lookup } as http.AgentOptions);
    this.https = new https.Agent({ keepAlive: true, maxSockets: opts.maxSockets, lookup: this.lookup } as https.AgentOptions);
  }

  close(): void {
    this.http.destroy();
    this.https.destroy();
  }

  post(rawUrl: string, headers: Record<string, string>, body: string): Promise<DeliveryResult> {
    let url: URL;
    try {
      url = new URL(rawUrl);
    } catch {
      return Promise.resolve({ kind: 'error', error: 'BAD_URL', message: 'not a valid URL' });
    }
    const secure = url.protocol === 'https:';
    if (!secure && (url.protocol !== 'http:' || !this.opts.allowPrivate)) {
      return Promise.resolve({ kind: 'error', error: 'BAD_URL', message: 'url must be https' });
    }
    // A literal address is never looked up by Node: judge it here.
    const literal = url.hostname.replace(/^\[|\]$/g, '');
    if (isIP(literal) && !this.opts.allowPrivate && isPrivateAddress(literal)) {
      return Promise.resolve({ kind: 'error', error: 'ADDRESS_REFUSED', message: `${literal} is a private, loopback or link-local address` });
    }
    const payload = Buffer.from(body);
    return new Promise<DeliveryResult>((resolve) => {
      let done = false;
      const finish = (r: DeliveryResult) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        resolve(r);
      };
      const req = (secure ? https : http).request(url, {
        method: 'POST',
        agent: secure ? this.https : this.http,
        lookup: this.lookup,
        headers: { ...headers, 'content-type': 'application/json', 'content-length': String(payload.length), 'user-agent': 'Sluice-Webhooks/1' },
      });
      // The whole exchange (connect, send, answer headers) within the timeout.
      const timer = setTimeout(() => {
        finish({ kind: 'error', error: 'TIMEOUT', message: `no answer within ${this.opts.timeoutMs} ms` });
        req.destroy();
      }, this.opts.timeoutMs);
      req.on('response', (res) => {
        finish({ kind: 'answer', status: res.statusCode ?? 0 });
        let read = 0;
        res.on('data', (chunk: Buffer) => {
          read += chunk.length;
          if (read > 64 * 1024) res.destroy();
        });
        res.on('error', () => {});
      });
      req.on('error', (err) => {
        if (err instanceof Refused || (err as { cause?: unknown }).cause instanceof Refused) finish({ kind: 'error', error: 'ADDRESS_REFUSED', message: err.message });
        else finish({ kind: 'error', error: 'CONNECTION_FAILED', message: err.message });
      });
      req.end(payload);
    });
  }
}
