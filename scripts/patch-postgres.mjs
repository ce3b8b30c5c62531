/**
 * postinstall: guards postgres.js's nextWrite() against a closed socket
 * (porsager/postgres #1154, #1208; the fix proposed in PR #1209, not released
 * in 3.4.x). Without it, a write scheduled with setImmediate that runs after
 * Postgres dropped the connection throws `TypeError: Cannot read properties of
 * null (reading 'write')` outside any await, and the process dies. With it, the
 * pending queries are rejected with CONNECTION_CLOSED, which Sluice handles
 * like any lost connection. Idempotent; src/db/guard.ts checks it at start.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');
export const MARKER = 'sluice: guard porsager/postgres#1208';
const ORIGINAL = `  function nextWrite(fn) {
    const x = socket.write(chunk, fn)`;
const GUARDED = `  function nextWrite(fn) {
    if (socket === null) { // ${MARKER}
      nextWriteTimer !== null && clearImmediate(nextWriteTimer)
      chunk = nextWriteTimer = null
      error(Errors.connection('CONNECTION_CLOSED', options))
      return false
    }
    const x = socket.write(chunk, fn)`;

let patched = 0;
for (const rel of ['node_modules/postgres/src/connection.js', 'node_modules/postgres/cjs/src/connection.js']) {
  const file = path.join(root, rel);
  if (!existsSync(file)) continue;
  const text = readFileSync(file, 'utf8');
  if (text.includes(MARKER)) continue;
  if (!text.includes(ORIGINAL)) {
    console.warn(`patch-postgres: ${rel} does not have the expected nextWrite(); left as is (check whether the upstream fix landed)`);
    continue;
  }
  writeFileSync(file, text.replace(ORIGINAL, GUARDED));
  patched++;
}
if (patched > 0) console.log(`patch-postgres: guarded nextWrite() in ${patched} file(s) (porsager/postgres#1208)`);
