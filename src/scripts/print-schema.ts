/**
 * Prints the Pothos schema to schema/schema.graphql (committed; a test fails on drift).
 * `--check` exits 1 instead of writing when the file differs.
 */
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { printedSchema } from '../graphql/print.ts';

const target = fileURLToPath(new URL('../../schema/schema.graphql', import.meta.url));
const printed = printedSchema();
if (process.argv.includes('--check')) {
  let current = '';
  try {
    current = readFileSync(target, 'utf8');
  } catch {}
  if (current !== printed) {
    console.error('schema/schema.graphql is out of date: run `npm run schema:print`');
    process.exit(1);
  }
  console.log('schema/schema.graphql is up to date');
} else {
  mkdirSync(new URL('../../schema/', import.meta.url), { recursive: true });
  writeFileSync(target, printed);
  console.log(`wrote ${target}`);
}
