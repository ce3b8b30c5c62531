/**
 * One owner per table: docs/ARCHITECTURE.md "Who writes each table" names, for every table of
 * src/db/schema.ts, the ONE TypeScript module that writes it and the SQL functions that do. This
 * test parses that map and scans the sources: a write statement (`insert into`, `update`,
 * `delete from` in a template literal, or a drizzle `.insert(table)`/`.update(table)`/
 * `.delete(table)`) naming a table from a module the map does not name fails it, as does a
 * function in drizzle/functions/ writing a table it is not listed for, and a map entry no
 * longer true (a listed owner that writes nothing there).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SRC = path.join(ROOT, 'src');
const FUNCTIONS = path.join(ROOT, 'drizzle', 'functions');

interface Owners {
  module: string | null;
  functions: string[];
}

/** The map: the rows of the table under the heading "Who writes each table". */
function parseOwnerMap(markdown: string): Map<string, Owners> {
  const start = markdown.indexOf('## Who writes each table');
  assert.ok(start >= 0, 'docs/ARCHITECTURE.md has no "Who writes each table" section');
  const end = markdown.indexOf('\n## ', start + 1);
  const section = markdown.slice(start, end < 0 ? undefined : end);
  const map = new Map<string, Owners>();
  for (const line of section.split('\n')) {
    const cells = line.split('|').map((c) => c.trim());
    // | `table` | `module` | `fn`, `fn` |
    if (cells.length < 5 || !/^`\w+`$/.test(cells[1]!)) continue;
    const names = (cell: string) => [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
    const [module = null, ...more] = names(cells[2]!);
    assert.equal(more.length, 0, `${cells[1]} names more than one TypeScript module`);
    map.set(names(cells[1]!)[0]!, { module, functions: names(cells[3]!) });
  }
  return map;
}

/**
 * The literal text of every template literal in TypeScript source (the SQL of tagged templates,
 * nested ones included), without comments, strings or code. A small lexer: comments, quoted
 * strings, regular expression literals (by the usual heuristic) and `${ }` nesting.
 */
function templateTexts(source: string): string[] {
  const out: string[] = [];
  // The open templates, innermost last: each one's text so far and, while the lexer is in the code
  // of one of its `${ }`, that code's brace depth.
  const stack: Array<{ text: string; braces: number }> = [];
  let inTemplate = false;
  let prev = '';
  let i = 0;
  const n = source.length;
  while (i < n) {
    const c = source[i]!;
    if (inTemplate) {
      const top = stack[stack.length - 1]!;
      if (c === '\\') {
        top.text += source.slice(i, i + 2);
        i += 2;
      } else if (c === '`') {
        // Its end: back in the code around it (the enclosing template's `${ }`, if any).
        out.push(stack.pop()!.text);
        inTemplate = false;
        prev = '`';
        i++;
      } else if (c === '$' && source[i + 1] === '{') {
        top.text += ' ';
        top.braces = 1;
        inTemplate = false;
        prev = '{';
        i += 2;
      } else {
        top.text += c;
        i++;
      }
      continue;
    }
    if (c === '/' && source[i + 1] === '/') {
      const eol = source.indexOf('\n', i);
      i = eol < 0 ? n : eol;
    } else if (c === '/' && source[i + 1] === '*') {
      const close = source.indexOf('*/', i + 2);
      i = close < 0 ? n : close + 2;
    } else if (c === "'" || c === '"') {
      let j = i + 1;
      while (j < n && source[j] !== c && source[j] !== '\n') j += source[j] === '\\' ? 2 : 1;
      i = j + 1;
      prev = c;
    } else if (c === '/' && (prev === '' || '(,=:[!&|?{};+-*%<>~^'.includes(prev))) {
      // A regular expression literal: to its closing slash, outside any character class.
      let j = i + 1;
      let inClass = false;
      while (j < n && source[j] !== '\n' && (inClass || source[j] !== '/')) {
        if (source[j] === '\\') j++;
        else if (source[j] === '[') inClass = true;
        else if (source[j] === ']') inClass = false;
        j++;
      }
      i = j + 1;
      prev = '/';
    } else if (c === '`') {
      stack.push({ text: '', braces: 0 });
      inTemplate = true;
      i++;
    } else {
      const top = stack[stack.length - 1];
      if (top && c === '{') top.braces++;
      if (top && c === '}' && --top.braces === 0) inTemplate = true;
      if (!/\s/.test(c)) prev = c;
      i++;
    }
  }
  return out;
}

/** The tables a piece of SQL writes (other schemas' tables, e.g. pgboss.job, are left out). */
function writtenTables(sqlText: string): string[] {
  const text = sqlText.replace(/--[^\n]*/g, '');
  const found = new Set<string>();
  for (const m of text.matchAll(/\b(?:insert\s+into|update|delete\s+from)\s+(?:only\s+)?(?!(?:set|of|skip|nowait)\b)"?([a-z_][a-z0-9_]*)\b"?(?!\.)/gi)) found.add(m[1]!.toLowerCase());
  return [...found];
}

/** The tables a TypeScript source writes through drizzle, given the schema's table constants. */
function drizzleWrites(source: string, constants: Map<string, string>): string[] {
  return [...source.matchAll(/\.(?:insert|update|delete)\(\s*(\w+)\s*\)/g)].map((m) => constants.get(m[1]!)).filter((t): t is string => t !== undefined);
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? sourceFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

const schemaSource = readFileSync(path.join(SRC, 'db', 'schema.ts'), 'utf8');
/** schema.ts's table constants: `export const schedTenants = pgTable('sched_tenants'` → sched_tenants. */
const constants = new Map([...schemaSource.matchAll(/export const (\w+) = pgTable\(\s*'(\w+)'/g)].map((m) => [m[1]!, m[2]!] as const));
const owners = parseOwnerMap(readFileSync(path.join(ROOT, 'docs', 'ARCHITECTURE.md'), 'utf8'));

/** Every (table, writer) pair in the sources: writer is a path under the repository, or a function name. */
function writes(): Array<{ table: string; writer: string; kind: 'module' | 'function' }> {
  const out: Array<{ table: string; writer: string; kind: 'module' | 'function' }> = [];
  for (const file of sourceFiles(SRC)) {
    const source = readFileSync(file, 'utf8');
    const tables = new Set([...templateTexts(source).flatMap(writtenTables), ...drizzleWrites(source, constants)]);
    for (const table of tables) out.push({ table, writer: path.relative(ROOT, file), kind: 'module' });
  }
  for (const f of readdirSync(FUNCTIONS).filter((x) => x.endsWith('.sql'))) {
    for (const table of writtenTables(readFileSync(path.join(FUNCTIONS, f), 'utf8'))) out.push({ table, writer: f.replace(/\.sql$/, ''), kind: 'function' });
  }
  return out.filter((w) => owners.has(w.table));
}

test('the map names every table of the schema, and only those', () => {
  assert.deepEqual([...owners.keys()].sort(), [...constants.values()].sort());
});

test('every table is written only by the module and the SQL functions the map names', () => {
  const strays = writes()
    .filter((w) => (w.kind === 'module' ? owners.get(w.table)!.module !== w.writer : !owners.get(w.table)!.functions.includes(w.writer)))
    .map((w) => `${w.table} is written by ${w.writer}, which docs/ARCHITECTURE.md "Who writes each table" does not name`);
  assert.deepEqual(strays, []);
});

test('every owner the map names writes its table', () => {
  const found = new Set(writes().map((w) => `${w.table} ${w.writer}`));
  const stale: string[] = [];
  for (const [table, o] of owners) {
    for (const writer of [...(o.module ? [o.module] : []), ...o.functions]) if (!found.has(`${table} ${writer}`)) stale.push(`${table}: ${writer} writes nothing there`);
  }
  assert.deepEqual(stale, []);
});

test('the scan finds writes in tagged templates, nested ones too, and not in comments, strings or code', () => {
  const source = [
    '// update jobs set state = 1',
    '/* delete from nodes */',
    "const s = 'insert into windows';",
    'const r = /`update alerts`/;',
    'await sql`update sched_queues set ready_at = ${at} where ${cond ? sql`tenant_id = any(${ids})` : sql`true`}`;',
    'await tx`with x as (select 1) delete from reservations r using x -- update breakers\n where r.id = x.id`;',
    'await sql`insert into pgboss.job (id) values (1) on conflict do update set x = 1 for update`;',
  ].join('\n');
  assert.deepEqual(templateTexts(source).flatMap(writtenTables).sort(), ['reservations', 'sched_queues']);
  assert.deepEqual(writtenTables('UPDATE "Windows" SET tokens = 0; delete from only nodes'), ['windows', 'nodes']);
});

test('the map parser reads the module and function columns', () => {
  const md = '## Who writes each table\n\n| Table | TS | SQL |\n|---|---|---|\n| `jobs` | `src/jobs/store.ts` | `sluice_lease`, `sluice_finish_jobs` |\n| `deltas` | | `sluice_fold` |\n\n## Next\n| `x` | `y` | |';
  assert.deepEqual(
    [...parseOwnerMap(md)],
    [
      ['jobs', { module: 'src/jobs/store.ts', functions: ['sluice_lease', 'sluice_finish_jobs'] }],
      ['deltas', { module: null, functions: ['sluice_fold'] }],
    ],
  );
});
