/**
 * `npm test`: runs every test file against a real Postgres. With
 * TEST_DATABASE_URL (a server where we may create databases) it uses that;
 * otherwise it starts an embedded Postgres in a temporary folder, so the
 * suite runs on a bare machine. Each test file creates its own database.
 *
 * The files run in Node's test runner (`run()`, one process per file, the spec
 * reporter's output), and the run passes only if the counts check in
 * test/lib/tally.ts does: every test each file declared reported a result, and
 * every file's process finished its run and ended cleanly. A file's process still up after
 * its tests ended (60 s) is ended and named (test/lib/linger-guard.ts), so a handle a test left open
 * never hangs the run. It ends with the line `N passed, N failed, N skipped`.
 */
import { chmodSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { run } from 'node:test';
import { spec } from 'node:test/reporters';
import { startEmbeddedPostgres } from '../src/db/embedded.ts';
import { TEST_DB_POOL_MAX } from './helpers/db.ts';
import { LINGER_MARK, judge, record, report, type Tally } from './lib/tally.ts';

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
// NODE_TEST_CONTEXT tells a file's process how to report to its runner: run() sets it, and one
// inherited from an enclosing test run (the runner's own test runs this) must not override it.
const { NODE_TEST_CONTEXT: _, ...parentEnv } = process.env;
const env = { DB_POOL_MAX: TEST_DB_POOL_MAX, ...parentEnv, TEST_DATABASE_URL: adminUrl, NODE_ENV: 'test' };
const tally: Tally = new Map();
// Each file's process exits by itself once its tests end, or the guard ends it (test/lib/linger-guard.ts).
const guard = ['--import', path.join(root, 'test', 'lib', 'linger-guard.ts')];
const lingered = new Set<string>();
const COUNTED = ['test:enqueue', 'test:pass', 'test:fail', 'test:complete', 'test:summary'] as const;
const runFiles = async (list: string[], concurrency: number): Promise<void> => {
  if (list.length === 0) return;
  const stream = run({ files: list, cwd: root, concurrency, timeout: 120_000, isolation: 'process', env, execArgv: guard });
  for (const type of COUNTED) stream.on(type, (data: unknown) => record(tally, { type, data }));
  stream.on('test:stderr', (d: { file?: string; message: string }) => {
    if (d.file && d.message.includes(LINGER_MARK)) lingered.add(path.resolve(root, d.file));
  });
  await pipeline(stream, spec(), process.stdout, { end: false });
};
await runFiles(files.filter((f) => !isBrowser(f)), 2);
await runFiles(files.filter(isBrowser), 1);
await cleanup();

// Not a failure (their tests ran and reported), but a handle a test left open: named, to be found.
if (lingered.size > 0) console.log(`\n${LINGER_MARK} ${lingered.size} test file(s) stayed up after their tests and were ended: ${[...lingered].map((f) => path.relative(root, f)).join(', ')}`);
const verdict = judge(files.map((f) => path.resolve(root, f)), tally, lingered);
for (const line of report(verdict, (f) => path.relative(root, f))) console.log(line);
process.exit(verdict.ok ? 0 : 1);
