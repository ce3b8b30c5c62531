/**
 * The front door's pure decisions: admission at both scopes with class
 * shares, never-fitting submissions, a group's plan (replays, conflicts,
 * running totals), duplicate keys in one submission, and the group committer's
 * coalescing and fallback. No database.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { admit, retryAfterSeconds } from '../src/admission/rules.ts';
import { edgeRefusals, planGroup, sameRequest, type PlannedJob } from '../src/admission/plan.ts';
import { Pressure } from '../src/admission/edge.ts';
import { DEFAULT_CATALOG } from '../src/config/apis.ts';
import { SluiceError } from '../src/errors.ts';
import { GroupCommit } from '../src/jobs/group-commit.ts';
import { validateSubmission } from '../src/jobs/validate.ts';

const shares = { BULK: 0.5, STANDARD: 0.8, INTERACTIVE: 1 };
const base = { tenantDepth: 0, tenantBound: 10, globalDepth: 0, globalBound: 100, classShare: shares };

describe('admit', () => {
  test('a tenant class share refuses first, naming the class; the whole bound names none', () => {
    const share = admit({ ...base, incoming: { STANDARD: 2 }, tenantDepth: 7 });
    assert.ok(!share.ok);
    assert.deepEqual([share.scope, share.jobClass, share.excess, share.retryable], ['TENANT', 'STANDARD', 1, true]);
    const whole = admit({ ...base, incoming: { INTERACTIVE: 2 }, tenantDepth: 9 });
    assert.ok(!whole.ok);
    assert.deepEqual([whole.scope, whole.jobClass, whole.excess, whole.retryable], ['TENANT', null, 1, true]);
    assert.equal(admit({ ...base, incoming: { INTERACTIVE: 1 }, tenantDepth: 9 }).ok, true);
  });

  test('bigger than the bound itself can never fit: not retryable', () => {
    const r = admit({ ...base, incoming: { INTERACTIVE: 11 } });
    assert.ok(!r.ok);
    assert.deepEqual([r.scope, r.retryable, r.jobClass], ['TENANT', false, null]);
    const s = admit({ ...base, incoming: { BULK: 6 } });
    assert.ok(!s.ok);
    assert.deepEqual([s.scope, s.retryable, s.jobClass], ['TENANT', false, 'BULK']);
    const g = admit({ ...base, tenantBound: 1_000, incoming: { BULK: 51 } });
    assert.ok(!g.ok);
    assert.deepEqual([g.scope, g.retryable, g.jobClass], ['GLOBAL', false, 'BULK']);
  });

  test('a class with a share may always hold one job, however small the bound', () => {
    assert.equal(admit({ ...base, tenantBound: 1, incoming: { BULK: 1 } }).ok, true);
    const second = admit({ ...base, tenantBound: 1, tenantDepth: 1, incoming: { STANDARD: 1 } });
    assert.ok(!second.ok);
    assert.deepEqual([second.scope, second.retryable], ['TENANT', true]);
  });

  test('global: the lowest class of a mixed submission sheds first, and a global refusal always names its class', () => {
    const mixed = admit({ ...base, tenantBound: 1_000, globalDepth: 49, incoming: { INTERACTIVE: 1, BULK: 1 } });
    assert.ok(!mixed.ok);
    assert.deepEqual([mixed.scope, mixed.jobClass], ['GLOBAL', 'BULK']);
    const inter = admit({ ...base, tenantBound: 1_000, globalDepth: 100, incoming: { INTERACTIVE: 1 } });
    assert.ok(!inter.ok);
    assert.equal(inter.jobClass, 'INTERACTIVE');
  });

  test('Retry-After: at least 1 s, at most an hour, an hour when nothing drains', () => {
    assert.equal(retryAfterSeconds(1, 100), 1);
    assert.equal(retryAfterSeconds(250, 100), 3);
    assert.equal(retryAfterSeconds(10, 0), 3_600);
  });
});

const j = (id: string, key: string | null = null, domain = id, priority: PlannedJob['priority'] = 'STANDARD'): PlannedJob => ({ id, api: 'dnslookup', params: { domain }, priority, idempotencyKey: key });

describe('planGroup', () => {
  const input = {
    originals: new Map([['t1:old', { id: 'orig', state: 'QUEUED', api: 'dnslookup', params: { domain: 'o' } }]]),
    tenantDepth: new Map([['t1', 5]]),
    newState: (t: string) => (t === 't2' ? ('WAITING_QUOTA' as const) : ('QUEUED' as const)),
    globalDepth: 0,
    globalBound: 100,
    classShare: shares,
  };

  test('running totals: later submissions see what earlier ones in the group were admitted', () => {
    const plans = planGroup({ ...input, subs: [1, 2, 3, 4].map((n) => ({ tenantId: 't1', tenantBound: 10, jobs: [j(`a${n}`)] })) });
    // STANDARD may fill 8 of 10; 5 wait: three more fit.
    assert.deepEqual(plans.map((p) => p.kind), ['accept', 'accept', 'accept', 'refuse']);
  });

  test('replays answer with the original (stored or earlier in the group), conflicts name it, new jobs take the tenant state', () => {
    const plans = planGroup({
      ...input,
      subs: [
        { tenantId: 't1', tenantBound: 100, jobs: [j('x1', 'old', 'o')] },
        { tenantId: 't1', tenantBound: 100, jobs: [j('x2', 'old', 'changed')] },
        { tenantId: 't2', tenantBound: 100, jobs: [j('x3', 'new')] },
        { tenantId: 't2', tenantBound: 100, jobs: [j('x4', 'new', 'x3')] },
        { tenantId: 't2', tenantBound: 100, jobs: [j('x5'), j('x6', 'new', 'other')] },
      ],
    });
    assert.deepEqual(plans[0], { kind: 'accept', insert: [], state: 'QUEUED', answers: [{ id: 'orig', state: 'QUEUED' }] });
    assert.deepEqual(plans[1], { kind: 'conflict', index: 0, key: 'old', originalId: 'orig' });
    assert.deepEqual(plans[2], { kind: 'accept', insert: [j('x3', 'new')], state: 'WAITING_QUOTA', answers: [{ id: 'x3', state: 'WAITING_QUOTA' }] });
    assert.deepEqual(plans[3], { kind: 'accept', insert: [], state: 'WAITING_QUOTA', answers: [{ id: 'x3', state: 'WAITING_QUOTA' }] });
    assert.deepEqual(plans[4], { kind: 'conflict', index: 1, key: 'new', originalId: 'x3' });
  });

  test('a refused submission admits nothing: its keys are free for the next one', () => {
    const plans = planGroup({
      ...input,
      subs: [
        { tenantId: 't3', tenantBound: 1, jobs: [j('y1', 'k', 'a', 'INTERACTIVE'), j('y2', null, 'b', 'INTERACTIVE')] },
        { tenantId: 't3', tenantBound: 1, jobs: [j('y3', 'k', 'c', 'INTERACTIVE')] },
      ],
    });
    assert.equal(plans[0]!.kind, 'refuse');
    assert.equal(plans[1]!.kind, 'accept');
  });

  test('same request: same api and params in any key order', () => {
    assert.ok(sameRequest({ api: 'a', params: { x: 1, y: 'z' } }, { api: 'a', params: { y: 'z', x: 1 } }));
    assert.ok(!sameRequest({ api: 'a', params: { x: 1 } }, { api: 'a', params: { x: '1' } }));
    assert.ok(!sameRequest({ api: 'a', params: {} }, { api: 'b', params: {} }));
  });
});

describe('one idempotency key twice in one submission', () => {
  test('is BAD_USER_INPUT naming both indices', () => {
    const item = (key: string) => ({ api: 'dnslookup', params: { domain: 'x.example' }, idempotencyKey: key });
    try {
      validateSubmission([item('a'), item('b'), item('c'), item('b')], DEFAULT_CATALOG, 100);
      assert.fail('accepted');
    } catch (err) {
      assert.ok(err instanceof SluiceError);
      assert.equal(err.code, 'BAD_USER_INPUT');
      assert.deepEqual(err.extensions.indices, [1, 3]);
      assert.match(err.message, /jobs\[1\] and jobs\[3\]/);
    }
  });
});

describe('GroupCommit', () => {
  test('submissions made together are flushed together, up to maxItems a group, each answered in order', async () => {
    const groups: number[][] = [];
    const gc = new GroupCommit<number, number>(async (items) => {
      groups.push([...items]);
      return items.map((n) => ({ ok: true as const, value: n * 10 }));
    }, { windowMs: 1, maxItems: 4 });
    const answers = await Promise.all([1, 2, 3, 4, 5, 6].map((n) => gc.submit(n)));
    assert.deepEqual(answers, [10, 20, 30, 40, 50, 60]);
    assert.deepEqual(groups, [[1, 2, 3, 4], [5, 6]]);
  });

  test("an item's own error reaches only its caller", async () => {
    const gc = new GroupCommit<number, number>(async (items) => items.map((n) => (n === 2 ? { ok: false as const, error: new Error('two') } : { ok: true as const, value: n })), { windowMs: 1, maxItems: 10 });
    const r = await Promise.allSettled([1, 2, 3].map((n) => gc.submit(n)));
    assert.deepEqual(r.map((x) => x.status), ['fulfilled', 'rejected', 'fulfilled']);
  });

  test('a failing group is retried item by item, so only the culprit fails', async () => {
    const flushed: number[][] = [];
    const gc = new GroupCommit<number, number>(async (items) => {
      flushed.push([...items]);
      if (items.includes(13)) throw new Error('poison');
      return items.map((n) => ({ ok: true as const, value: n }));
    }, { windowMs: 1, maxItems: 10 });
    const r = await Promise.allSettled([11, 12, 13, 14].map((n) => gc.submit(n)));
    assert.deepEqual(r.map((x) => x.status), ['fulfilled', 'fulfilled', 'rejected', 'fulfilled']);
    assert.deepEqual(flushed, [[11, 12, 13, 14], [11], [12], [13], [14]]);
  });

  test('a group that may have committed is not retried: every caller gets the error, nothing is written twice', async () => {
    const flushed: number[][] = [];
    const gc = new GroupCommit<number, number>(async (items) => {
      flushed.push([...items]);
      throw new Error('connection lost at COMMIT');
    }, { windowMs: 1, maxItems: 10, splittable: () => false });
    const r = await Promise.allSettled([1, 2, 3].map((n) => gc.submit(n)));
    assert.deepEqual(r.map((x) => x.status), ['rejected', 'rejected', 'rejected']);
    assert.deepEqual(flushed, [[1, 2, 3]]);
  });
});

describe('the edge', () => {
  const job = (id: string, key: string | null = null): PlannedJob => ({ id, api: 'dnslookup', params: { domain: `${id}.example` }, priority: 'STANDARD', idempotencyKey: key });
  const input = (subs: Array<{ tenantId: string; jobs: PlannedJob[] }>, depth: Record<string, number>, globalDepth: number, originals = new Map()) => ({
    subs: subs.map((s) => ({ ...s, tenantBound: 5 })),
    originals,
    tenantDepth: new Map(Object.entries(depth)),
    newState: () => 'QUEUED' as const,
    globalDepth,
    globalBound: 100,
    classShare: { STANDARD: 1 },
  });

  test('each submission is judged alone: refused only when it cannot fit even if the others of its group were refused', () => {
    // Together a and b pass the tenant bound (5); alone each fits: both go to the gate, which decides in order.
    const r = edgeRefusals(input([{ tenantId: 't', jobs: [job('a1'), job('a2')] }, { tenantId: 't', jobs: [job('b1'), job('b2')] }], { t: 2 }, 0));
    assert.deepEqual(r, [null, null]);
    const full = edgeRefusals(input([{ tenantId: 't', jobs: [job('c1')] }, { tenantId: 'u', jobs: [job('d1')] }], { t: 5, u: 0 }, 99));
    assert.equal(full[0]?.scope, 'TENANT');
    assert.equal(full[1], null, 'one more fits the global bound exactly');
    const global = edgeRefusals(input([{ tenantId: 'u', jobs: [job('e1'), job('e2')] }], { u: 0 }, 99));
    assert.deepEqual([global[0]?.scope, global[0]?.retryable, global[0]?.excess], ['GLOBAL', true, 1]);
  });

  test('a replay is never refused at the edge, and a conflict goes on to the gate', () => {
    const original = { id: 'o', state: 'QUEUED', api: 'dnslookup', params: { domain: 'k1.example' } };
    const originals = new Map([['t:k', original]]);
    assert.deepEqual(edgeRefusals(input([{ tenantId: 't', jobs: [{ ...job('k1', 'k') }] }], { t: 5 }, 100, originals)), [null]);
    assert.deepEqual(edgeRefusals(input([{ tenantId: 't', jobs: [{ ...job('k2', 'k') }] }], { t: 5 }, 100, originals)), [null]);
  });

  test('pressure: a refusal puts its scope under it for holdMs', () => {
    const p = new Pressure(1_000);
    assert.equal(p.applies('a', 0), false);
    p.note('TENANT', 'a', 10);
    assert.deepEqual([p.applies('a', 500), p.applies('b', 500), p.globalFull(500)], [true, false, false]);
    assert.equal(p.applies('a', 1_011), false);
    p.note('GLOBAL', 'a', 2_000);
    assert.deepEqual([p.applies('b', 2_500), p.globalFull(2_500), p.applies('b', 3_001)], [true, true, false]);
  });
});
