/**
 * The simulator's HTTP face: routes requests to the engine, applies the
 * engine's delay (latency, hang), and serves the admin endpoints. Thin on
 * purpose; every decision is the engine's.
 *
 *   GET|POST /v1/<api>            a call (GET: query params; POST: JSON body params)
 *   POST     /v1/<api>/batch      a batch (see src/provider/batch-wire.ts)
 *   GET      /admin/stats         stats (engine.stats())
 *   GET      /admin/calls?since=&limit=   the call log (SimulatorOptions.callLog), in pages
 *   POST     /admin/reset-stats
 *   GET|POST /admin/conditions    read / patch run-time conditions (JSON ConditionsPatch)
 *   GET      /admin/account       plan, credits, renewal, keys
 *   POST     /admin/credits       {"credits": n} sets the balance
 *   POST     /admin/renew         renews the credits now (anniversary unchanged)
 *   POST     /admin/keys          {"key": "apv_sbk_...", "apis"?: [...]} adds a sub-key
 *   POST     /admin/keys/<key>/deactivate | /activate
 *   POST     /admin/keys/<key>/scope    {"apis": [...] | null}
 *   GET      /admin/health
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import type { ApiCatalog } from '../config/apis.ts';
import { HEADER } from '../provider/headers.ts';
import { createEngine, errorBody, SimulatorConfigError, type AccountInfo, type CallLogPage, type Engine, type Reply, type SimulatorStats } from './engine.ts';
import { conditionsPatchSchema, type Conditions, type ConditionsPatch, type SimulatorOptions, type SubKeySpec } from './options.ts';

export interface Simulator {
  /** Base URL the client appends `/<api>` to, e.g. `http://127.0.0.1:41234/v1`. */
  readonly url: string;
  readonly port: number;
  readonly host: string;
  /** e.g. `http://127.0.0.1:41234/admin`. */
  readonly adminUrl: string;
  /** The primary key. */
  readonly apiKey: string;
  readonly subKeys: readonly string[];
  readonly catalog: ApiCatalog;
  stats(): SimulatorStats;
  /** The call log after `since` (a seq), at most `limit` entries (SimulatorOptions.callLog). */
  calls(since?: number, limit?: number): CallLogPage;
  resetStats(): void;
  conditions(): Conditions;
  setConditions(patch: ConditionsPatch): Conditions;
  account(): AccountInfo;
  setCredits(credits: number): void;
  renew(): void;
  deactivateKey(key: string): void;
  activateKey(key: string): void;
  setKeyScope(key: string, apis: string[] | null): void;
  addSubKey(spec: SubKeySpec): void;
  /** Closes the server, drops open connections (hung calls included) and pending delayed answers. */
  stop(): Promise<void>;
}

const MAX_BODY_BYTES = 2 * 1024 * 1024;

class BodyTooLarge extends Error {}

function readBody(req: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_BODY_BYTES) {
        reject(new BodyTooLarge());
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

/** Decoded JSON, or undefined when the text is not JSON. Empty text is `{}`. */
function decodeJson(text: string): unknown {
  if (text.trim() === '') return {};
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function sendJson(res: http.ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' });
  res.end(JSON.stringify(body));
}

/** The provider's error envelope, without account headers (routing errors, before any key is read). */
function sendError(res: http.ServerResponse, status: number, message: string) {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' });
  res.end(errorBody(message));
}

const creditsSchema = z.strictObject({ credits: z.number().int() });
const scopeSchema = z.strictObject({ apis: z.array(z.string()).nullable() });
const addKeySchema = z.strictObject({ key: z.string(), apis: z.array(z.string()).optional() });
const callsQuerySchema = z.strictObject({
  since: z.coerce.number().int().nonnegative().default(0),
  limit: z.coerce.number().int().min(1).max(100_000).default(10_000),
});

function zodMessage(e: z.ZodError): string {
  return e.issues.map((i) => `${i.path.length ? `${i.path.join('.')}: ` : ''}${i.message}`).join('; ');
}

export async function startSimulator(opts: SimulatorOptions = {}): Promise<Simulator> {
  const engine: Engine = createEngine(opts);
  const timers = new Set<NodeJS.Timeout>();
  const host = opts.host ?? '127.0.0.1';

  function deliver(res: http.ServerResponse, reply: Reply) {
    const slot = reply.slot;
    if (slot) {
      const release = () => engine.release(slot);
      res.once('finish', release);
      res.once('close', release);
    }
    if (reply.delayMs === null) return; // hang: answered never; the slot frees when the client gives up
    const write = () => {
      if (res.destroyed || res.writableEnded) return;
      reply.answered?.();
      res.writeHead(reply.status, { ...reply.headers, 'content-length': String(Buffer.byteLength(reply.body)) });
      res.end(reply.body);
    };
    if (reply.delayMs <= 0) {
      write();
      return;
    }
    const t = setTimeout(() => {
      timers.delete(t);
      write();
    }, reply.delayMs);
    timers.add(t);
  }

  async function handleApi(req: http.IncomingMessage, res: http.ServerResponse, url: URL, segments: string[]) {
    const apiKeyHeader = req.headers[HEADER.apiKey];
    const apiKey = (Array.isArray(apiKeyHeader) ? apiKeyHeader[0] : apiKeyHeader)?.trim() || null;
    const api = decodeURIComponent(segments[0] ?? '');
    if (segments.length === 2 && segments[1] === 'batch') {
      if (req.method !== 'POST') {
        res.setHeader('allow', 'POST');
        sendError(res, 405, 'The batch endpoint takes POST.');
        return;
      }
      const body = decodeJson(await readBody(req));
      deliver(res, engine.handleBatch({ apiKey, api, body }));
      return;
    }
    if (segments.length !== 1 || api === '') {
      sendError(res, 404, 'Not found.');
      return;
    }
    const params: Record<string, unknown> = Object.fromEntries(url.searchParams);
    if (req.method === 'POST') {
      const body = decodeJson(await readBody(req));
      if (body === undefined || body === null || typeof body !== 'object' || Array.isArray(body)) {
        sendError(res, 400, 'Body must be a JSON object.');
        return;
      }
      Object.assign(params, body);
    } else if (req.method !== 'GET') {
      res.setHeader('allow', 'GET, POST');
      sendError(res, 405, `Method ${req.method} not allowed.`);
      return;
    }
    deliver(res, engine.handleCall({ apiKey, api, params }));
  }

  async function handleAdmin(req: http.IncomingMessage, res: http.ServerResponse, url: URL, segments: string[]) {
    const route = `${req.method} /${segments.join('/')}`;
    const body = async () => decodeJson(await readBody(req));
    const parseOr400 = async <T>(schema: z.ZodType<T>): Promise<T | null> => {
      const raw = await body();
      if (raw === undefined) {
        sendJson(res, 400, { error: 'body must be JSON' });
        return null;
      }
      const r = schema.safeParse(raw);
      if (!r.success) {
        sendJson(res, 400, { error: zodMessage(r.error) });
        return null;
      }
      return r.data;
    };
    if (route === 'GET /health') return sendJson(res, 200, { status: 'ok' });
    if (route === 'GET /stats') return sendJson(res, 200, engine.stats());
    if (route === 'GET /calls') {
      const q = callsQuerySchema.safeParse(Object.fromEntries(url.searchParams));
      if (!q.success) return sendJson(res, 400, { error: zodMessage(q.error) });
      return sendJson(res, 200, engine.calls(q.data.since, q.data.limit));
    }
    if (route === 'POST /reset-stats') {
      engine.resetStats();
      return sendJson(res, 200, engine.stats());
    }
    if (route === 'GET /conditions') return sendJson(res, 200, engine.conditions());
    if (route === 'POST /conditions') {
      const patch = await parseOr400(conditionsPatchSchema);
      if (patch) sendJson(res, 200, engine.setConditions(patch));
      return;
    }
    if (route === 'GET /account') return sendJson(res, 200, engine.account());
    if (route === 'POST /credits') {
      const b = await parseOr400(creditsSchema);
      if (b) {
        engine.setCredits(b.credits);
        sendJson(res, 200, engine.account());
      }
      return;
    }
    if (route === 'POST /renew') {
      engine.renew();
      return sendJson(res, 200, engine.account());
    }
    if (route === 'POST /keys') {
      const b = await parseOr400(addKeySchema);
      if (b) {
        engine.addSubKey(b.apis ? { key: b.key, apis: b.apis } : { key: b.key });
        sendJson(res, 200, engine.account());
      }
      return;
    }
    if (req.method === 'POST' && segments.length === 3 && segments[0] === 'keys') {
      const key = decodeURIComponent(segments[1] ?? '');
      const action = segments[2];
      if (action === 'deactivate' || action === 'activate') {
        engine.setKeyActive(key, action === 'activate');
        return sendJson(res, 200, engine.account());
      }
      if (action === 'scope') {
        const b = await parseOr400(scopeSchema);
        if (b) {
          engine.setKeyScope(key, b.apis);
          sendJson(res, 200, engine.account());
        }
        return;
      }
    }
    sendJson(res, 404, { error: `no admin route ${route}` });
  }

  const server = http.createServer({ keepAliveTimeout: 5_000 }, (req, res) => {
    const url = new URL(req.url ?? '/', 'http://simulator');
    const segments = url.pathname.split('/').filter(Boolean);
    const handler =
      segments[0] === 'v1'
        ? handleApi(req, res, url, segments.slice(1))
        : segments[0] === 'admin'
          ? handleAdmin(req, res, url, segments.slice(1))
          : Promise.resolve(sendError(res, 404, 'Not found.'));
    handler.catch((err: unknown) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (err instanceof BodyTooLarge) return sendError(res, 413, 'Body too large.');
      if (err instanceof SimulatorConfigError) return sendJson(res, segments[0] === 'admin' && /unknown key/.test(err.message) ? 404 : 400, { error: err.message });
      sendError(res, 500, err instanceof Error ? err.message : String(err));
    });
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const urlHost = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host.includes(':') ? `[${host}]` : host;
  const origin = `http://${urlHost}:${port}`;
  const account = engine.account();
  let stopped: Promise<void> | null = null;

  return {
    url: `${origin}/v1`,
    port,
    host,
    adminUrl: `${origin}/admin`,
    apiKey: account.keys.find((k) => k.kind === 'primary')?.key ?? '',
    get subKeys() {
      return engine
        .account()
        .keys.filter((k) => k.kind === 'sub')
        .map((k) => k.key);
    },
    catalog: engine.catalog,
    stats: () => engine.stats(),
    calls: (since, limit) => engine.calls(since, limit),
    resetStats: () => engine.resetStats(),
    conditions: () => engine.conditions(),
    setConditions: (patch) => engine.setConditions(patch),
    account: () => engine.account(),
    setCredits: (credits) => engine.setCredits(credits),
    renew: () => engine.renew(),
    deactivateKey: (key) => engine.setKeyActive(key, false),
    activateKey: (key) => engine.setKeyActive(key, true),
    setKeyScope: (key, apis) => engine.setKeyScope(key, apis),
    addSubKey: (spec) => engine.addSubKey(spec),
    stop() {
      stopped ??= new Promise<void>((resolve) => {
        for (const t of timers) clearTimeout(t);
        timers.clear();
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return stopped;
    },
  };
}
