/**
 * One webhook POST. The host name is resolved once, every address it gives is checked
 * (policy.ts isPrivateAddress) and the connection goes to the checked address: the `lookup`
 * hook hands Node the address we judged, so nothing resolves the name a second time (a DNS
 * answer that changes between a check and a connect cannot send us elsewhere). A kept-alive
 * socket is reused only for the same host and port, already connected to a checked address.
 * Redirects are not followed.
 *
 * Every attempt is bounded in time as a whole, so no receiver holds a socket longer than
 * WEBHOOK_TIMEOUT_MS: the connection (TCP and TLS) within the connect timeout, the answer's
 * headers within the headers timeout, and the whole exchange, the answer's body included, within
 * the total (a receiver that sends its headers and then trickles its body is cut there, and the
 * attempt failed). The body is read and dropped, up to a small bound. Idle kept-alive sockets
 * close after the idle timeout, and the sockets of the process are capped per host and across
 * all hosts, so a tenant cannot open ever more of them by naming ever more hosts.
 *
 * Errors a tenant reads (lastError) never carry an address its host name resolved to: they name
 * the host the tenant gave, or an error code.
 */
import dns from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { isIP, type LookupFunction, type Socket } from 'node:net';
import { isPrivateAddress } from './policy.ts';

export type DeliveryResult =
  | { kind: 'answer'; status: number }
  | { kind: 'error'; error: 'TIMEOUT' | 'ADDRESS_REFUSED' | 'CONNECTION_FAILED' | 'BAD_URL'; message: string };

export interface DeliverOptions {
  /** The whole attempt: waiting for a socket, connecting, sending, the answer's headers and body. */
  timeoutMs: number;
  /** The TCP connection and the TLS handshake of a new socket (capped at timeoutMs). */
  connectTimeoutMs: number;
  /** From the connection (or a reused socket) to the answer's headers (capped at timeoutMs). */
  headersTimeoutMs: number;
  /** A kept-alive socket unused this long is closed. */
  idleSocketTimeoutMs: number;
  /** Sockets to one host (host:port) at once. */
  maxSockets: number;
  /** Sockets of this client across all hosts, idle ones included (one cap per scheme: http exists only with allowPrivate). */
  maxTotalSockets: number;
  allowPrivate: boolean;
}

/** The most bytes of an answer's body read before the socket is dropped. */
const MAX_ANSWER_BYTES = 64 * 1024;

class Refused extends Error {}

/** Why a host name was refused: the same words whatever it resolved to (the address stays ours). */
export const RESOLVES_PRIVATE = 'the host resolves to a private or special-use address';

/** A lookup that refuses private addresses (all of them, if any one is: a mixed answer is a rebinding attempt). */
function checkedLookup(allowPrivate: boolean): LookupFunction {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { all: true, family: options.family, hints: options.hints }, (err, addresses) => {
      if (err) return (callback as (e: Error) => void)(err);
      const refused = allowPrivate ? [] : addresses.filter((a) => isPrivateAddress(a.address));
      if (refused.length > 0 || addresses.length === 0) {
        return (callback as (e: Error) => void)(new Refused(addresses.length === 0 ? `${hostname} resolves to no address` : `${hostname}: ${RESOLVES_PRIVATE}`));
      }
      if (options.all) return (callback as (e: null, a: dns.LookupAddress[]) => void)(null, addresses);
      (callback as (e: null, a: string, f: number) => void)(null, addresses[0]!.address, addresses[0]!.family);
    });
  };
}

/** Network errors as a tenant may read them: the code and what it means, never the address connected to. */
const CONNECTION_ERRORS: Record<string, string> = {
  ECONNREFUSED: 'the connection was refused',
  ECONNRESET: 'the connection was reset',
  EPIPE: 'the connection was closed while sending',
  ENOTFOUND: 'the host name does not resolve',
  EAI_AGAIN: 'the host name could not be resolved (temporary failure)',
  EHOSTUNREACH: 'the host is unreachable',
  ENETUNREACH: 'the network is unreachable',
  ETIMEDOUT: 'the connection timed out',
};

/** An error's message without any address in it (IPv4, IPv6, with or without a port). */
export function connectionErrorMessage(err: NodeJS.ErrnoException): string {
  const code = err.code ?? '';
  if (CONNECTION_ERRORS[code]) return `${code}: ${CONNECTION_ERRORS[code]}`;
  const scrubbed = err.message
    .replace(/\[?[0-9a-f]*:[0-9a-f:]*:[0-9a-f.:]*\]?(:\d+)?/gi, '<address>')
    .replace(/\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b/g, '<address>');
  return code && !scrubbed.includes(code) ? `${code}: ${scrubbed}` : scrubbed;
}

/** An agent's sockets, in use and idle. */
function socketsOf(agent: http.Agent): number {
  let n = 0;
  for (const list of [...Object.values(agent.sockets), ...Object.values(agent.freeSockets)]) n += list?.length ?? 0;
  return n;
}

export class WebhookClient {
  private readonly http: http.Agent;
  private readonly https: https.Agent;
  private readonly lookup: LookupFunction;
  private readonly opts: DeliverOptions;
  /** Attempts holding a socket (or about to get one): at most maxTotalSockets; the others wait here, in order. */
  private active = 0;
  private readonly waiting: Array<() => void> = [];
  constructor(opts: DeliverOptions) {
    this.opts = opts;
    this.lookup = checkedLookup(opts.allowPrivate);
    // `timeout` on a keep-alive agent is the idle timeout of a free socket (the agent destroys a free
    // socket that times out); a socket in use is bounded by post()'s own timers instead.
    const agentOptions = { keepAlive: true, maxSockets: opts.maxSockets, maxTotalSockets: opts.maxTotalSockets, timeout: opts.idleSocketTimeoutMs, lookup: this.lookup };
    this.http = new http.Agent(agentOptions as http.AgentOptions);
    this.https = new https.Agent(agentOptions as https.AgentOptions);
  }

  close(): void {
    this.http.destroy();
    this.https.destroy();
  }

  /** Sockets open now, idle ones included (tests: the caps hold). */
  socketCount(): number {
    return socketsOf(this.http) + socketsOf(this.https);
  }

  /**
   * At the total cap, Node's agent would queue a request to a new host until some idle socket of
   * another host timed out: close one idle socket of another host instead, so idle keep-alives never
   * hold back a live delivery (the closed socket's slot goes to the queued request at once).
   */
  private makeRoom(agent: http.Agent, name: string): void {
    if (socketsOf(agent) < this.opts.maxTotalSockets || (agent.freeSockets[name]?.length ?? 0) > 0) return;
    for (const [other, sockets] of Object.entries(agent.freeSockets)) {
      if (other !== name && sockets && sockets.length > 0) {
        sockets[0]!.destroy();
        return;
      }
    }
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
    // A literal address is never looked up by Node: judge it here (it is the tenant's own URL, so naming it tells nothing new).
    const literal = url.hostname.replace(/^\[|\]$/g, '');
    if (isIP(literal) && !this.opts.allowPrivate && isPrivateAddress(literal)) {
      return Promise.resolve({ kind: 'error', error: 'ADDRESS_REFUSED', message: `${literal} is a private or special-use address` });
    }
    const payload = Buffer.from(body);
    const agent = secure ? this.https : this.http;
    const port = url.port ? Number(url.port) : secure ? 443 : 80;
    const total = this.opts.timeoutMs;
    const connectMs = Math.min(this.opts.connectTimeoutMs, total);
    const headersMs = Math.min(this.opts.headersTimeoutMs, total);
    return new Promise<DeliveryResult>((resolve) => {
      let done = false;
      let req: http.ClientRequest | null = null;
      let holds = false;
      const finish = (r: DeliveryResult) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        // A turn is given back when its request has closed (its socket destroyed or back with the agent), not before.
        if (!holds) this.waiting.splice(this.waiting.indexOf(start), 1);
        resolve(r);
      };
      const fail = (error: 'TIMEOUT' | 'CONNECTION_FAILED', message: string) => {
        finish({ kind: 'error', error, message });
        req?.destroy();
      };
      // The whole exchange, waiting for a socket and the answer's body included.
      const timer = setTimeout(() => fail('TIMEOUT', holds ? `the exchange did not end within ${total} ms` : `no socket free within ${total} ms (WEBHOOK_MAX_SOCKETS)`), total);
      const start = () => {
        holds = true;
        this.makeRoom(agent, agent.getName({ host: literal, port }));
        req = this.send(secure, url, agent, headers, payload, { connectMs, headersMs, total }, finish, fail);
        req.once('close', () => this.release());
      };
      // The agent's own cap across hosts (maxTotalSockets) is only a backstop: a request it queues
      // and that times out there can still be given a socket of its own. So at most maxTotalSockets
      // attempts reach the agent; the others wait here, and one that times out waiting never does.
      if (this.active < this.opts.maxTotalSockets) {
        this.active++;
        start();
      } else {
        this.waiting.push(start);
      }
    });
  }

  /** An attempt ended: its turn goes to the next one waiting. */
  private release(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.active--;
  }

  /** The request itself, with the connect and headers timeouts (post() holds the total one). */
  private send(
    secure: boolean,
    url: URL,
    agent: http.Agent,
    headers: Record<string, string>,
    payload: Buffer,
    t: { connectMs: number; headersMs: number; total: number },
    done: (r: DeliveryResult) => void,
    failed: (error: 'TIMEOUT' | 'CONNECTION_FAILED', message: string) => void,
  ): http.ClientRequest {
    const { connectMs, headersMs } = t;
    let phase: NodeJS.Timeout | undefined;
    const finish = (r: DeliveryResult) => {
      clearTimeout(phase);
      done(r);
    };
    const fail = (error: 'TIMEOUT' | 'CONNECTION_FAILED', message: string) => {
      clearTimeout(phase);
      failed(error, message);
    };
    {
      const req = (secure ? https : http).request(url, {
        method: 'POST',
        agent,
        lookup: this.lookup,
        headers: { ...headers, 'content-type': 'application/json', 'content-length': String(payload.length), 'user-agent': 'Sluice-Webhooks/1' },
      });
      const awaitHeaders = () => {
        clearTimeout(phase);
        phase = setTimeout(() => fail('TIMEOUT', `no answer within ${headersMs} ms of connecting`), headersMs);
      };
      req.on('socket', (socket: Socket) => {
        if (!socket.connecting) return awaitHeaders();
        phase = setTimeout(() => fail('TIMEOUT', `could not connect within ${connectMs} ms`), connectMs);
        socket.once(secure ? 'secureConnect' : 'connect', awaitHeaders);
      });
      req.on('response', (res) => {
        clearTimeout(phase);
        const status = res.statusCode ?? 0;
        let read = 0;
        res.on('data', (chunk: Buffer) => {
          read += chunk.length;
          // Enough of an answer nobody reads: the status stands, the socket goes.
          if (read > MAX_ANSWER_BYTES) {
            finish({ kind: 'answer', status });
            res.destroy();
          }
        });
        res.on('end', () => finish({ kind: 'answer', status }));
        res.on('error', () => {});
        res.on('close', () => {
          if (!res.complete) fail('CONNECTION_FAILED', 'the connection closed before the answer ended');
        });
      });
      req.on('error', (err) => {
        if (err instanceof Refused || (err as { cause?: unknown }).cause instanceof Refused) finish({ kind: 'error', error: 'ADDRESS_REFUSED', message: err.message });
        else finish({ kind: 'error', error: 'CONNECTION_FAILED', message: connectionErrorMessage(err) });
      });
      req.end(payload);
      req.on('close', () => clearTimeout(phase));
      return req;
    }
  }
}
