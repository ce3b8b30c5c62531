/**
 * The provider simulator as an operator runs it: its own process (`node src/simulator/main.ts`,
 * SIMULATOR_* settings), so its clock and event loop are not the bench's, with its admin endpoint
 * for run-time conditions (a window that rises, answers without rate-limit headers) and stats.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import type { ConditionsPatch } from '../../src/simulator/options.ts';

export interface StandaloneSimulatorOptions {
  apiKey: string;
  ratePerMinute: number;
  cooldownS: number;
  latencyMs: number;
  seed?: number;
}

export interface StandaloneSimulator {
  url: string;
  adminUrl: string;
  child: ChildProcess;
  /** Changes run-time conditions (POST /admin/conditions). */
  patch(p: ConditionsPatch): Promise<void>;
  stop(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export async function startStandaloneSimulator(o: StandaloneSimulatorOptions): Promise<StandaloneSimulator> {
  const port = await freePort();
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    SIMULATOR_PORT: String(port),
    SIMULATOR_API_KEY: o.apiKey,
    SIMULATOR_PLAN: 'PRO',
    SIMULATOR_RATE_PER_MINUTE: String(o.ratePerMinute),
    SIMULATOR_COOLDOWN_SECONDS: String(o.cooldownS),
    SIMULATOR_LATENCY_MS: String(o.latencyMs),
    SIMULATOR_SEED: String(o.seed ?? 25),
  };
  const main = fileURLToPath(new URL('../../src/simulator/main.ts', import.meta.url));
  const child = spawn(process.execPath, [...process.execArgv, main], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stderr!.on('data', (d: Buffer) => process.stderr.write(d));
  const started = await new Promise<{ url: string; adminUrl: string }>((resolve, reject) => {
    let buf = '';
    child.once('exit', (code) => reject(new Error(`the simulator exited with ${code} before it was ready`)));
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      for (const line of buf.split('\n').slice(0, -1)) {
        try {
          const j = JSON.parse(line) as { url?: string; adminUrl?: string };
          if (j.url && j.adminUrl) resolve({ url: j.url, adminUrl: j.adminUrl });
        } catch {
          /* not a log line */
        }
      }
      buf = buf.slice(buf.lastIndexOf('\n') + 1);
    });
  });
  return {
    ...started,
    child,
    patch: async (p) => {
      const res = await fetch(`${started.adminUrl}/conditions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(p) });
      if (!res.ok) throw new Error(`simulator conditions: ${res.status} ${await res.text()}`);
    },
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

export interface KeyStats {
  rateLimited: number;
  callsInCooldown: number;
  billedCalls: number;
  calls: number;
}

/** One key's counters as the provider keeps them: the ground truth for calls and 429s. */
export async function simulatorKeyStats(adminUrl: string, apiKey: string): Promise<KeyStats> {
  const s = (await (await fetch(`${adminUrl}/stats`)).json()) as { keys: Record<string, KeyStats> };
  const k = s.keys[apiKey]!;
  return { rateLimited: k.rateLimited, callsInCooldown: k.callsInCooldown, billedCalls: k.billedCalls, calls: k.calls };
}
