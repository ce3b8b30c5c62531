/**
 * The fields the console reads: tenantTable (sorted, filtered, paged in
 * Postgres, with each row's live queues and usage), Window.callsPerSecond and
 * ClassStatus.agePromiseSeconds.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { likePattern, normalizePage } from '../src/visibility/console.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

test('normalizePage clamps; likePattern escapes the LIKE wildcards', () => {
  assert.deepEqual(normalizePage({}), { first: 25, offset: 0 });
  assert.deepEqual(normalizePage({ first: 10_000, offset: -5 }), { first: 200, offset: 0 });
  assert.deepEqual(normalizePage({ first: 0, offset: 30 }), { first: 1, offset: 30 });
  assert.equal(likePattern('50%_a\\'), '%50\\%\\_a\\\\%');
});

const TABLE = `query($first: Int, $offset: Int, $orderBy: TenantOrder, $descending: Boolean, $nameContains: String, $tier: Tier) {
  tenantTable(first: $first, offset: $offset, orderBy: $orderBy, descending: $descending, nameContains: $nameContains, tier: $tier) {
    totalCount rows { tenant { name tier } queues { priority depth waitReason } usage { quota creditsUsed } }
  }
}`;

describe('tenantTable', () => {
  let t: TestApp;
  before(async () => {
    t = await startTestApp();
    for (const [name, tier] of [
      ['alpha', 'FREE'],
      ['bravo', 'PRO'],
      ['charlie', 'PRO'],
      ['delta', 'ENTERPRISE'],
      ['echo_1', 'PRO'],
    ] as const) await t.createTenant(name, tier);
  });
  after(async () => {
    await t?.stop();
  });

  const names = (r: { body: { data: { tenantTable: { rows: Array<{ tenant: { name: string } }> } } } }) => r.body.data.tenantTable.rows.map((x) => x.tenant.name);

  test('pages, sorts and filters', async () => {
    const p1 = await t.gql(TABLE, { first: 2, offset: 0 });
    assert.equal(p1.body.data.tenantTable.totalCount, 5);
    assert.deepEqual(names(p1), ['alpha', 'bravo']);
    assert.deepEqual(names(await t.gql(TABLE, { first: 2, offset: 4 })), ['echo_1']);
    assert.deepEqual(names(await t.gql(TABLE, { first: 2, offset: 10 })), []);
    assert.equal((await t.gql(TABLE, { first: 2, offset: 10 })).body.data.tenantTable.totalCount, 5);
    assert.deepEqual(names(await t.gql(TABLE, { orderBy: 'NAME', descending: true })), ['echo_1', 'delta', 'charlie', 'bravo', 'alpha']);
    assert.deepEqual(names(await t.gql(TABLE, { tier: 'PRO' })), ['bravo', 'charlie', 'echo_1']);
    assert.deepEqual(names(await t.gql(TABLE, { nameContains: 'HARL' })), ['charlie']);
    assert.deepEqual(names(await t.gql(TABLE, { nameContains: '_' })), ['echo_1'], 'an underscore is not a wildcard');
  });

  test('sorts by depth from the live counters and shows each row\'s queues and usage', async () => {
    const created = await t.createTenant('waiting-co');
    // No quota and policy WAIT: its jobs stay waiting (depth 3, reason QUOTA).
    await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: created.id, monthlyQuota: 0 } });
    const jobs = [1, 2, 3].map((i) => ({ api: 'dnslookup', params: { domain: `w${i}.example` } }));
    await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, created.apiKey);
    const top = await eventually(async () => {
      const r = await t.gql(TABLE, { orderBy: 'DEPTH', descending: true, first: 1 });
      const row = r.body.data.tenantTable.rows[0];
      return row?.tenant.name === 'waiting-co' && row.queues.find((q: { priority: string }) => q.priority === 'STANDARD')?.waitReason === 'QUOTA' ? row : null;
    });
    assert.equal(top.queues.reduce((s: number, q: { depth: number }) => s + q.depth, 0), 3);
    assert.equal(top.usage.quota, 0);
  });

  test('is for the admin only', async () => {
    const tenant = await t.createTenant('nosy-co');
    const r = await t.gql(TABLE, {}, tenant.apiKey);
    assert.equal(r.status, 403);
    assert.equal(r.body.errors[0].extensions.code, 'FORBIDDEN');
    assert.equal(r.body.data ?? null, null);
  });

  test('system shows calls per second per window and each class\'s age promise', async () => {
    const tenant = await t.createTenant('caller-co');
    await t.gql('mutation { submitJob(input: {api: "dnslookup", params: {domain: "c.example"}}) { job { id } } }', {}, tenant.apiKey);
    await eventually(async () => {
      const r = await t.gql('{ system { windows { name callsPerSecond } classes { priority agePromiseSeconds } } }');
      const s = r.body.data.system;
      assert.deepEqual(
        s.classes.map((c: { priority: string; agePromiseSeconds: number }) => [c.priority, c.agePromiseSeconds]).sort(),
        [['BULK', 14400], ['INTERACTIVE', 10], ['STANDARD', 300]],
      );
      return s.windows.some((w: { callsPerSecond: number }) => w.callsPerSecond > 0);
    });
  });
});
