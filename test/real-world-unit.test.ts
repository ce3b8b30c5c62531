/**
 * The pure decisions behind "survive the real world", without a server:
 * what counts as "the database is away", the request deadline's commit gate,
 * document nesting, storable strings, malformed GETs, revocation notices and
 * the postgres.js crash signature. Then postgres.js against a real database,
 * with scripts/patch-postgres.mjs applied: a connection killed in the middle
 * of a transaction, of a query, or of its start (through a proxy) fails its
 * queries, coded, without killing the process, and leaves nothing behind for
 * the next connection: no query pending for ever, no reply given to another
 * query, no old error, no missing array types.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
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
import { eventually } from './helpers/app.ts';
import { adminUrl, createTestDatabase } from './helpers/db.ts';

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

/**
 * Unhandled rejections recorded instead of node:test's own handler (which would fail the test for
 * them) until `restore()`: the tests below judge them by the rule a Sluice process lives by.
 */
function recordUnhandled(): { unhandled: unknown[]; restore(): void } {
  const unhandled: unknown[] = [];
  const testHandlers = process.listeners('unhandledRejection');
  process.removeAllListeners('unhandledRejection');
  const record = (reason: unknown) => void unhandled.push(reason);
  process.on('unhandledRejection', record);
  return {
    unhandled,
    restore() {
      process.off('unhandledRejection', record);
      for (const h of testHandlers) process.on('unhandledRejection', h);
    },
  };
}

/** `p`, or 'PENDING' if it has not settled within `ms`. */
const within = <T,>(p: Promise<T>, ms = 10_000): Promise<T | 'PENDING'> => Promise.race([p, new Promise<'PENDING'>((r) => setTimeout(() => r('PENDING'), ms).unref())]);

describe('a connection killed mid-transaction', () => {
  test('no uncaught exception (porsager/postgres#1208), every transaction settles, and later replies reach their own queries', async () => {
    // Without scripts/patch-postgres.mjs the first round throws TypeError "reading 'write'" from a
    // setImmediate, outside any promise: node:test reports it and this test fails. Without its
    // third fix the ROLLBACK written after the socket's error stays queued: the next connection
    // pairs each reply with the query before it, and from the third round on the transactions
    // never settle.
    const db = await createTestDatabase();
    const sql = postgres(db.url, { max: 2, onnotice: () => {} });
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    const outcomes: string[] = [];
    // A query of the killed connection may be rejected where nobody awaits it any more. The process
    // lives through exactly that (src/db/guard.ts: a connection loss is logged, anything else ends
    // the process), so here it is recorded under the same rule instead of node:test's own handler.
    const { unhandled, restore } = recordUnhandled();
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
        assert.notEqual(outcome, 'PENDING', `round ${round}: the transaction settled (${outcomes.join(', ')})`);
        assert.notEqual(outcome, 'committed', `round ${round}: a transaction whose connection died cannot commit`);
        assert.ok(isDatabaseUnavailable(outcome), `round ${round}: a connection error, coded as such: ${(outcome as Error & { code?: string }).code}`);
        outcomes.push((outcome as Error & { code?: string }).code ?? 'error');
      }
      // Both connections of the pool were killed and made again: each reply reaches its own query.
      const answers = await within(Promise.all(Array.from({ length: 8 }, (_, i) => sql`select ${i}::int as n`.then((r) => r[0]!.n as number))));
      assert.deepEqual(answers, [0, 1, 2, 3, 4, 5, 6, 7]);
      const reserved = await within(sql.reserve());
      assert.notEqual(reserved, 'PENDING');
      if (reserved !== 'PENDING') {
        const [row] = await reserved`select pg_backend_pid() as pid`;
        await admin`select pg_terminate_backend(${row!.pid as number})`;
        // A reserved connection whose backend died: later queries reject, coded, instead of crashing or hanging.
        for (let i = 0; i < 3; i++) {
          const r = await within(reserved`select 1`.then(() => 'ok', (e: Error) => e), 5_000);
          assert.ok(r !== 'ok' && r !== 'PENDING' && isDatabaseUnavailable(r), `reserved, query ${i}: a coded connection error, not ${String(r)}`);
          outcomes.push(`reserved:${(r as Error & { code?: string }).code}`);
        }
        reserved.release();
      }
      for (const reason of unhandled) {
        assert.ok(isUnhandledConnectionLoss(reason), `an unhandled rejection the guard would not survive: ${String(reason)}`);
        outcomes.push(`unhandled:${(reason as { code?: string }).code}`);
      }
      console.log(JSON.stringify({ killedMidTransaction: outcomes }));
    } finally {
      await within(sql.end({ timeout: 1 }), 5_000);
      await within(admin.end({ timeout: 1 }), 5_000);
      await db.drop();
      restore();
    }
  });
});

describe("a dead transaction's ROLLBACK and the query that reopens its connection", () => {
  test('the query that reopens the connection gets its own answer, not the old session\'s CONNECTION_CLOSED', async () => {
    // One connection: a transaction on it loses its backend; while the transaction's callback still
    // runs, another query is handed the closed connection to open it again; then the callback
    // fails, and the transaction writes its ROLLBACK on the dead session. Without the fourth fix of
    // scripts/patch-postgres.mjs, that write's CONNECTION_CLOSED failed the other query too.
    const db = await createTestDatabase();
    // The pool's close callback: the transaction's connection is closed (and free for another query) once it ran.
    let onClose: () => void = () => {};
    const sql = postgres(db.url, { max: 1, onnotice: () => {}, onclose: () => onClose() });
    const admin = postgres(db.url, { max: 1, onnotice: () => {} });
    const { unhandled, restore } = recordUnhandled();
    try {
      for (let round = 0; round < 3; round++) {
        // The transaction settles as soon as its connection closes (postgres.js races the callback
        // with the close), so the callback hands its other query over by a promise of its own.
        let handOver!: (answer: Promise<number | Error>) => void;
        const other = new Promise<number | Error>((resolve) => (handOver = resolve));
        const closed = new Promise<void>((resolve) => (onClose = resolve));
        const outcome = await within(
          sql
            .begin(async (tx) => {
              const [row] = await tx`select pg_backend_pid() as pid`;
              await admin`select pg_terminate_backend(${row!.pid as number})`;
              const lost = await tx`select pg_sleep(5)`.then(() => null, (e: Error) => e);
              assert.ok(lost && isDatabaseUnavailable(lost), `round ${round}: the transaction saw its connection fail: ${String(lost)}`);
              assert.notEqual(await within(closed, 5_000), 'PENDING', `round ${round}: the connection closed`);
              handOver(sql`select ${40 + round}::int as n`.then((r) => r[0]!.n as number, (e: Error) => e));
              throw lost;
            })
            .catch((err: Error) => err),
        );
        assert.ok(outcome !== 'PENDING' && isDatabaseUnavailable(outcome), `round ${round}: the transaction failed, coded: ${String(outcome)}`);
        // PENDING: the callback never sent it (one of its own checks failed).
        assert.equal(await within(other), 40 + round, `round ${round}: the reopening query got its own answer`);
      }
      assert.deepEqual(
        unhandled.filter((r) => !isUnhandledConnectionLoss(r)),
        [],
        'no unhandled rejection the guard would not survive',
      );
    } finally {
      await within(sql.end({ timeout: 1 }), 5_000);
      await within(admin.end({ timeout: 1 }), 5_000);
      await db.drop();
      restore();
    }
  });
});

describe('a connection killed while it fetches its array types', () => {
  test('the reconnect serves the first query, not the old 57P01, and array parameters work on it', async () => {
    // A proxy answers the first array-type fetch as a terminated backend does (ErrorResponse 57P01,
    // then the socket closes), as when Postgres restarts under a connection still starting up.
    // Without the third fix of scripts/patch-postgres.mjs: the first query is rejected with that
    // 57P01, the fetch's rejection is unhandled, and the connection runs without its array types:
    // an array parameter then fails with 22P02.
    const db = await createTestDatabase();
    const target = new URL(db.url);
    let intercepted = 0;
    const proxy = net.createServer((client) => {
      const upstream = net.connect(Number(target.port || 5432), target.hostname);
      client.on('data', (b: Buffer) => {
        if (intercepted === 0 && b.includes('typarray')) {
          intercepted++;
          const fields = Buffer.from('SFATAL\0VFATAL\0C57P01\0Mterminating connection due to administrator command\0\0');
          const head = Buffer.alloc(5);
          head.write('E', 0);
          head.writeInt32BE(fields.length + 4, 1);
          client.end(Buffer.concat([head, fields]));
          upstream.destroy();
        } else upstream.write(b);
      });
      upstream.on('data', (b: Buffer) => void (client.writable && client.write(b)));
      for (const [a, b] of [[client, upstream], [upstream, client]] as const) {
        a.on('error', () => b.destroy());
        a.on('close', () => b.destroy());
      }
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    const viaProxy = new URL(db.url);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String((proxy.address() as net.AddressInfo).port);
    const sql = postgres(viaProxy.toString(), { max: 1, onnotice: () => {} });
    const { unhandled, restore } = recordUnhandled();
    try {
      const first = await within(sql`select 1 as n`.then((r) => `served ${r[0]!.n as number}`, (e: Error & { code?: string }) => e.code ?? e.message), 8_000);
      assert.equal(intercepted, 1, 'the type fetch was answered with the termination');
      assert.equal(first, 'served 1');
      const arrays = await within(sql`select ${sql.array([1, 2, 3])}::int[] as a`.then((r) => r[0]!.a as number[], (e: Error & { code?: string }) => e.code ?? e.message), 8_000);
      assert.deepEqual(arrays, [1, 2, 3]);
      await new Promise((r) => setImmediate(r));
      assert.deepEqual(unhandled, [], 'no rejection left unhandled');
    } finally {
      restore();
      await within(sql.end({ timeout: 1 }), 5_000);
      await new Promise<void>((r) => proxy.close(() => r()));
      await db.drop();
    }
  });
});

describe('a connection killed mid-query', () => {
  // Without the third fix of scripts/patch-postgres.mjs the connection keeps the killed query and
  // its 57P01 as its current state: the next query is rejected with that old error, or, when the
  // database is gone, never settles while the connection reconnects without end.
  for (const dropped of [false, true]) {
    test(dropped ? 'its database dropped: the next query on the pool is rejected with 3D000, not left pending' : 'its database kept: the next query on the pool is served, not rejected with the old 57P01', async () => {
      const db = await createTestDatabase();
      const sql = postgres(db.url, { max: 1, onnotice: () => {} });
      const admin = postgres(adminUrl(), { max: 1, onnotice: () => {} });
      try {
        const [row] = await sql`select pg_backend_pid() as pid`;
        const slow = sql`select pg_sleep(5)`.then(() => 'ok', (e: Error & { code?: string }) => e.code ?? e.message);
        // The backend is running the sleep: its query is in flight when it is terminated.
        await eventually(async () => (await admin`select 1 from pg_stat_activity where pid = ${row!.pid as number} and query like 'select pg_sleep%'`).length > 0, 5_000, 20);
        if (dropped) await db.drop();
        else await admin`select pg_terminate_backend(${row!.pid as number})`;
        assert.equal(await within(slow, 5_000), 'CONNECTION_CLOSED', 'the killed query is rejected as a lost connection');
        const next = await within(sql`select 7 as n`.then((r) => `served ${r[0]!.n as number}`, (e: Error & { code?: string }) => e.code ?? e.message), 8_000);
        assert.equal(next, dropped ? '3D000' : 'served 7');
      } finally {
        await within(sql.end({ timeout: 1 }), 5_000);
        await within(admin.end({ timeout: 1 }), 5_000);
        if (!dropped) await db.drop();
      }
    });
  }
});
