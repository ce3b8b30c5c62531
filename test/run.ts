/**
 * `npm test`: runs every test file against a real Postgres. With
 * TEST_DATABASE_URL (a server where we may create databases) it uses that;
 * otherwise it starts an embedded Postgres in a temporary folder, so the
 * suite runs on a bare machine. Each test file creates its own database.
 */
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startEmbeddedPostgres } from '../src/db/embedded.ts';
import { TEST_DB_POOL_MAX } from './helpers/db.ts';

const root = path.dirname(path.dirname(new URL(import.meta.url).pathname));
let adminUrl = process.env.TEST_DATABASE_URL;
let cleanup = async () => {};
if (!adminUrl) {
  const dir = mkdtempSync(path.join(tmpdir(), 'sluice-test-pg-'));
  // As root, Postgres runs as the `postgres` user, which must be able to enter the folder.
  chmodSync(dir, 0o755);
  const pg = await startEmbeddedPostgres(path.join(dir, 'data'));
  adminUrl = pg.url;
  cleanup = async () => {
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  console.log(`test database: embedded Postgres at ${adminUrl.replace(/:[^:@/]+@/, ':***@')}`);
} else {
  console.log(`test database: TEST_DATABASE_URL (${adminUrl.replace(/:[^:@/]+@/, ':***@')})`);
}

const only = process.argv.slice(2);
const files = only.length > 0 ? only : readdirSync(path.join(root, 'test')).filter((f) => f.endsWith('.test.ts')).sort().map((f) => path.join('test', f));

// The browser tests (Chromium) run after the others, on their own: Chromium's CPU would
// otherwise disturb the timing-sensitive tests (fair shares, pacing) running beside them.
const BROWSER = new Set(['console.test.ts', 'graphiql.test.ts']);
const isBrowser = (f: string) => BROWSER.has(path.basename(f));
const runFiles = (list: string[], concurrency: number): Promise<number> => {
  if (list.length === 0) return Promise.resolve(0);
  const child = spawn(process.execPath, ['--test', `--test-concurrency=${concurrency}`, '--test-timeout=120000', ...list], {
    cwd: root,
    stdio: 'inherit',
    env: { DB_POOL_MAX: TEST_DB_POOL_MAX, ...process.env, TEST_DATABASE_URL: adminUrl, NODE_ENV: 'test' },
  });
  return new Promise((resolve) => child.on('exit', (c, signal) => resolve(c ?? (signal ? 1 : 0))));
};
const first = await runFiles(files.filter((f) => !isBrowser(f)), 2);
const second = await runFiles(files.filter(isBrowser), 1);
await cleanup();
process.exit(first || second);
