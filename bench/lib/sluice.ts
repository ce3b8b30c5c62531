/**
 * Starting Sluice for a benchmark: in a child process (default: its own event
 * loop and CPU time, like a deployment) or in the bench process (`--inproc`).
 * The environment is built from scratch (only PATH/HOME/TMPDIR/LANG are
 * inherited), so a SLUICE_* or APIVERVE_* variable in the shell cannot change
 * a run behind the report's back; pass extra settings with `--env K=V,K=V`.
 */
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startSluice } from '../../src/app.ts';
import { loadEnv } from '../../src/config/env.ts';
import { pino } from 'pino';
import { startSimulator, type Simulator } from '../../src/simulator/index.ts';

export const ADMIN_TOKEN = 'slcadm_bench_admin_token_0123456789abcdef';

export interface PacedProviderOptions {
  databaseUrl: string;
  ratePerMinute: number;
  paceFraction: number;
  latencyMs: number;
  latencyP95Ms: number;
  seed: number;
  /** The plan's concurrent calls, on both sides (default 500: never the bound). */
  concurrentCalls?: number;
  /** Settings on top of the rig's (they win). */
  extraEnv?: Record<string, string>;
}

/**
 * The paced benches' provider: a simulated PRO account at `ratePerMinute` whose credits never run
 * out, and the environment that points Sluice at it with the same limit and PACE_FRACTION.
 */
export async function startPacedProvider(o: PacedProviderOptions): Promise<{ sim: Simulator; env: Record<string, string> }> {
  const concurrentCalls = o.concurrentCalls ?? 500;
  const sim = await startSimulator({
    plan: 'PRO',
    ratePerMinute: o.ratePerMinute,
    concurrentCalls,
    latencyMs: o.latencyMs,
    latencyP95Ms: o.latencyP95Ms,
    seed: o.seed,
    credits: 100_000_000,
    maxCredits: 100_000_000,
  });
  const env = {
    DATABASE_URL: o.databaseUrl,
    APIVERVE_API_KEY: sim.apiKey,
    APIVERVE_BASE_URL: sim.url,
    APIVERVE_PLAN: 'PRO',
    APIVERVE_RATE_PER_MINUTE: String(o.ratePerMinute),
    APIVERVE_CONCURRENT_CALLS: String(concurrentCalls),
    PACE_FRACTION: String(o.paceFraction),
    ...o.extraEnv,
  };
  return { sim, env };
}

export interface SluiceHandle {
  url: string | null;
  mode: 'child' | 'inproc';
  pid: number;
  /** Stops it; a child reports the CPU time it used since it was ready (and the SQL statements it sent, when counted). */
  stop(): Promise<StopReport | null>;
  /** SQL statements sent so far (SLUICE_COUNT_SQL=1; a child only, null in process). */
  statements(): Promise<number | null>;
  /** A child's memory right after a full GC (null in process). */
  memory(): Promise<MemoryReport | null>;
  /** Sends a signal to the child (SIGKILL: a crash; SIGTERM: a graceful stop) and resolves when it has exited; not in process. */
  kill(signal: NodeJS.Signals): Promise<void>;
  /** Whether the child has exited (false in process). */
  exited(): boolean;
  /** Lines the child logged at error level or above so far (0 in process: its log is the bench's). */
  errorLines(): number;
}

export interface MemoryReport {
  rssMb: number;
  heapUsedMb: number;
  externalMb: number;
}

export interface StopReport {
  cpuUserMs: number;
  cpuSystemMs: number;
  rssMb: number;
  sqlStatements?: number;
}

const INHERITED = ['PATH', 'HOME', 'TMPDIR', 'LANG', 'TZ'];

export function parseEnvFlag(text: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of (text ?? '').split(',').map((s) => s.trim()).filter(Boolean)) {
    const eq = part.indexOf('=');
    if (eq <= 0) throw new Error(`--env wants K=V pairs, got "${part}"`);
    out[part.slice(0, eq)] = part.slice(eq + 1);
  }
  return out;
}

export async function startSluiceFor(env: Record<string, string>, mode: 'child' | 'inproc'): Promise<SluiceHandle> {
  const full: Record<string, string> = {
    NODE_ENV: 'production',
    LOG_LEVEL: 'warn',
    HOST: '127.0.0.1',
    PORT: '0',
    SLUICE_ADMIN_TOKEN: ADMIN_TOKEN,
    ...env,
  };
  if (mode === 'inproc') {
    const config = loadEnv(full);
    // pino would write to stdout; the bench's stdout is for the JSON result only.
    const log = pino({ name: 'sluice-bench', level: config.LOG_LEVEL }, pino.destination(2));
    const app = await startSluice(config, log);
    return {
      url: app.url,
      mode,
      pid: process.pid,
      stop: async () => (await app.stop(), null),
      memory: async () => null,
      statements: async () => null,
      kill: async () => {
        throw new Error('cannot signal a Sluice running in the bench process (--inproc)');
      },
      exited: () => false,
      errorLines: () => 0,
    };
  }
  const childEnv: Record<string, string> = {};
  for (const k of INHERITED) if (process.env[k] !== undefined) childEnv[k] = process.env[k]!;
  Object.assign(childEnv, full);
  const child = fork(fileURLToPath(new URL('./sluice-child.ts', import.meta.url)), [], {
    env: childEnv,
    execArgv: [...process.execArgv, '--expose-gc'],
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  // pino's error (50) and fatal (60) lines, counted for reports that promise none.
  let errorLines = 0;
  const relay = (d: Buffer) => {
    errorLines += d.toString().match(/"level":(50|60)/g)?.length ?? 0;
    process.stderr.write(d);
  };
  child.stdout!.on('data', relay);
  child.stderr!.on('data', relay);
  const ready = await new Promise<{ url: string | null }>((resolve, reject) => {
    const onExit = (code: number | null) => reject(new Error(`the Sluice child exited with ${code} before it was ready`));
    child.once('exit', onExit);
    child.on('message', (m: { type?: string; url?: string | null }) => {
      if (m?.type === 'ready') {
        child.off('exit', onExit);
        resolve({ url: m.url ?? null });
      }
    });
  });
  let stopped: Promise<StopReport | null> | null = null;
  const hasExited = () => child.exitCode !== null || child.signalCode !== null;
  return {
    url: ready.url,
    mode,
    pid: child.pid!,
    memory() {
      return new Promise((resolve) => {
        const on = (m: { type?: string } & MemoryReport) => {
          if (m?.type !== 'memory') return;
          child.off('message', on);
          resolve({ rssMb: m.rssMb, heapUsedMb: m.heapUsedMb, externalMb: m.externalMb });
        };
        child.on('message', on);
        child.send({ type: 'memory' });
      });
    },
    statements() {
      return new Promise((resolve) => {
        const on = (m: { type?: string; sqlStatements?: number }) => {
          if (m?.type !== 'stats') return;
          child.off('message', on);
          resolve(m.sqlStatements ?? null);
        };
        child.on('message', on);
        child.send({ type: 'stats' });
      });
    },
    exited: hasExited,
    errorLines: () => errorLines,
    kill(signal) {
      return new Promise((resolve) => {
        if (hasExited()) return resolve();
        child.once('exit', () => resolve());
        child.kill(signal);
      });
    },
    stop() {
      if (hasExited()) return Promise.resolve(null);
      stopped ??= new Promise((resolve) => {
        let report: StopReport | null = null;
        child.on('message', (m: { type?: string } & StopReport) => {
          if (m?.type === 'stopped') report = { cpuUserMs: m.cpuUserMs, cpuSystemMs: m.cpuSystemMs, rssMb: m.rssMb, ...(m.sqlStatements !== undefined ? { sqlStatements: m.sqlStatements } : {}) };
        });
        child.once('exit', () => resolve(report));
        const killer = setTimeout(() => child.kill('SIGKILL'), 30_000);
        killer.unref();
        child.send({ type: 'stop' });
      });
      return stopped;
    },
  };
}
