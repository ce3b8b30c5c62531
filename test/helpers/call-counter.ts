/**
 * A counting HTTP proxy in front of the provider simulator, for tests that
 * judge "one call per job" per job, not only in total: every request is
 * forwarded to the simulator unchanged and counted by its path and query (a
 * job's input), with the status the simulator answered. The upstream request
 * is never cancelled when Sluice gives up on it: the simulator bills on
 * receipt, and its answer is what the provider decided.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface CountedCall {
  /** Path and query, e.g. `/v1/dnslookup?domain=j1.example`. */
  target: string;
  /** The simulator's HTTP status (null while it has not answered). */
  status: number | null;
  /** When the request arrived (performance.now() of the test process). */
  startedAt: number;
  /** When Sluice's side of the call ended: its answer delivered, or Sluice gave up on it (null while open). */
  endedAt: number | null;
  /** The simulator's answer reached Sluice (false: Sluice had given up on the call first). */
  delivered: boolean;
}

export interface CallCounter {
  url: string;
  calls: CountedCall[];
  /** Requests the simulator has not answered yet. */
  inFlight(): number;
  /** Calls per target (a job's input). */
  byTarget(): Map<string, number>;
  stop(): Promise<void>;
}

export async function startCallCounter(upstreamUrl: string): Promise<CallCounter> {
  const upstream = new URL(upstreamUrl);
  const calls: CountedCall[] = [];
  // Idle sockets closed before the simulator's 5 s keep-alive timeout would: a forward written on a
  // socket it is closing would be counted as a call the provider never saw.
  const agent = new http.Agent({ keepAlive: true, timeout: 4_000 });
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const entry: CountedCall = { target: req.url ?? '', status: null, startedAt: performance.now(), endedAt: null, delivered: false };
      calls.push(entry);
      res.once('close', () => void (entry.endedAt = performance.now()));
      const out = http.request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers, agent }, (up) => {
        const body: Buffer[] = [];
        up.on('data', (c: Buffer) => body.push(c));
        up.on('end', () => {
          entry.status = up.statusCode ?? 0;
          if (res.destroyed) return;
          entry.delivered = true;
          res.writeHead(up.statusCode ?? 502, up.headers);
          res.end(Buffer.concat(body));
        });
      });
      out.on('error', () => {
        entry.status = 0;
        if (!res.destroyed) res.destroy();
      });
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}${upstream.pathname}`,
    calls,
    inFlight: () => calls.filter((c) => c.status === null).length,
    byTarget: () => {
      const m = new Map<string, number>();
      for (const c of calls) m.set(c.target, (m.get(c.target) ?? 0) + 1);
      return m;
    },
    stop: async () => {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      agent.destroy();
    },
  };
}
