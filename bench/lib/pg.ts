/**
 * The Postgres a benchmark runs on: BENCH_DATABASE_URL when set, else the
 * machine's Postgres at 127.0.0.1:5432 when it answers, else an embedded one in
 * a temporary folder (like test/run.ts). Every run gets a fresh database,
 * dropped afterwards.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { startEmbeddedPostgres } from '../../src/db/embedded.ts';
import { progress } from './log.ts';

export interface BenchPostgres {
  /** A URL of a database on the server where we may create databases. */
  adminUrl: string;
  /** Where it came from: BENCH_DATABASE_URL, local, embedded. */
  source: string;
  version: string;
  settings: Record<string, string>;
  stop(): Promise<void>;
}

const LOCAL = 'postgres://postgres@127.0.0.1:5432/postgres';

async function answers(url: string): Promise<boolean> {
  const sql = postgres(url, { max: 1, onnotice: () => {}, connect_timeout: 2 });
  try {
    await sql`select 1`;
    return true;
  } catch {
    return false;
  } finally {
    await sql.end({ timeout: 1 }).catch(() => {});
  }
}

async function describe(url: string): Promise<{ version: string; settings: Record<string, string> }> {
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    const [v] = await sql`select current_setting('server_version') as v`;
    const rows = await sql`
      select name, setting from pg_settings
      where name in ('max_connections', 'shared_buffers', 'synchronous_commit', 'fsync', 'wal_level')`;
    return { version: String(v!.v), settings: Object.fromEntries(rows.map((r) => [r.name as string, r.setting as string])) };
  } finally {
    await sql.end();
  }
}

/** `auto`: BENCH_DATABASE_URL, else the local server, else embedded. `embedded`: always a private embedded server. */
export async function benchPostgres(choice: 'auto' | 'embedded' = 'auto'): Promise<BenchPostgres> {
  const fromEnv = process.env.BENCH_DATABASE_URL;
  if (choice === 'embedded') return embedded();
  if (fromEnv) {
    const d = await describe(fromEnv);
    return { adminUrl: fromEnv, source: 'BENCH_DATABASE_URL', ...d, stop: async () => {} };
  }
  if (await answers(LOCAL)) {
    const d = await describe(LOCAL);
    return { adminUrl: LOCAL, source: 'local 127.0.0.1:5432', ...d, stop: async () => {} };
  }
  progress('no BENCH_DATABASE_URL and no Postgres at 127.0.0.1:5432: starting an embedded one');
  return embedded();
}

async function embedded(): Promise<BenchPostgres> {
  const dir = mkdtempSync(path.join(tmpdir(), 'sluice-bench-pg-'));
  chmodSync(dir, 0o755); // as root, Postgres runs as `postgres`, which must enter the folder
  const pg = await startEmbeddedPostgres(path.join(dir, 'data'));
  const d = await describe(pg.url);
  return {
    adminUrl: pg.url,
    source: 'embedded',
    ...d,
    stop: async () => {
      await pg.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A fresh database on the server, dropped by `drop()`. */
export async function freshDatabase(adminUrl: string, label: string): Promise<{ url: string; name: string; drop(): Promise<void> }> {
  const name = `sluice_bench_${label.replace(/[^a-z0-9]/g, '')}_${randomBytes(4).toString('hex')}`;
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database ${name}`);
  await admin.end();
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    name,
    async drop() {
      // BENCH_KEEP_DATABASES=1: leave it for a look afterwards (its name goes to stderr).
      if (process.env.BENCH_KEEP_DATABASES === '1') {
        process.stderr.write(`[bench] kept database ${name}\n`);
        return;
      }
      const a = postgres(adminUrl, { max: 1, onnotice: () => {} });
      await a.unsafe(`drop database if exists ${name} with (force)`).catch(() => {});
      await a.end();
    },
  };
}
