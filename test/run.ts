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

const child = spawn(process.execPath, ['--test', '--test-concurrency=2', '--test-timeout=120000', ...files], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, TEST_DATABASE_URL: adminUrl, NODE_ENV: 'test' },
});
const code: number = await new Promise((resolve) => child.on('exit', (c, signal) => resolve(c ?? (signal ? 1 : 0))));
await cleanup();
process.exit(code);
