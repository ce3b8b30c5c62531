import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { printedSchema } from '../src/graphql/print.ts';

test('schema/schema.graphql matches the Pothos schema (run `npm run schema:print` after changing it)', () => {
  const committed = readFileSync(new URL('../schema/schema.graphql', import.meta.url), 'utf8');
  assert.equal(committed, printedSchema());
});
