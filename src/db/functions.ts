/**
 * Sluice's SQL functions have one source file each: `drizzle/functions/<name>.sql`, a header
 * comment saying what the function does and why, then the one `CREATE OR REPLACE FUNCTION`
 * statement written as `pg_get_functiondef` prints it. `git log -p` on that file is the function's
 * history. The migration that installs a change is generated from the files
 * (`npm run db:function -- <migration-name> <function>...`, src/scripts/db-function.ts), and
 * test/sql-functions.test.ts fails when the newest migration defining a function differs from its
 * file, or a migrated database's definition differs from it.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const MIGRATIONS_DIR = fileURLToPath(new URL('../../drizzle', import.meta.url));
export const FUNCTIONS_DIR = path.join(MIGRATIONS_DIR, 'functions');

export interface FunctionSource {
  name: string;
  /** The file's whole text (header comment included): what a generated migration carries. */
  text: string;
  /** The CREATE statement alone, normalised (see `normaliseDefinition`). */
  definition: string;
}

const CREATE = /CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(?:public\.)?("?)([a-z_][a-z0-9_]*)\1\s*\(/i;

/**
 * A definition compared as text: from CREATE on, `CREATE FUNCTION` read as `CREATE OR REPLACE
 * FUNCTION`, no schema prefix on the name, no trailing semicolon, line ends and trailing blanks
 * ignored. The body is compared byte for byte otherwise (Postgres stores it verbatim).
 */
export function normaliseDefinition(sql: string): string {
  const m = CREATE.exec(sql);
  if (!m) throw new Error('no CREATE FUNCTION statement');
  return sql
    .slice(m.index)
    .replace(CREATE, (_all, _q, name: string) => `CREATE OR REPLACE FUNCTION ${name}(`)
    .replace(/\r\n/g, '\n')
    .replace(/[ \t]+$/gm, '')
    .trim()
    .replace(/;\s*$/, '')
    .trim();
}

/** The name of the function a statement creates, or null when it creates none. */
export function createdFunction(statement: string): string | null {
  const m = CREATE.exec(statement.replace(/^\s*--.*$/gm, ''));
  return m ? m[2]!.toLowerCase() : null;
}

export function readFunctionSources(dir = FUNCTIONS_DIR): FunctionSource[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.sql'))
    .sort()
    .map((f) => {
      const text = readFileSync(path.join(dir, f), 'utf8');
      const name = f.slice(0, -'.sql'.length);
      const created = createdFunction(text);
      if (created !== name) throw new Error(`drizzle/functions/${f} must create function ${name} (it creates ${created ?? 'none'})`);
      return { name, text, definition: normaliseDefinition(text) };
    });
}

interface JournalEntry {
  idx: number;
  when: number;
  tag: string;
}

export function readJournal(dir = MIGRATIONS_DIR): { entries: JournalEntry[] } {
  return JSON.parse(readFileSync(path.join(dir, 'meta', '_journal.json'), 'utf8')) as { entries: JournalEntry[] };
}

/**
 * For each function, the normalised definition the newest migration (in journal order) gives it:
 * what a database migrated by this build ends up with.
 */
export function newestMigrationDefinitions(dir = MIGRATIONS_DIR): Map<string, { tag: string; definition: string }> {
  const out = new Map<string, { tag: string; definition: string }>();
  for (const { tag } of readJournal(dir).entries) {
    const text = readFileSync(path.join(dir, `${tag}.sql`), 'utf8');
    for (const statement of text.split('--> statement-breakpoint')) {
      const name = createdFunction(statement);
      if (name) out.set(name, { tag, definition: normaliseDefinition(statement) });
    }
  }
  return out;
}
