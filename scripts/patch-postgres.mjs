/**
 * postinstall: two fixes to postgres.js 3.4.x that are not released upstream.
 * Idempotent; src/db/guard.ts checks at start that both are in place.
 *
 * 1. nextWrite() guarded against a closed socket (porsager/postgres #1154,
 *    #1208; the fix proposed in PR #1209). Without it, a write scheduled with
 *    setImmediate that runs after Postgres dropped the connection throws
 *    `TypeError: Cannot read properties of null (reading 'write')` outside any
 *    await, and the process dies. With it, the pending queries are rejected
 *    with CONNECTION_CLOSED, which Sluice handles like any lost connection.
 *
 * 2. A transaction's `begin` reserves its connection even when pipelining is
 *    off (porsager/postgres #1210). Behind a transaction-mode pooler Sluice
 *    turns pipelining off (`max_pipeline: 0`, src/db/client.ts): PgBouncer
 *    hands the server connection back at the first query's ReadyForQuery and
 *    drops the replies to a query pipelined behind it, which then waits
 *    forever (porsager/postgres #970). postgres.js skips its reservation hook
 *    when the pipeline is full, so with `max_pipeline: 0` every `sql.begin`
 *    failed with UNSAFE_TRANSACTION; the patch calls the hook either way.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');
export const MARKER = 'sluice: guard porsager/postgres#1208';
export const PIPELINE_MARKER = 'sluice: reserve without pipelining porsager/postgres#1210';

const PATCHES = [
  {
    marker: MARKER,
    what: 'guarded nextWrite() (porsager/postgres#1208)',
    original: `  function nextWrite(fn) {
    const x = socket.write(chunk, fn)`,
    patched: `  function nextWrite(fn) {
    if (socket === null) { // ${MARKER}
      nextWriteTimer !== null && clearImmediate(nextWriteTimer)
      chunk = nextWriteTimer = null
      error(Errors.connection('CONNECTION_CLOSED', options))
      return false
    }
    const x = socket.write(chunk, fn)`,
  },
  {
    marker: PIPELINE_MARKER,
    what: 'begin reserves its connection with max_pipeline 0 (porsager/postgres#1210)',
    original: `      build(q)
      return write(toBuffer(q))
        && !q.describeFirst
        && !q.cursorFn
        && sent.length < max_pipeline
        && (!q.options.onexecute || q.options.onexecute(connection))`,
    patched: `      build(q)
      const more = write(toBuffer(q)) // ${PIPELINE_MARKER}
        && !q.describeFirst
        && !q.cursorFn
        && sent.length < max_pipeline
      return (!q.options.onexecute || q.options.onexecute(connection)) && more`,
  },
];

for (const rel of ['node_modules/postgres/src/connection.js', 'node_modules/postgres/cjs/src/connection.js']) {
  const file = path.join(root, rel);
  if (!existsSync(file)) continue;
  let text = readFileSync(file, 'utf8');
  const applied = [];
  for (const p of PATCHES) {
    if (text.includes(p.marker)) continue;
    if (!text.includes(p.original)) {
      console.warn(`patch-postgres: ${rel} does not have the code for "${p.what}"; left as is (check whether the upstream fix landed)`);
      continue;
    }
    text = text.replace(p.original, p.patched);
    applied.push(p.what);
  }
  if (applied.length > 0) {
    writeFileSync(file, text);
    console.log(`patch-postgres: ${rel}: ${applied.join('; ')}`);
  }
}
