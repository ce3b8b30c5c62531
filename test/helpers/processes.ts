/**
 * Real Sluice processes (`node src/main.ts`) for multi-node and crash tests:
 * spawned with their own environment, killed for real.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { freePort } from '../../src/db/embedded.ts';
import { ADMIN_TOKEN } from './app.ts';

const root = path.resolve(import.meta.dirname, '../..');

export interface NodeProcess {
  child: ChildProcess;
  url: string | null;
  pid: number;
  /** Lines it logged (JSON), for diagnosis on failure. */
  logs: string[];
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export async function startNode(role: 'api' | 'worker' | 'all', env: Record<string, string>, opts: { readyTimeoutMs?: number } = {}): Promise<NodeProcess> {
  const readyTimeoutMs = opts.readyTimeoutMs ?? 60_000;
  const port = role === 'worker' ? 0 : await freePort();
  const child = spawn(process.execPath, [path.join(root, 'src/main.ts')], {
    cwd: root,
    env: {
      ...process.env,
      NODE_ENV: 'test',
      HOST: '127.0.0.1',
      PORT: String(port),
      SLUICE_ROLE: role,
      SLUICE_ADMIN_TOKEN: ADMIN_TOKEN,
      ...env,
      // Readiness is read from the info-level start-up lines.
      LOG_LEVEL: 'info',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: string[] = [];
  // Never leave a child behind: a live child keeps the test runner waiting forever.
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  child.once('exit', () => process.off('exit', killOnExit));
  const ready = role === 'worker' ? 'dispatcher started' : 'GraphQL API is up';
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`node (${role}) did not start in ${readyTimeoutMs / 1000} s:\n${logs.join('\n')}`));
    }, readyTimeoutMs);
    let buffer = '';
    const onData = (chunk: Buffer) => {
      buffer += chunk.toString();
      let nl: number;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        logs.push(line);
        if (line.includes(ready)) {
          clearTimeout(timer);
          resolve();
        }
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', (c: Buffer) => logs.push(c.toString()));
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`node (${role}) exited with ${code} before it was ready:\n${logs.join('\n')}`));
    });
  });
  return {
    child,
    url: role === 'worker' ? null : `http://127.0.0.1:${port}/graphql`,
    pid: child.pid!,
    logs,
    stop: async (signal = 'SIGTERM') => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      child.kill(signal);
      await exited;
    },
  };
}

/** GraphQL over HTTP against a spawned node. */
export async function gqlAt(url: string, query: string, variables: Record<string, unknown> = {}, token: string = ADMIN_TOKEN): Promise<any> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  const body: any = await res.json();
  if (body.errors) throw Object.assign(new Error(body.errors[0].message), { errors: body.errors });
  return body.data;
}

/**
 * The environment that points a spawned node at a test database and at a
 * simulator over real HTTP (not demo mode), with the crash-test timings: a
 * silent node is presumed dead after 2 s and the sweeper looks every 200 ms.
 */
export function crashTestEnv(
  sim: { apiKey: string; url: string },
  databaseUrl: string,
  ratePerMinute: number,
  extra: Record<string, string> = {},
): Record<string, string> {
  return {
    DATABASE_URL: databaseUrl,
    APIVERVE_API_KEY: sim.apiKey,
    APIVERVE_BASE_URL: sim.url,
    APIVERVE_PLAN: 'PRO',
    APIVERVE_RATE_PER_MINUTE: String(ratePerMinute),
    APIVERVE_CONCURRENT_CALLS: '100',
    NODE_TIMEOUT_SECONDS: '2',
    SWEEP_INTERVAL_MS: '200',
    TIMEOUT_BILLING: 'billed',
    // These processes judge crashes and outages, not the pace: the window opens at its configured rate.
    PACE_START: '1',
    ...extra,
  };
}
