/**
 * Every SQL function has one source file (drizzle/functions/<name>.sql): the newest migration
 * defining it installs exactly that file (`npm run db:function` writes it), and a freshly
 * migrated database defines exactly those functions, as the files say.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { newestMigrationDefinitions, normaliseDefinition, readFunctionSources } from '../src/db/functions.ts';
import { runMigrations } from '../src/db/migrate.ts';
import { createTestDatabase } from './helpers/db.ts';

const sources = readFunctionSources();

test('the newest migration defining each function installs its source file', () => {
  const installed = newestMigrationDefinitions();
  const stale = sources.filter((s) => installed.get(s.name)?.definition !== s.definition).map((s) => s.name);
  assert.deepEqual(stale, [], `run \`npm run db:function -- <migration_name> --changed\` to install: ${stale.join(', ')}`);
  const withoutFile = [...installed.keys()].filter((name) => !sources.some((s) => s.name === name));
  assert.deepEqual(withoutFile, [], 'a function some migration defines has no drizzle/functions file');
});

test("a migrated database's functions are the source files, no more, no fewer", async () => {
  const db = await createTestDatabase();
  try {
    await runMigrations(db.url);
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const rows = await sql<{ name: string; def: string }[]>`
        select p.proname as name, pg_get_functiondef(p.oid) as def
        from pg_proc p join pg_namespace n on n.oid = p.pronamespace
        where n.nspname = current_schema() and p.proname like 'sluice\\_%' order by 1`;
      assert.deepEqual(rows.map((r) => r.name), sources.map((s) => s.name));
      for (const row of rows) {
        const source = sources.find((s) => s.name === row.name)!;
        assert.equal(normaliseDefinition(row.def), source.definition, `drizzle/functions/${row.name}.sql differs from the database's definition`);
      }
    } finally {
      await sql.end();
    }
  } finally {
    await db.drop();
  }
});

test('the comparison sees a changed body and ignores comments outside it', () => {
  const source = sources.find((s) => s.name === 'sluice_quota_period')!;
  assert.equal(normaliseDefinition(`-- another header\n${source.text}\n\n`), source.definition);
  assert.notEqual(normaliseDefinition(source.text.replace('BEGIN', 'BEGIN\n  NULL;')), source.definition);
});
