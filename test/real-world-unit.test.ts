/**
 * The pure decisions behind "survive the real world", without a server:
 * what counts as "the database is away", the request deadline's commit gate,
 * document nesting, storable strings, malformed GETs, revocation notices and
 * the postgres.js crash signature. Then one database test: a connection
 * killed in the middle of a transaction fails its queries, it does not kill
 * the process.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { databaseUnavailable, isDatabaseUnavailable } from '../src/db/availability.ts';
import { isPostgresWriteAfterClose, isUnhandledConnectionLoss, postgresPatched } from '../src/db/guard.ts';
import { CommitGate } from '../src/http/deadline.ts';
import { MAX_DOCUMENT_NESTING, maxNesting } from '../src/http/hardening.ts';
import { badString, checkGetRequest, codedEmptyError, findBadString } from '../src/http/input.ts';
import { authNoticePayload, parseAuthNotice } from '../src/tenants/auth-notice.ts';
import { validateJob } from '../src/jobs/validate.ts';
import { buildCatalog } from '../src/config/apis.ts';
import { loadEnv } from '../src/config/env.ts';
import { createTestDatabase } from './helpers/db.ts';

describe('database availability', () => {
  test('connection failures and server shutdowns are "unavailable", query errors are not', () => {
    for (const code of ['ECONNREFUSED', 'CONNECTION_CLOSED', 'CONNECT_TIMEOUT', '57P01', '57P03', '08006']) {
      assert.ok(isDatabaseUnavailable(Object.assign(new Error('x'), { code })), code);
    }
    // Wrapped by drizzle or pg-boss: found through `cause`.
    assert.ok(isDatabaseUnavailable(new Error('Failed query', { cause: Object.assign(new Error('x'), { code: 'ECONNRESET' }) })));
    assert.ok(isDatabaseUnavailable(new AggregateError([Object.assign(new Error('x'), { code: 'ECONNREFUSED' })])));
    for (const code of ['23505', '42P01', '22P05', undefined]) assert.ok(!isDatabaseUnavailable(Object.assign(new Error('x'), { code })), String(code));
    const e = databaseUnavailable();
    assert.equal(e.code, 'DATABASE_UNAVAILABLE');
    assert.equal(e.httpStatus, 503);
    assert.ok(Number(e.httpHeaders?.['Retry-After']) >= 1);
  });

  test('the commit gate: a deadline answers only when no commit is under way, and a commit never starts after it', () => {
    const a = new CommitGate();
    assert.equal(a.expire(), true);
    assert.equal(a.enterCommit(), false, 'answered 503: the submission must roll back');
    const b = new CommitGate();
    assert.equal(b.enterCommit(), true);
    assert.equal(b.expire(), false, 'committing: the deadline waits for the real outcome');
  });

  test("postgres.js's write-after-close throw is recognised, nothing else is", () => {
    const crash = new TypeError("Cannot read properties of null (reading 'write')");
    crash.stack = `TypeError: Cannot read properties of null (reading 'write')\n    at Immediate.nextWrite (file:///app/node_modules/postgres/src/connection.js:255:22)`;
    assert.ok(isPostgresWriteAfterClose(crash));
    const other = new TypeError("Cannot read properties of null (reading 'write')");
    other.stack = `TypeError: ...\n    at write (file:///app/src/mine.ts:1:1)`;
    assert.ok(!isPostgresWriteAfterClose(other));
    assert.ok(!isPostgresWriteAfterClose(new Error('boom')));
    assert.ok(postgresPatched(), 'npm ci applied scripts/patch-postgres.mjs');
  });

  test('an unhandled rejection is survived only when it is a lost connection', () => {
    assert.ok(isUnhandledConnectionLoss(Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' })));
    assert.ok(isUnhandledConnectionLoss(Object.assign(new Error('write CONNECTION_CLOSED'), { code: 'CONNECTION_CLOSED' })));
    assert.ok(!isUnhandledConnectionLoss(new TypeError('x is not a function')));
    assert.ok(!isUnhandledConnectionLoss(Object.assign(new Error('duplicate key'), { code: '23505' })));
  });
});

describe('input hardening', () => {
  test('document nesting is measured outside strings and comments', () => {
    assert.equal(maxNesting('{ a { b } }'), 2);
    assert.equal(maxNesting('{ a(x: "{{{{{{") # {{{{{{\n }'), 2);
    assert.equal(maxNesting('{ a(x: """ {{{{ """) }'), 2);
    assert.equal(maxNesting('{a:'.repeat(3000)), 3000);
    assert.ok(MAX_DOCUMENT_NESTING < 3000);
  });

  test('NUL bytes and lone surrogates are refused, naming the field; real Unicode passes', () => {
    assert.equal(badString('héllo 💥'), null);
    assert.match(badString('a\u0000b')!, /NUL/);
    assert.match(badString('x\ud800')!, /surrogate/);
    assert.deepEqual(findBadString({ i: { jobs: [{ params: { domain: 'ok' } }, { params: { domain: 'a\u0000' } }] } }, ''), { field: 'i.jobs[1].params.domain', reason: 'contains a NUL byte (\\u0000)' });
    assert.equal(findBadString({ a: ['fine', 1, null] }, ''), null);
    assert.equal(findBadString({ ['k\udc00']: 1 }, 'v')?.field, 'v (a key)');
  });

  test('params are bounded: MAX_PARAM_KEYS and MAX_PARAMS_BYTES, and their strings must be storable', () => {
    const catalog = buildCatalog('', '');
    const limits = { maxKeys: 3, maxBytes: 200 };
    const refused = (params: Record<string, unknown>) => {
      try {
        validateJob({ api: 'dnslookup', params }, catalog, 0, limits);
        return null;
      } catch (err) {
        return err as { code: string; message: string; extensions: Record<string, unknown> };
      }
    };
    assert.equal(refused({ domain: 'a.example' }), null);
    assert.match(refused({ domain: 'a', b: 1, c: 2, d: 3 })!.message, /MAX_PARAM_KEYS/);
    assert.match(refused({ domain: 'x'.repeat(300) })!.message, /MAX_PARAMS_BYTES/);
    const nul = refused({ domain: 'a\u0000.example' })!;
    assert.equal(nul.code, 'BAD_USER_INPUT');
    assert.equal(nul.extensions.field, 'params.domain');
    assert.equal(refused({ domain: 'ok', ['\ud800']: 'x' })!.extensions.field, 'params (a key)');
  });

  test('a GET with malformed variables or extensions is a coded 400; Yoga\'s empty 406/415 get a code', () => {
    assert.equal(checkGetRequest(new URLSearchParams({ query: '{a}' })), null);
    assert.equal(checkGetRequest(new URLSearchParams({ query: '{a}', variables: '{"a":1}' })), null);
    assert.equal(checkGetRequest(new URLSearchParams({ variables: '{' }))?.extensions.code, 'BAD_REQUEST');
    assert.equal(checkGetRequest(new URLSearchParams({ extensions: '[1]' }))?.extensions.code, 'BAD_REQUEST');
    assert.equal(codedEmptyError(406)?.extensions.code, 'NOT_ACCEPTABLE');
    assert.equal(codedEmptyError(415)?.extensions.code, 'UNSUPPORTED_MEDIA_TYPE');
    assert.equal(codedEmptyError(200), null);
  });

  test('revocation notices round-trip; foreign payloads are ignored', () => {
    assert.deepEqual(parseAuthNotice(authNoticePayload('t1')), { tenantId: 't1' });
    assert.equal(parseAuthNotice('nonsense'), null);
    assert.equal(parseAuthNotice('{"other":1}'), null);
  });

  test('production is the default: only NODE_ENV=development shows error details', () => {
    assert.equal(loadEnv({}).NODE_ENV, 'production');
    assert.equal(loadEnv({}).SHUTDOWN_GRACE_SECONDS, 30);
  });
});

/** `p`, or 'PENDING' if it has not settled within `ms` (postgres.js can leave a query of a killed connection pending). */
const within = <T,>(p: Promise<T>, ms = 10_000): Promise<T | 'PENDING'> => Promise.race([p, new Promise<'PENDING'>((r) => setTimeout(() => r('PENDING'), ms).unref())]);

describe('a connection killed mid-transaction', () => {
  test('no uncaught exception (porsager/postgres#1208): its queries fail with a connection error', async () => {
    // Without scripts/patch-postgres.mjs the first round throws TypeError "reading 'write'" from a
    // setImmediate, outside any promise: node:test reports it and this test fails.
    const db = await createTestDatabase();
    const sql = postgres(db.url, { max: 2, onnotice: () => {} });
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    const outcomes: string[] = [];
    // postgres.js may reject a query of the killed connection where nobody awaits it any more. The
    // process lives through exactly that (src/db/guard.ts: a connection loss is logged, anything else
    // ends the process), so here it is recorded under the same rule instead of node:test's own handler.
    const unhandled: unknown[] = [];
    const testHandlers = process.listeners('unhandledRejection');
    process.removeAllListeners('unhandledRejection');
    const record = (reason: unknown) => void unhandled.push(reason);
    process.on('unhandledRejection', record);
    try {
      for (let round = 0; round < 5; round++) {
        const outcome = await within(
          sql
            .begin(async (tx) => {
              const [row] = await tx`select pg_backend_pid() as pid`;
              await admin`select pg_terminate_backend(${row!.pid as number})`;
              // Small writes go through setImmediate: the case that used to throw outside any promise.
              await tx`select 1`;
              await tx`select 2`;
              return 'committed';
            })
            .catch((err: Error) => err),
        );
        if (outcome === 'PENDING') {
          outcomes.push('pending');
          continue;
        }
        assert.notEqual(outcome, 'committed', `round ${round}: a transaction whose connection died cannot commit`);
        assert.ok(isDatabaseUnavailable(outcome), `round ${round}: a connection error, coded as such: ${(outcome as Error & { code?: string }).code}`);
        outcomes.push((outcome as Error & { code?: string }).code ?? 'error');
      }
      // reserve() itself can be rejected with the error of a connection an earlier round killed
      // (seen on a clean clone, about one run in four): that too must be a coded connection error.
      const reserved = await within(sql.reserve().catch((err: Error) => err), 5_000);
      if (reserved instanceof Error) {
        assert.ok(isDatabaseUnavailable(reserved), `reserve: a connection error: ${reserved.message}`);
        outcomes.push(`reserve:${(reserved as Error & { code?: string }).code}`);
      } else if (reserved !== 'PENDING') {
        // The reserved connection may itself be one whose backend an earlier round terminated: that fails here, coded.
        const row = await reserved`select pg_backend_pid() as pid`.then((rows) => rows[0], (err: Error) => err);
        if (row instanceof Error) {
          assert.ok(isDatabaseUnavailable(row), `a connection error: ${row.message}`);
          outcomes.push(`reserved:${(row as Error & { code?: string }).code}`);
        } else await admin`select pg_terminate_backend(${row!.pid as number})`;
        // A reserved connection whose backend died: later queries reject instead of crashing.
        for (let i = 0; i < 3 && !(row instanceof Error); i++) {
          const r = await within(reserved`select 1`.then(() => 'ok', (e: Error & { code?: string }) => e.code ?? 'error'), 5_000);
          outcomes.push(`reserved:${r}`);
          assert.notEqual(r, 'ok');
        }
        reserved.release();
      }
      for (const reason of unhandled) {
        assert.ok(isUnhandledConnectionLoss(reason), `an unhandled rejection the guard would not survive: ${String(reason)}`);
        outcomes.push(`unhandled:${(reason as { code?: string }).code}`);
      }
      console.log(JSON.stringify({ killedMidTransaction: outcomes }));
      // postgres.js may also leave a begin() pending when BEGIN meets a backend that was already terminated
      // (its connection is not returned to the pool): recorded, not asserted; see docs/ARCHITECTURE.md.
      assert.ok(outcomes[0] !== 'pending', `the first round settled: ${outcomes.join(', ')}`);
    } finally {
      await within(sql.end({ timeout: 1 }), 5_000);
      await within(admin.end({ timeout: 1 }), 5_000);
      await db.drop();
      process.off('unhandledRejection', record);
      for (const h of testHandlers) process.on('unhandledRejection', h);
    }
  });
});
