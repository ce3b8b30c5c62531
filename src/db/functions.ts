/**
 * Sluice's SQL functions have one source file each: `drizzle/functions/<name>.sql`, a header
 * comment saying what the function does and why, then the one `CREATE OR REPLACE FUNCTION`
 * statement written as `pg_get_functiondef` prints it, then the `CREATE TRIGGER` statements of the
 * triggers that execute it (each as `pg_get_triggerdef` prints it, `;`-terminated, comments
 * allowed between them). `git log -p` on that file is the function's and its triggers' history. The migration that installs a change is generated from the files
 * (`npm run db:function -- <migration-name> <function>...`, src/scripts/db-function.ts), and
 * test/sql-functions.test.ts fails when the newest migration defining a function differs from its
 * file, or a migrated database's definition (functions and triggers) differs from it.
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
  /** The CREATE FUNCTION statement alone, normalised (see `normaliseDefinition`). */
  definition: string;
  /** The function's part of the file (header comment and CREATE FUNCTION statement). */
  functionText: string;
  /** The triggers executing the function, in file order. */
  triggers: TriggerSource[];
}

export interface TriggerSource {
  name: string;
  table: string;
  /** The statement as written (its comment lines included), without the semicolon. */
  text: string;
  /** Normalised (see `normaliseTrigger`). */
  definition: string;
}

const FUNCTION_END = /\$function\$;[ \t]*(?:\r?\n|$)/g;
const CREATE_TRIGGER = /^CREATE\s+TRIGGER\s+("?)([a-z_][a-z0-9_]*)\1\s[\s\S]*?\sON\s+(?:public\.)?("?)([a-z_][a-z0-9_]*)\3\s/i;

/** A statement with its comment lines dropped, trimmed. */
function withoutComments(sql: string): string {
  return sql.replace(/^\s*--.*$/gm, '').trim();
}

/** The name of the function or trigger a DROP statement (comments dropped) drops, or null. */
function droppedName(statement: string, kind: 'FUNCTION' | 'TRIGGER'): string | null {
  const m = new RegExp(`^DROP\\s+${kind}\\s+(?:IF\\s+EXISTS\\s+)?("?)([a-z_][a-z0-9_]*)\\1[\\s(]`, 'i').exec(statement);
  return m ? m[2]!.toLowerCase() : null;
}

/**
 * A trigger compared as text: comment lines dropped, runs of blanks read as one space, no schema
 * prefix on the table, no trailing semicolon: `pg_get_triggerdef`'s one line matches a file's
 * statement broken over lines.
 */
export function normaliseTrigger(sql: string): string {
  return withoutComments(sql)
    .replace(/\s+/g, ' ')
    .trim()
    .replace(/;$/, '')
    .replace(/ ON public\./, ' ON ')
    .trim();
}

/** Splits a function file into its function part and its trigger statements. */
export function splitFunctionFile(text: string, file = 'a function file'): { functionText: string; triggers: TriggerSource[] } {
  const ends = [...text.matchAll(FUNCTION_END)];
  if (ends.length === 0) throw new Error(`${file}: the CREATE FUNCTION statement must end with $function$;`);
  const end = ends[0]!.index + ends[0]![0].length;
  const functionText = text.slice(0, end);
  const triggers: TriggerSource[] = [];
  for (const raw of text.slice(end).split(/;[ \t]*(?:\r?\n|$)/)) {
    const statement = withoutComments(raw);
    if (statement === '') continue;
    const m = CREATE_TRIGGER.exec(statement);
    if (!m) throw new Error(`${file}: only CREATE TRIGGER statements may follow the function (found: ${statement.slice(0, 60)})`);
    triggers.push({ name: m[2]!.toLowerCase(), table: m[4]!.toLowerCase(), text: raw.trim(), definition: normaliseTrigger(statement) });
  }
  return { functionText, triggers };
}

/** The name of the trigger a statement creates, or null when it creates none. */
export function createdTrigger(statement: string): string | null {
  const m = CREATE_TRIGGER.exec(withoutComments(statement));
  return m ? m[2]!.toLowerCase() : null;
}

/**
 * What a migration carries for one function: the function, then for each of its triggers a drop
 * and a create (CREATE TRIGGER has no OR REPLACE that keeps it a single idempotent form).
 */
export function installStatements(source: FunctionSource): string[] {
  return [
    source.functionText.trimEnd(),
    ...source.triggers.flatMap((t) => [`DROP TRIGGER IF EXISTS ${t.name} ON ${t.table};`, `${t.text};`]),
  ];
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
  const m = CREATE.exec(withoutComments(statement));
  return m ? m[2]!.toLowerCase() : null;
}

export function readFunctionSources(dir = FUNCTIONS_DIR): FunctionSource[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.sql'))
    .sort()
    .map((f) => {
      const text = readFileSync(path.join(dir, f), 'utf8');
      const name = f.slice(0, -'.sql'.length);
      const { functionText, triggers } = splitFunctionFile(text, `drizzle/functions/${f}`);
      const created = createdFunction(functionText);
      if (created !== name) throw new Error(`drizzle/functions/${f} must create function ${name} (it creates ${created ?? 'none'})`);
      return { name, text, functionText, triggers, definition: normaliseDefinition(functionText) };
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
 * what a database migrated by this build ends up with. A function some migration dropped without
 * creating it again is absent.
 */
export function newestMigrationDefinitions(dir = MIGRATIONS_DIR): Map<string, { tag: string; definition: string }> {
  const out = new Map<string, { tag: string; definition: string }>();
  for (const { tag } of readJournal(dir).entries) {
    const text = readFileSync(path.join(dir, `${tag}.sql`), 'utf8');
    for (const statement of text.split('--> statement-breakpoint')) {
      const dropped = droppedName(withoutComments(statement), 'FUNCTION');
      if (dropped) out.delete(dropped);
      const name = createdFunction(statement);
      if (name) out.set(name, { tag, definition: normaliseDefinition(statement) });
    }
  }
  return out;
}

/**
 * For each trigger, the normalised definition the newest migration (in journal order) creating it
 * gives it. A trigger some migration dropped without creating it again is absent.
 */
export function newestMigrationTriggers(dir = MIGRATIONS_DIR): Map<string, { tag: string; definition: string }> {
  const out = new Map<string, { tag: string; definition: string }>();
  for (const { tag } of readJournal(dir).entries) {
    const text = readFileSync(path.join(dir, `${tag}.sql`), 'utf8');
    for (const statement of text.split('--> statement-breakpoint')) {
      const stripped = withoutComments(statement);
      const created = createdTrigger(stripped);
      if (created) {
        out.set(created, { tag, definition: normaliseTrigger(stripped) });
        continue;
      }
      const dropped = droppedName(stripped, 'TRIGGER');
      if (dropped) out.delete(dropped);
    }
  }
  return out;
}
