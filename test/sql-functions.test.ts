/**
 * Every SQL function has one source file (drizzle/functions/<name>.sql): the newest migration
 * defining it installs exactly that file (`npm run db:function` writes it), and a freshly
 * migrated database defines exactly those functions, as the files say. The same holds for
 * triggers: each one's CREATE TRIGGER is in the file of the function it executes, and the
 * database's triggers (name, table, timing, events, WHEN clause, function) are exactly the files'.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { newestMigrationDefinitions, newestMigrationTriggers, normaliseDefinition, normaliseTrigger, readFunctionSources } from '../src/db/functions.ts';
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

test('the newest migration creating each trigger installs its function file\'s statement', () => {
  const installed = newestMigrationTriggers();
  const triggers = sources.flatMap((s) => s.triggers);
  const stale = triggers.filter((t) => installed.get(t.name)?.definition !== t.definition).map((t) => t.name);
  assert.deepEqual(stale, [], `run \`npm run db:function -- <migration_name> --changed\` to install: ${stale.join(', ')}`);
  const withoutFile = [...installed.keys()].filter((name) => !triggers.some((t) => t.name === name));
  assert.deepEqual(withoutFile, [], 'a trigger some migration creates is in no drizzle/functions file');
  for (const s of sources) {
    for (const t of s.triggers) assert.match(t.definition, new RegExp(`EXECUTE FUNCTION ${s.name}\\(\\)$`), `${t.name} must be in the file of the function it executes`);
  }
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
      // Every trigger a migration made (not the internal ones behind foreign keys), in this schema.
      const triggers = await sql<{ name: string; fn: string; def: string }[]>`
        select t.tgname as name, p.proname as fn, pg_get_triggerdef(t.oid) as def
        from pg_trigger t join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
        join pg_proc p on p.oid = t.tgfoid
        where not t.tgisinternal and n.nspname = current_schema() order by 1`;
      const fromFiles = sources.flatMap((s) => s.triggers.map((t) => ({ name: t.name, fn: s.name, def: t.definition }))).sort((a, b) => (a.name < b.name ? -1 : 1));
      assert.deepEqual(
        triggers.map((t) => ({ name: t.name, fn: t.fn, def: normaliseTrigger(t.def) })).sort((a, b) => (a.name < b.name ? -1 : 1)),
        fromFiles,
        `the database's triggers differ from drizzle/functions:\n${triggers.map((t) => `${t.fn}: ${t.def}`).join('\n')}`,
      );
    } finally {
      await sql.end();
    }
  } finally {
    await db.drop();
  }
});

test('the tables every job writes several times take no row lock per update and keep room for in-page versions', async () => {
  // Any BEFORE UPDATE row trigger, whatever its column list, makes Postgres lock (and WAL-log the
  // lock of) every row an update touches before it looks at the list: two records per job on jobs.
  // A full page moves each new version to another page: another logged lock, and the whole tuple.
  const db = await createTestDatabase();
  try {
    await runMigrations(db.url);
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const before = await sql<{ name: string }[]>`
        select t.tgname as name from pg_trigger t
        where not t.tgisinternal and t.tgrelid in ('jobs'::regclass, 'reservations'::regclass)
          and (t.tgtype & 1) = 1 and (t.tgtype & 2) = 2 and (t.tgtype & 16) = 16`;
      assert.deepEqual(before.map((t) => t.name), [], 'a BEFORE UPDATE row trigger on a table every job updates');
      const [jobs] = await sql`select reloptions from pg_class where oid = 'jobs'::regclass`;
      assert.deepEqual(jobs!.reloptions, ['fillfactor=70']);
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

test("a trigger's comparison sees a changed WHEN clause and ignores line breaks and comments", () => {
  const source = sources.find((s) => s.name === 'sluice_tenants_shares')!;
  const upd = source.triggers.find((t) => t.name === 'sched_tenants_shares_upd')!;
  assert.equal(normaliseTrigger(`-- a comment\n${upd.text.replace(/\n\s*/g, '\n\n    ')};`), upd.definition);
  assert.notEqual(normaliseTrigger(upd.text.replace('OR (old.reserved_share', 'AND (old.reserved_share')), upd.definition);
  assert.equal(normaliseTrigger(`${upd.text.replace(' ON sched_tenants ', ' ON public.sched_tenants ')}`), upd.definition);
});
