/**
 * postinstall: four fixes to postgres.js 3.4.x that are not released upstream.
 * Idempotent; src/db/guard.ts checks at start that all four are in place.
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
 *
 * 3. A connection that closes fails everything still pending on it and then
 *    forgets it (porsager/postgres #1223 and its family). Three ways a closed
 *    connection's state reached the next connection made by the same object:
 *    - Postgres terminating a backend mid-query sends an ErrorResponse (57P01)
 *      and closes. postgres.js rejects that query with CONNECTION_CLOSED but
 *      keeps it, and the ErrorResponse, as the current query. While the next
 *      query connects, that stale state meets it: with the database still
 *      there it is rejected with the old 57P01; with the database gone
 *      (dropped, or refusing connections) the startup's FATAL is filed under
 *      the stale query, the new query is never rejected, and the connection
 *      reconnects without end, its query pending for ever.
 *    - The same during a new connection's array-type fetch (a restart's
 *      first connections): the reconnect succeeds, but the first query is
 *      rejected with the old 57P01, the type fetch's rejection is unhandled,
 *      and the connection then runs without its array types, so every query
 *      with an array parameter fails with 22P02 (a data error, not an outage).
 *    - A socket that errors (ECONNRESET) before it closes: the error rejects
 *      what was sent so far, but a query written after the error (a
 *      transaction's ROLLBACK) stays in the sent queue, because the close
 *      only fails pending queries when it had no error. The next connection
 *      then pairs each reply with the query before it: a query resolves with
 *      another query's rows, and the last waits for ever.
 *    The patch fails whatever is still pending on every close and clears the
 *    current query and its error; a close while connecting drops the
 *    connection's own startup query (the type fetch), which the next
 *    connection runs again.
 *
 * 4. The first fix's guard, narrowed. A transaction whose connection closed
 *    still writes its ROLLBACK on that connection; if another query has
 *    meanwhile been given the closed connection to open it again (its
 *    `initial`), the guard's `error()` failed that query too, with
 *    CONNECTION_CLOSED, though its own session had not even started (seen as
 *    a plain query failing right after a backend was terminated, about one
 *    run in four of test/real-world-unit.test.ts), and it left the ROLLBACK as
 *    the current query, for the next session's first reply to be paired with.
 *    The guard now fails, and forgets, only what was written for the closed
 *    session.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const root = path.resolve(import.meta.dirname, '..');
export const MARKER = 'sluice: guard porsager/postgres#1208';
export const PIPELINE_MARKER = 'sluice: reserve without pipelining porsager/postgres#1210';
export const STALE_QUERY_MARKER = 'sluice: a closed connection forgets its state porsager/postgres#1223';
export const STALE_WRITE_MARKER = 'sluice: a write after the close fails only its own queries';

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
  {
    marker: STALE_QUERY_MARKER,
    what: 'a closed connection fails and forgets what was pending on it (porsager/postgres#1223)',
    original: `    if (initial)
      return reconnect()

    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))
    closedTime = performance.now()`,
    patched: `    if (initial) { // ${STALE_QUERY_MARKER}
      query = results = errorResponse = null
      return reconnect()
    }

    if (query || sent.length) error(Errors.connection('CONNECTION_CLOSED', options, socket))
    query = results = errorResponse = null
    closedTime = performance.now()`,
  },
  {
    // Applies on top of the first patch's guard.
    marker: STALE_WRITE_MARKER,
    what: 'a write after the close fails only the queries written for the closed session',
    original: `      error(Errors.connection('CONNECTION_CLOSED', options))
      return false`,
    patched: `      // ${STALE_WRITE_MARKER}: what was written here belongs to the closed session (a
      // transaction's ROLLBACK sent on its dead connection); the next session's startup query
      // (initial) is another caller's and must not fail with it, and the stale query must not stay
      // current, or the next session's first reply would be paired with it.
      const err = Errors.connection('CONNECTION_CLOSED', options)
      stream && (stream.destroy(err), stream = null)
      query && queryError(query, err)
      query = null
      while (sent.length) queryError(sent.shift(), err)
      return false`,
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
