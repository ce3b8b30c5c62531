/**
 * Pure decision logic: validation, tenant limits and periods, retry planning,
 * authorization. No database.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { buildCatalog, DEFAULT_CATALOG } from '../src/config/apis.ts';
import { loadEnv, ConfigError } from '../src/config/env.ts';
import { validateSubmission, validateJob } from '../src/jobs/validate.ts';
import { SluiceError } from '../src/errors.ts';
import { effectiveLimits, quotaPeriod, requestBudgetLimits } from '../src/tenants/policy.ts';
import { TIERS } from '../src/config/tiers.ts';
import { planSettlement, retryDelaySeconds } from '../src/dispatch/retry.ts';
import { authorize } from '../src/graphql/auth-plugin.ts';
import { bearerToken } from '../src/tenants/keys.ts';
import { checkNewKey, keyLive, lastUseDue, rotationExpiry } from '../src/tenants/api-keys.ts';
import { closedAncestor } from '../src/db/embedded.ts';
import { databaseTargets, timeoutStatements } from '../src/db/client.ts';
import { classifySettleError, pickSettleUnits, planSettleFailure, SETTLE_MAX_FAULTS } from '../src/dispatch/settle-groups.ts';
import fc from 'fast-check';
import type { CallOutcome } from '../src/provider/types.ts';

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (err instanceof SluiceError) return err.code;
    throw err;
  }
  return 'NO_ERROR';
}

describe('job validation', () => {
  test('accepts a known api with its params and defaults the class to STANDARD', () => {
    const job = validateJob({ api: 'emailvalidator', params: { email: 'a@b.co' } }, DEFAULT_CATALOG);
    assert.deepEqual(job, { api: 'emailvalidator', params: { email: 'a@b.co' }, priority: 'STANDARD', idempotencyKey: null });
  });
  test('refuses each kind of bad item with its code', () => {
    assert.equal(code(() => validateJob({ api: 'nope', params: {} }, DEFAULT_CATALOG)), 'UNKNOWN_API');
    assert.equal(code(() => validateJob({ api: 'exchangerate', params: { currency1: 'USD' } }, DEFAULT_CATALOG)), 'MISSING_PARAMS');
    assert.equal(code(() => validateJob({ api: 'dnslookup', params: { domain: '  ' } }, DEFAULT_CATALOG)), 'MISSING_PARAMS');
    assert.equal(code(() => validateJob({ api: 'dnslookup', params: { domain: 'x.com' }, priority: 'URGENT' }, DEFAULT_CATALOG)), 'BAD_PRIORITY');
    assert.equal(code(() => validateJob({ api: 'dnslookup', params: { domain: { a: 1 } } }, DEFAULT_CATALOG)), 'BAD_USER_INPUT');
    assert.equal(code(() => validateJob({ api: 'dnslookup', params: { domain: 'x.com' }, idempotencyKey: 'k'.repeat(201) }, DEFAULT_CATALOG)), 'BAD_USER_INPUT');
  });
  test('a bulk submission is refused whole, naming the bad item', () => {
    const items = [
      { api: 'dnslookup', params: { domain: 'a.com' } },
      { api: 'dnslookup', params: {} },
    ];
    try {
      validateSubmission(items, DEFAULT_CATALOG, 10);
      assert.fail('expected a refusal');
    } catch (err) {
      assert.ok(err instanceof SluiceError);
      assert.equal(err.code, 'MISSING_PARAMS');
      assert.equal(err.extensions.index, 1);
      assert.deepEqual(err.extensions.missing, ['domain']);
    }
  });
  test('too many items and no items', () => {
    const items = Array.from({ length: 11 }, () => ({ api: 'dnslookup', params: { domain: 'a.com' } }));
    assert.equal(code(() => validateSubmission(items, DEFAULT_CATALOG, 10)), 'TOO_MANY_ITEMS');
    assert.equal(code(() => validateSubmission([], DEFAULT_CATALOG, 10)), 'BAD_USER_INPUT');
  });
  test('cost overrides apply and refuse typos', () => {
    assert.equal(buildCatalog('emailvalidator=20').get('emailvalidator')!.creditCost, 20);
    assert.throws(() => buildCatalog('emailvalidatr=20'), /unknown api/);
    assert.throws(() => buildCatalog('dnslookup=0'), /positive integer/);
  });
});

describe('configuration', () => {
  test('defaults load from an empty environment', () => {
    const env = loadEnv({});
    assert.equal(env.PORT, 4000);
    assert.equal(env.SLUICE_ROLE, 'all');
    assert.equal(env.MAX_JOBS_PER_SUBMISSION, 10_000);
  });
  test('a bad value names the variable', () => {
    assert.throws(() => loadEnv({ PORT: 'eighty' }), (err: unknown) => err instanceof ConfigError && /PORT/.test(err.message));
    assert.throws(() => loadEnv({ SLUICE_ROLE: 'boss' }), (err: unknown) => err instanceof ConfigError && /SLUICE_ROLE/.test(err.message));
    assert.throws(() => loadEnv({ APIVERVE_PLAN: 'GOLD' }), (err: unknown) => err instanceof ConfigError && /APIVERVE_PLAN/.test(err.message));
  });
  test('a pooler without a direct URL, or a direct URL without DATABASE_URL, is refused naming DATABASE_DIRECT_URL', () => {
    const pooled = 'postgres://u@pgbouncer:6432/sluice';
    assert.throws(() => loadEnv({ DATABASE_URL: pooled, DATABASE_POOLER: 'pgbouncer' }), (err: unknown) => err instanceof ConfigError && /DATABASE_DIRECT_URL: must point at Postgres itself/.test(err.message));
    assert.throws(() => loadEnv({ DATABASE_URL: pooled, DATABASE_DIRECT_URL: pooled, DATABASE_POOLER: 'pgbouncer' }), (err: unknown) => err instanceof ConfigError && /DATABASE_DIRECT_URL/.test(err.message));
    assert.throws(() => loadEnv({ DATABASE_DIRECT_URL: 'postgres://u@db:5432/sluice' }), (err: unknown) => err instanceof ConfigError && /DATABASE_DIRECT_URL: is set without DATABASE_URL/.test(err.message));
    assert.throws(() => loadEnv({ DATABASE_POOLER: 'odyssey' }), (err: unknown) => err instanceof ConfigError && /DATABASE_POOLER/.test(err.message));
  });
});

describe('database targets behind a pooler', () => {
  const pooled = 'postgres://u@pgbouncer:6432/sluice';
  const direct = 'postgres://u@db:5432/sluice';
  test('a separate direct URL means a pooler in front of DATABASE_URL, unless DATABASE_POOLER says otherwise', () => {
    assert.deepEqual(databaseTargets(direct, undefined, undefined), { url: direct, directUrl: direct, pooler: false });
    assert.deepEqual(databaseTargets(direct, direct, undefined), { url: direct, directUrl: direct, pooler: false });
    assert.deepEqual(databaseTargets(pooled, direct, undefined), { url: pooled, directUrl: direct, pooler: true });
    assert.deepEqual(databaseTargets(pooled, direct, 'none'), { url: pooled, directUrl: direct, pooler: false });
    assert.deepEqual(databaseTargets(pooled, direct, 'pgbouncer'), { url: pooled, directUrl: direct, pooler: true });
  });
  test('the ALTER ROLE statements name only the timeouts that differ, with the role and database quoted', () => {
    const wanted = { lockTimeoutMs: 30_000, statementTimeoutMs: 120_000, idleInTransactionTimeoutMs: 15_000 };
    assert.deepEqual(timeoutStatements('sluice', 'db', wanted, wanted), []);
    assert.deepEqual(timeoutStatements('a"b', 'my db', wanted, { ...wanted, lockTimeoutMs: 0, idleInTransactionTimeoutMs: 5 }), [
      'ALTER ROLE "a""b" IN DATABASE "my db" SET lock_timeout = 30000',
      'ALTER ROLE "a""b" IN DATABASE "my db" SET idle_in_transaction_session_timeout = 15000',
    ]);
  });
});

describe('tenant limits and quota periods', () => {
  test('overrides win over the tier, null falls back to it', () => {
    const base = { tier: 'PRO' as const, weight: null, concurrencyCap: 3, monthlyQuota: null, queueBound: null };
    const { requestBurst, requestRate, ...pro } = TIERS.PRO; // the request budget has its own function
    assert.deepEqual(effectiveLimits(base), { ...pro, concurrencyCap: 3 });
    assert.deepEqual(requestBudgetLimits({ ...base, requestBurst: 7, requestRate: null }), { burst: 7, rate: requestRate });
    assert.equal(requestBudgetLimits(base).burst, requestBurst);
  });
  test('the period starts on the anchor anniversary, clamped to short months', () => {
    const anchor = new Date('2026-01-31T10:00:00Z');
    assert.deepEqual(quotaPeriod(anchor, new Date('2026-03-05T00:00:00Z')), {
      start: new Date('2026-02-28T10:00:00Z'),
      end: new Date('2026-03-31T10:00:00Z'),
    });
    assert.deepEqual(quotaPeriod(anchor, new Date('2026-01-31T10:00:00Z')), {
      start: new Date('2026-01-31T10:00:00Z'),
      end: new Date('2026-02-28T10:00:00Z'),
    });
    assert.deepEqual(quotaPeriod(anchor, new Date('2026-12-31T09:59:59Z')).start, new Date('2026-11-30T10:00:00Z'));
  });
});

describe('settling an attempt', () => {
  const outcome = (kind: CallOutcome['kind'], retryAfterSeconds: number | null = null): CallOutcome => ({
    kind, httpStatus: null, creditsBilled: 0, data: null, message: null, status: null, retryAfterSeconds, latencyMs: 1,
  });
  test('retries back off exponentially, then fail', () => {
    assert.deepEqual([1, 2, 3, 4].map((a) => retryDelaySeconds(a, 2)), [2, 4, 8, 16]);
    assert.equal(retryDelaySeconds(30, 2), 300);
    assert.equal(planSettlement('retry', outcome('server_error'), 1, 3, 1).action, 'requeue');
    assert.equal(planSettlement('retry', outcome('server_error'), 4, 3, 1).action, 'fail');
  });
  test('a put-back waits out retry-after and does not use an attempt', () => {
    const plan = planSettlement('put_back', outcome('rate_limited', 12), 99, 3, 1);
    assert.deepEqual(plan, { action: 'requeue', delaySeconds: 12, countsAsAttempt: false });
  });
  test('success and non-retryable failures are final', () => {
    assert.equal(planSettlement('complete', outcome('billed'), 1, 3, 1).action, 'succeed');
    assert.equal(planSettlement('fail', outcome('bad_input'), 1, 3, 1).action, 'fail');
  });
});

describe('authorization', () => {
  const tenant = { kind: 'tenant' as const, tenant: {} as never, key: { id: 'k', scopes: ['SUBMIT', 'READ'] as const, expiresAtMs: null } };
  const readOnly = { ...tenant, key: { ...tenant.key, scopes: ['READ'] as const } };
  test('missing or wrong credentials are 401, the other role is 403', () => {
    assert.equal(authorize({ kind: 'anonymous' }, ['tenant'])?.extensions.code, 'UNAUTHENTICATED');
    assert.equal(authorize({ kind: 'invalid' }, ['public'])?.extensions.code, 'UNAUTHENTICATED');
    assert.equal(authorize(tenant, ['admin'])?.extensions.code, 'FORBIDDEN');
    assert.equal(authorize({ kind: 'admin' }, ['tenant'])?.extensions.code, 'FORBIDDEN');
    assert.equal(authorize({ kind: 'anonymous' }, ['public']), null);
    assert.equal(authorize(tenant, ['tenant', 'public']), null);
  });
  test('a tenant key without a scope the operation needs is 403; tenantOrAdmin fields take either', () => {
    assert.equal(authorize(readOnly, ['tenant'], ['SUBMIT'])?.extensions.code, 'FORBIDDEN');
    assert.match(authorize(readOnly, ['tenant'], ['SUBMIT', 'READ'])!.message, /SUBMIT scope/);
    assert.equal(authorize(readOnly, ['tenant'], ['READ']), null);
    assert.equal(authorize({ kind: 'admin' }, ['tenantOrAdmin'], ['SUBMIT']), null, 'the admin has no scopes to lack');
    assert.equal(authorize(tenant, ['tenantOrAdmin'], ['SUBMIT', 'READ']), null);
    assert.equal(authorize({ kind: 'anonymous' }, ['tenantOrAdmin'])?.extensions.code, 'UNAUTHENTICATED');
  });
  test('key rules: expiry, rotation overlap, last use at most once an interval, new key input', () => {
    assert.equal(keyLive({ id: 'k', scopes: ['READ'], expiresAtMs: 1_000 }, 999), true);
    assert.equal(keyLive({ id: 'k', scopes: ['READ'], expiresAtMs: 1_000 }, 1_000), false);
    assert.equal(keyLive({ id: 'k', scopes: ['READ'], expiresAtMs: null }, 1e15), true);
    const now = new Date('2026-01-01T00:00:00Z');
    assert.equal(rotationExpiry(null, now, 60).toISOString(), '2026-01-01T00:01:00.000Z');
    assert.equal(rotationExpiry(new Date('2026-01-01T00:00:10Z'), now, 60).toISOString(), '2026-01-01T00:00:10.000Z', 'a sooner expiry stands');
    assert.equal(lastUseDue(undefined, 5, 60_000), true);
    assert.equal(lastUseDue(0, 59_999, 60_000), false);
    assert.equal(lastUseDue(0, 60_000, 60_000), true);
    assert.deepEqual(checkNewKey({ name: ' ci ', scopes: ['READ', 'SUBMIT', 'READ'] }, now), { name: 'ci', scopes: ['SUBMIT', 'READ'], expiresAt: null });
    const code = (f: () => unknown) => {
      try {
        f();
        return null;
      } catch (err) {
        return [(err as SluiceError).code, (err as SluiceError).extensions.field];
      }
    };
    assert.deepEqual(code(() => checkNewKey({ name: '', scopes: ['READ'] }, now)), ['BAD_USER_INPUT', 'name']);
    assert.deepEqual(code(() => checkNewKey({ name: 'x', scopes: [] }, now)), ['BAD_USER_INPUT', 'scopes']);
    assert.deepEqual(code(() => checkNewKey({ name: 'x', scopes: ['READ'], expiresAt: now }, now)), ['BAD_USER_INPUT', 'expiresAt']);
  });
  test('bearer tokens parse strictly', () => {
    assert.equal(bearerToken('Bearer abc'), 'abc');
    assert.equal(bearerToken('bearer abc '), 'abc');
    assert.equal(bearerToken('Basic abc'), null);
    assert.equal(bearerToken('Bearer a b'), null);
  });
});

describe('embedded Postgres as root', () => {
  test('closedAncestor names the first folder the `postgres` user cannot enter, and stops at one not made yet', () => {
    const modes: Record<string, number> = { '/': 0o40755, '/tmp': 0o41777, '/tmp/x': 0o40700, '/tmp/x/y': 0o40755, '/srv': 0o40755 };
    const modeOf = (p: string) => modes[p] ?? null;
    assert.equal(closedAncestor('/tmp/x/y', modeOf), '/tmp/x');
    assert.equal(closedAncestor('/srv/sluice/data', modeOf), null, 'folders still to be made get a umask that lets others enter');
    assert.equal(closedAncestor('/tmp', modeOf), null);
    modes['/tmp/x'] = 0o40711;
    assert.equal(closedAncestor('/tmp/x/y', modeOf), null, 'the execute bit is enough to pass through');
  });
});

describe('settlement groups', () => {
  const u = (size: number, ...tenants: string[]) => ({ size, tenants });
  test('pickSettleUnits: queue order, skips units whose tenant another flusher holds, stops at the group size', () => {
    const q = [u(3, 'a'), u(2, 'b'), u(4, 'a', 'c'), u(1, 'd'), u(30, 'e'), u(1, 'f')];
    assert.deepEqual(pickSettleUnits(q, new Set(), 32, false), [0, 1, 2, 3], 'the 30-attempt unit does not fit after 10');
    assert.deepEqual(pickSettleUnits(q, new Set(['a']), 32, false), [1, 3], 'units of a held tenant wait (and 3 + 30 does not fit)');
    assert.deepEqual(pickSettleUnits(q, new Set(['a']), 40, false), [1, 3, 4, 5]);
    assert.deepEqual(pickSettleUnits(q, new Set(['a', 'b', 'd', 'e', 'f']), 32, false), [], 'nothing free: the holders come back for them');
    assert.deepEqual(pickSettleUnits(q, new Set(['a']), 32, true), [1], 'after a failure, one unit at a time');
    assert.deepEqual(pickSettleUnits([u(40, 'a'), u(1, 'b')], new Set(), 32, false), [0], 'a first unit always fits');
  });
  test('pickSettleUnits: never a held tenant, at most max attempts unless one unit, and something whenever a unit is free', () => {
    const tenant = fc.constantFrom('a', 'b', 'c', 'd', 'e');
    fc.assert(
      fc.property(
        fc.array(fc.record({ size: fc.integer({ min: 1, max: 40 }), tenants: fc.uniqueArray(tenant, { minLength: 1, maxLength: 2 }) }), { maxLength: 20 }),
        fc.uniqueArray(tenant, { maxLength: 5 }),
        fc.integer({ min: 1, max: 64 }),
        fc.boolean(),
        (units, held, max, one) => {
          const busy = new Set(held);
          const picked = pickSettleUnits(units, busy, max, one);
          assert.deepEqual(picked, [...picked].sort((x, y) => x - y));
          for (const i of picked) assert.ok(units[i]!.tenants.every((t) => !busy.has(t)));
          const total = picked.reduce((s, i) => s + units[i]!.size, 0);
          if (picked.length > 1) assert.ok(!one && total <= max);
          const anyFree = units.some((x) => x.tenants.every((t) => !busy.has(t)));
          assert.equal(picked.length > 0, anyFree);
        },
      ),
      { numRuns: 300 },
    );
  });
  test('pickSettleUnits: a solo unit (split off a refused group) is settled alone, in its place in the queue', () => {
    const solo = (size: number, t: string) => ({ size, tenants: [t], solo: true });
    assert.deepEqual(pickSettleUnits([solo(1, 'a'), u(1, 'b')], new Set(), 32, false), [0]);
    assert.deepEqual(pickSettleUnits([u(1, 'b'), u(1, 'c'), solo(1, 'a'), u(1, 'd')], new Set(), 32, false), [0, 1], 'a group stops before a solo unit');
    assert.deepEqual(pickSettleUnits([solo(1, 'a'), u(1, 'b')], new Set(['a']), 32, false), [1], 'a held solo unit waits like any other');
  });
  test('classifySettleError: class 22/23 are data, connection errors are outages, the rest is other', () => {
    const e = (code?: string) => Object.assign(new Error('x'), code === undefined ? {} : { code });
    for (const c of ['22P05', '22P02', '22001', '23505', '23514']) assert.equal(classifySettleError(e(c)), 'data', c);
    for (const c of ['08006', '08001', '57P01', '57P03', '53300', '58030', 'CONNECTION_CLOSED', 'CONNECTION_ENDED', 'CONNECT_TIMEOUT', 'ECONNREFUSED', 'ECONNRESET']) {
      assert.equal(classifySettleError(e(c)), 'outage', c);
    }
    for (const c of ['40P01', '40001', '55P03', '57014', 'P0001', 'XX000', '42883']) assert.equal(classifySettleError(e(c)), 'other', c);
    assert.equal(classifySettleError(new TypeError('a bug')), 'other');
    assert.equal(classifySettleError(null), 'other');
  });
  test('planSettleFailure: outages retried; a refused group split; a refused attempt failed, then let go; other errors bounded', () => {
    const f = (error: 'data' | 'outage' | 'other', units: number, attempts: number, faults: number, final = false) => planSettleFailure({ error, units, attempts, faults, final });
    assert.equal(f('outage', 5, 40, 0), 'retry');
    assert.equal(f('outage', 1, 1, 100), 'retry', 'an outage is never counted against a unit');
    assert.equal(f('data', 3, 9, 0), 'split');
    assert.equal(f('other', 3, 9, 0), 'split');
    assert.equal(f('data', 1, 4, 1), 'split_attempts');
    assert.equal(f('data', 1, 1, 1), 'fail_final');
    assert.equal(f('data', 1, 1, 1, true), 'leave_to_lease');
    assert.equal(f('other', 1, 1, SETTLE_MAX_FAULTS - 1), 'retry');
    assert.equal(f('other', 1, 1, SETTLE_MAX_FAULTS), 'fail_final');
    assert.equal(f('other', 1, 3, SETTLE_MAX_FAULTS), 'split_attempts');
    assert.equal(f('other', 1, 1, SETTLE_MAX_FAULTS, true), 'leave_to_lease');
    // Bounded: a unit failing with anything but an outage reaches a final step within a few failures per piece.
    fc.assert(
      fc.property(fc.constantFrom('data' as const, 'other' as const), fc.integer({ min: 1, max: 200 }), (error, attempts) => {
        let pieces = [{ attempts, faults: 0, final: false }];
        let steps = 0;
        while (pieces.length > 0) {
          assert.ok(++steps < attempts * (2 * SETTLE_MAX_FAULTS + 2) + 2, 'bounded');
          const p = pieces.shift()!;
          p.faults++;
          const step = planSettleFailure({ error, units: 1, attempts: p.attempts, faults: p.faults, final: p.final });
          if (step === 'retry') pieces.push(p);
          else if (step === 'split_attempts') pieces.push(...Array.from({ length: p.attempts }, () => ({ attempts: 1, faults: 0, final: p.final })));
          else if (step === 'fail_final') pieces.push({ attempts: 1, faults: 0, final: true });
          else assert.equal(step, 'leave_to_lease');
        }
      }),
      { numRuns: 100 },
    );
  });
});
