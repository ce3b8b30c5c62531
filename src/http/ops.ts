/**
 * Operations endpoints, the same on every node: GET /healthz (the process is
 * alive), GET /readyz (it can do its job now) and GET /metrics (Prometheus,
 * behind METRICS_TOKEN; without a token only when listening on loopback). API nodes serve them on their own port
 * (src/server.ts); worker-only nodes on METRICS_PORT (`startOpsServer`).
 *
 * /readyz is 200 when Postgres answers within READY_TIMEOUT_MS, every
 * migration this build ships is applied, and, on a node that dispatches, the
 * dispatcher has started and has not stopped; 503 with the failed checks
 * otherwise (e.g. while Postgres is down), so a load balancer stops sending
 * traffic and an orchestrator does not restart a process that is merely
 * waiting for its database.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Sql } from '../db/client.ts';
import type { Metrics } from '../metrics.ts';
import { hashSecret, sameHash, bearerToken } from '../tenants/keys.ts';

export interface ReadyFacts {
  postgres: boolean;
  migrations: boolean;
  /** null: this node runs no dispatcher. */
  dispatcher: boolean | null;
}

/** Ready when every check that applies passed; pure. */
export function isReady(f: ReadyFacts): boolean {
  return f.postgres && f.migrations && f.dispatcher !== false;
}

/** Whether a scrape may read /metrics: no token configured (on loopback only: see `metricsRefused`), or the right bearer token. Pure. */
export function metricsAuthorized(authorization: string | undefined, token: string | undefined): boolean {
  if (!token) return true;
  const presented = authorization ? bearerToken(authorization) : null;
  return presented !== null && sameHash(hashSecret(presented), hashSecret(token));
}

export interface OpsOptions {
  sql: Sql;
  /** Migrations this build ships (drizzle journal entries). */
  expectedMigrations: number;
  /** Whether the dispatcher runs; absent on API-only nodes. */
  dispatcherRunning?: () => boolean;
  metrics?: Metrics | undefined;
  metricsToken?: string | undefined;
  /**
   * /metrics is not served at all (403): the process listens on a non-loopback address
   * and METRICS_TOKEN is unset (`metricsRefused`), so anyone who reaches the port could read it.
   */
  metricsOff?: boolean;
  readyTimeoutMs?: number;
}

/** Whether /metrics must be refused: reachable from other machines and no token set. Pure. */
export function metricsRefused(listensOnLoopback: boolean, token: string | undefined): boolean {
  return !listensOnLoopback && !token;
}

async function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('timeout')), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

export async function readyFacts(o: OpsOptions): Promise<ReadyFacts> {
  let postgres = false;
  let migrations = false;
  try {
    const [row] = await withTimeout(o.sql`select (select count(*) from drizzle.__drizzle_migrations)::int as applied`, o.readyTimeoutMs ?? 2_000);
    postgres = true;
    migrations = (row!.applied as number) >= o.expectedMigrations;
  } catch {
    // Postgres is down or too slow to answer: not ready.
  }
  return { postgres, migrations, dispatcher: o.dispatcherRunning ? o.dispatcherRunning() : null };
}

/** Serves /healthz, /readyz and /metrics; returns false for any other path (the caller serves it). */
export async function serveOps(req: IncomingMessage, res: ServerResponse, o: OpsOptions): Promise<boolean> {
  const url = new URL(req.url ?? '/', 'http://localhost');
  if (req.method !== 'GET' && req.method !== 'HEAD') return false;
  if (url.pathname === '/healthz') {
    res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
    return true;
  }
  if (url.pathname === '/readyz') {
    const facts = await readyFacts(o);
    const ready = isReady(facts);
    res.writeHead(ready ? 200 : 503, { 'content-type': 'application/json' }).end(JSON.stringify({ ready, checks: facts }));
    return true;
  }
  if (url.pathname === '/metrics') {
    if (!o.metrics) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('metrics are not enabled in this process');
      return true;
    }
    if (o.metricsOff) {
      res.writeHead(403, { 'content-type': 'text/plain' }).end('metrics are off: this process listens on a non-loopback address and METRICS_TOKEN is not set');
      return true;
    }
    if (!metricsAuthorized(req.headers.authorization, o.metricsToken)) {
      res.writeHead(401, { 'content-type': 'text/plain', 'www-authenticate': 'Bearer' }).end('metrics need Authorization: Bearer <METRICS_TOKEN>');
      return true;
    }
    const { contentType, body } = await o.metrics.render();
    res.writeHead(200, { 'content-type': contentType }).end(req.method === 'HEAD' ? undefined : body);
    return true;
  }
  return false;
}

/** A worker-only node's HTTP server: /healthz, /readyz and /metrics, nothing else. */
export function createOpsServer(o: OpsOptions): Server {
  return createServer((req, res) => {
    serveOps(req, res, o)
      .then((served) => {
        if (!served) res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: this worker serves /healthz, /readyz and /metrics');
      })
      .catch(() => {
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
        res.end('internal error');
      });
  });
}
