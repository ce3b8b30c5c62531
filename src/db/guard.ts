/**
 * The process must not die because Postgres went away. postgres.js can throw
 * from a setImmediate after a connection closed (porsager/postgres #1154,
 * #1208): `TypeError: Cannot read properties of null (reading 'write')` in
 * nextWrite, outside any promise, which would end the process.
 *
 * scripts/patch-postgres.mjs (postinstall) fixes the cause in node_modules;
 * this guard is the second line: it recognises exactly that throw, logs it and
 * lets the process live (the queries on that connection were already failed
 * with CONNECTION_CLOSED by postgres.js). Any other uncaught exception still
 * ends the process, as it should.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import type { Logger } from '../log.ts';
import { isDatabaseUnavailable } from './availability.ts';

// The markers scripts/patch-postgres.mjs writes: the nextWrite guard, `begin` reserving its
// connection with pipelining off (which a pooler needs: src/db/client.ts), and a closed
// connection forgetting its query (else the next query on it can wait for ever), and a write after
// the close failing only the closed session's queries (not the next session's first one).
const PATCH_MARKERS = [
  'sluice: guard porsager/postgres#1208',
  'sluice: reserve without pipelining porsager/postgres#1210',
  'sluice: a closed connection forgets its state porsager/postgres#1223',
  'sluice: a write after the close fails only its own queries',
];

/** True for postgres.js's write-after-close throw, and nothing else. Pure. */
export function isPostgresWriteAfterClose(err: unknown): boolean {
  if (!(err instanceof TypeError)) return false;
  const stack = err.stack ?? '';
  return /reading 'write'|evaluating 'socket\.write'/.test(err.message) && /postgres[\\/](cjs[\\/])?src[\\/]connection\.js/.test(stack) && /nextWrite/.test(stack);
}

/** Whether the installed postgres.js carries every one of scripts/patch-postgres.mjs's fixes. */
export function postgresPatched(): boolean {
  try {
    const file = createRequire(import.meta.url).resolve('postgres').replace(/cjs[\\/]src[\\/]index\.js$|src[\\/]index\.js$/, 'src/connection.js');
    const text = readFileSync(file, 'utf8');
    return PATCH_MARKERS.every((m) => text.includes(m));
  } catch {
    return false;
  }
}

let installed = false;

export function installConnectionCrashGuard(log: Logger): void {
  if (installed) return;
  installed = true;
  if (!postgresPatched()) log.warn('postgres.js is not patched (run `npm ci` to apply scripts/patch-postgres.mjs): the crash guard still catches a write after close, but behind a pooler every transaction would be refused');
  process.on('uncaughtException', (err, origin) => {
    if (isPostgresWriteAfterClose(err)) {
      log.warn({ err: { message: err.message } }, 'postgres.js wrote to a closed connection (porsager/postgres#1208): ignored, the connection is replaced');
      return;
    }
    log.fatal({ err, origin }, 'uncaught exception');
    process.exit(1);
  });
  // A query of a connection that Postgres terminated (57P01 on a restart, a reset) can be rejected
  // where nobody awaits it any more (postgres.js rejects everything queued on that connection; the
  // awaited paths get their own error). Node would end the process for it: a lost connection is an
  // outage to ride out, so it is logged. Any other unhandled rejection still ends the process.
  process.on('unhandledRejection', (reason) => {
    if (isUnhandledConnectionLoss(reason)) {
      log.warn({ err: { message: (reason as Error).message, code: (reason as { code?: unknown }).code } }, 'a query of a lost connection was rejected with nobody waiting: ignored');
      return;
    }
    log.fatal({ err: reason }, 'unhandled rejection');
    process.exit(1);
  });
}

/** An unhandled rejection the process lives through: a database connection lost, nothing else. Pure. */
export function isUnhandledConnectionLoss(reason: unknown): boolean {
  return isDatabaseUnavailable(reason);
}
