/**
 * A real PgBouncer (Debian's `pgbouncer` package) in transaction pool mode in
 * front of a test Postgres: its own generated config (ini + userlist) in a
 * temporary folder, on a free port, stopped by `stop()`. Used by the multi-node
 * test through a pooler and by the `cluster` benchmark's `--pgbouncer` mode.
 *
 * Nothing beyond PgBouncer's defaults that Sluice would need: no
 * `ignore_startup_parameters`, no session pooling. Only the sizes are set here
 * (the server pool, and enough client connections for every node's pools).
 * A missing pgbouncer binary is an error, never a skip: CI installs it (.ci/run).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { freePort } from '../../src/db/embedded.ts';

const BINARIES = ['/usr/sbin/pgbouncer', '/usr/bin/pgbouncer', '/usr/local/bin/pgbouncer'];

export interface PgBouncer {
  /** `postgresUrl` with its host and port replaced by PgBouncer's (same user and database). */
  urlFor(postgresUrl: string): string;
  port: number;
  /** What PgBouncer logged (stderr): WARNING and ERROR lines show a client it refused. */
  logs: string[];
  /** PgBouncer's admin console (`SHOW POOLS`, `SHOW STATS`, ...). */
  show(what: string): Promise<Record<string, unknown>[]>;
  stop(): Promise<void>;
}

export interface PgBouncerOptions {
  /** Server connections per database and user (PgBouncer's `default_pool_size`, default 20). */
  poolSize?: number;
  /** Client connections PgBouncer accepts in all (`max_client_conn`). */
  maxClientConn?: number;
}

export function pgbouncerBinary(): string {
  const found = BINARIES.find((b) => existsSync(b));
  if (!found) throw new Error(`pgbouncer is not installed (looked for ${BINARIES.join(', ')}): \`apt-get install -y pgbouncer\` (.ci/run does it)`);
  return found;
}

/** Starts PgBouncer in front of the server of `postgresUrl` (any database on it). */
export async function startPgBouncer(postgresUrl: string, o: PgBouncerOptions = {}): Promise<PgBouncer> {
  const binary = pgbouncerBinary();
  const target = new URL(postgresUrl);
  const user = decodeURIComponent(target.username || 'postgres');
  const password = decodeURIComponent(target.password);
  const port = await freePort();
  const dir = mkdtempSync(path.join(tmpdir(), 'sluice-pgbouncer-'));
  // As root PgBouncer runs as `postgres` (it refuses root), which must read its config.
  chmodSync(dir, 0o755);
  const quote = (s: string) => `"${s.replaceAll('"', '""')}"`;
  writeFileSync(path.join(dir, 'userlist.txt'), `${quote(user)} ${quote(password)}\n`, { mode: 0o644 });
  const ini = [
    '[databases]',
    // Every database on the server, as the client names it; the server login is the userlist's.
    `* = host=${target.hostname} port=${target.port || '5432'}`,
    '[pgbouncer]',
    'listen_addr = 127.0.0.1',
    `listen_port = ${port}`,
    'unix_socket_dir =',
    'auth_type = trust',
    `auth_file = ${path.join(dir, 'userlist.txt')}`,
    `admin_users = ${user}`,
    'pool_mode = transaction',
    `default_pool_size = ${o.poolSize ?? 20}`,
    `max_client_conn = ${o.maxClientConn ?? 500}`,
    'logfile =',
    'pidfile =',
  ].join('\n');
  writeFileSync(path.join(dir, 'pgbouncer.ini'), `${ini}\n`, { mode: 0o644 });
  const asRoot = userInfo().uid === 0;
  const child: ChildProcess = spawn(binary, [...(asRoot ? ['-u', 'postgres'] : []), path.join(dir, 'pgbouncer.ini')], { stdio: ['ignore', 'pipe', 'pipe'] });
  const logs: string[] = [];
  const keep = (chunk: Buffer) => logs.push(...chunk.toString().split('\n').filter(Boolean));
  child.stdout!.on('data', keep);
  child.stderr!.on('data', keep);
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  child.once('exit', () => process.off('exit', killOnExit));

  const urlFor = (url: string) => {
    const u = new URL(url);
    u.hostname = '127.0.0.1';
    u.port = String(port);
    return u.toString();
  };
  const adminUrl = urlFor(Object.assign(new URL(postgresUrl), { pathname: '/pgbouncer' }).toString());
  const show = async (what: string) => {
    // The admin console speaks the simple protocol only.
    const admin = postgres(adminUrl, { max: 1, prepare: false, fetch_types: false, onnotice: () => {}, connect_timeout: 5 });
    try {
      return [...(await admin.unsafe(`show ${what}`).simple())] as Record<string, unknown>[];
    } finally {
      await admin.end();
    }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((r) => child.once('exit', () => r()));
      // SIGINT: PgBouncer's immediate shutdown.
      child.kill('SIGINT');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };

  // Ready once its admin console answers.
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) {
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`pgbouncer exited with ${child.exitCode}:\n${logs.join('\n')}`);
    }
    try {
      await show('version');
      break;
    } catch (err) {
      if (Date.now() > deadline) {
        await stop();
        throw new Error(`pgbouncer did not answer within 20 s (${(err as Error).message}):\n${logs.join('\n')}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return { urlFor, port, logs, show, stop };
}
