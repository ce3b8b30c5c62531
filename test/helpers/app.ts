/**
 * A real Sluice process for a test: its own database, a real HTTP server on a
 * free port, the provider simulator over real HTTP, and GraphQL/graphql-ws
 * clients that talk to it like an app would.
 */
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { startSluice, type SluiceApp, type StartOverrides } from '../../src/app.ts';
import { loadEnv } from '../../src/config/env.ts';
import { createLogger, type Logger } from '../../src/log.ts';
import { TEST_DB_POOL_MAX, createTestDatabase } from './db.ts';

export const ADMIN_TOKEN = 'slcadm_test_admin_token_0123456789abcdef';

export interface GraphQLResponse<T = any> {
  status: number;
  headers: Headers;
  body: any; // tests assert on shape; GraphQL responses are checked field by field
}

export interface TestApp {
  app: SluiceApp;
  url: string;
  databaseUrl: string;
  gql<T = any>(query: string, variables?: Record<string, unknown>, token?: string | null): Promise<GraphQLResponse<T>>;
  ws(token: string | null): Client;
  createTenant(name: string, tier?: 'FREE' | 'PRO' | 'ENTERPRISE'): Promise<{ id: string; apiKey: string }>;
  stop(): Promise<void>;
}

/**
 * `env.DATABASE_URL` joins an existing test database (another process of the
 * same deployment); otherwise a fresh one is created and dropped on stop.
 */
export async function startTestApp(env: Record<string, string> = {}, overrides: StartOverrides = {}, opts: { log?: Logger } = {}): Promise<TestApp> {
  const db = env.DATABASE_URL ? { url: env.DATABASE_URL, drop: async () => {} } : await createTestDatabase();
  const config = loadEnv({
    NODE_ENV: 'test',
    LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'silent',
    HOST: '127.0.0.1',
    PORT: '0',
    DATABASE_URL: db.url,
    SLUICE_ADMIN_TOKEN: ADMIN_TOKEN,
    DISPATCH_IDLE_POLL_MS: '200',
    DB_POOL_MAX: process.env.DB_POOL_MAX ?? TEST_DB_POOL_MAX,
    JOB_RETRY_DELAY_SECONDS: '1',
    ...env,
  });
  const app = await startSluice(config, opts.log ?? createLogger(config.LOG_LEVEL), overrides);
  const url = app.url ?? 'http://127.0.0.1:1/not-serving';
  const clients: Client[] = [];

  const gql: TestApp['gql'] = async (query, variables = {}, token = ADMIN_TOKEN) => {
    const res = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: JSON.stringify({ query, variables }),
    });
    return { status: res.status, headers: res.headers, body: await res.json() };
  };

  return {
    app,
    url,
    databaseUrl: db.url,
    gql,
    ws(token) {
      const client = createClient({
        url: url.replace(/^http/, 'ws'),
        webSocketImpl: WebSocket,
        connectionParams: token ? { authorization: `Bearer ${token}` } : {},
        retryAttempts: 0,
        lazy: true,
      });
      clients.push(client);
      return client;
    },
    async createTenant(name, tier = 'PRO') {
      const r = await gql(`mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`, { i: { name, tier } });
      if (!r.body.data) throw new Error(`createTenant failed: ${JSON.stringify(r.body.errors)}`);
      return { id: r.body.data.createTenant.tenant.id, apiKey: r.body.data.createTenant.apiKey };
    },
    async stop() {
      await Promise.all(clients.map((c) => c.dispose()));
      await app.stop();
      await db.drop();
    },
  };
}

/** Collects a subscription's events until `until` says stop (or the timeout passes). */
export function collect<T>(client: Client, query: string, variables: Record<string, unknown>, until: (events: T[]) => boolean, timeoutMs = 20_000): Promise<T[]> {
  return new Promise((resolve, reject) => {
    const events: T[] = [];
    const timer = setTimeout(() => {
      dispose();
      reject(new Error(`subscription timed out after ${timeoutMs} ms with ${events.length} events: ${JSON.stringify(events).slice(0, 500)}`));
    }, timeoutMs);
    const dispose = client.subscribe<T>(
      { query, variables },
      {
        next: (value) => {
          if (value.errors) {
            clearTimeout(timer);
            dispose();
            reject(Object.assign(new Error(value.errors[0]!.message), { errors: value.errors }));
            return;
          }
          events.push(value.data as T);
          if (until(events)) {
            clearTimeout(timer);
            dispose();
            resolve(events);
          }
        },
        error: (err) => {
          clearTimeout(timer);
          // graphql-ws reports a refused operation as an array of GraphQL errors.
          if (Array.isArray(err)) reject(Object.assign(new Error(err[0]?.message ?? 'subscription error'), { errors: err }));
          else reject(err instanceof Error ? err : Object.assign(new Error('subscription error'), { cause: err }));
        },
        complete: () => {
          clearTimeout(timer);
          resolve(events);
        },
      },
    );
  });
}

/** Polls `fn` until it returns a truthy value. */
export async function eventually<T>(fn: () => Promise<T | null | undefined | false>, timeoutMs = 20_000, everyMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
