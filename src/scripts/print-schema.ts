/**
 * Prints the Pothos schema to schema/schema.graphql (committed; a test fails on drift), and the
 * scope table (src/graphql/scope-table.ts) into README.md between its markers.
 * `--check` exits 1 instead of writing when either differs.
 */
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { printedSchema } from '../graphql/print.ts';
import { schema } from '../graphql/schema.ts';
import { scopeTable, withScopeTable } from '../graphql/scope-table.ts';

const target = fileURLToPath(new URL('../../schema/schema.graphql', import.meta.url));
const readmePath = fileURLToPath(new URL('../../README.md', import.meta.url));
const printed = printedSchema();
const readme = readFileSync(readmePath, 'utf8');
const withTable = withScopeTable(readme, scopeTable(schema));
if (withTable === null) {
  console.error('README.md has no scope-table markers (see src/graphql/scope-table.ts)');
  process.exit(1);
}
if (process.argv.includes('--check')) {
  let current = '';
  try {
    current = readFileSync(target, 'utf8');
  } catch {}
  let stale = false;
  if (current !== printed) {
    console.error('schema/schema.graphql is out of date: run `npm run schema:print`');
    stale = true;
  }
  if (withTable !== readme) {
    console.error("README.md's scope table is out of date: run `npm run schema:print`");
    stale = true;
  }
  if (stale) process.exit(1);
  console.log("schema/schema.graphql and README.md's scope table are up to date");
} else {
  mkdirSync(new URL('../../schema/', import.meta.url), { recursive: true });
  writeFileSync(target, printed);
  console.log(`wrote ${target}`);
  if (withTable !== readme) {
    writeFileSync(readmePath, withTable);
    console.log(`wrote the scope table into ${readmePath}`);
  }
}
