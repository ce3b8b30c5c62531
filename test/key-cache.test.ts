/**
 * The API-key cache (src/tenants/key-cache.ts) across processes: two real
 * Sluice processes on one database, each with a key cache whose TTL (10 min)
 * far outlives the test, so anything refused or changed on the second process
 * is the sluice_auth notice's doing, not expiry. Changes are made through the
 * first process; the second must see them (polled within a bound; refusal and
 * values are asserted, never timings).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createTestDatabase } from './helpers/db.ts';
import { startNode, type NodeProcess } from './helpers/processes.ts';
import { ADMIN_TOKEN, eventually } from './helpers/app.ts';
import { KeyCache, isFresh, needsRefresh } from '../src/tenants/key-cache.ts';
import type { TenantRecord } from '../src/tenants/policy.ts';
import { hashSecret } from '../src/tenants/keys.ts';
import { AUTH_CHANNEL, notifyAuthChanged, parseAuthNotice } from '../src/tenants/auth-notice.ts';
import postgres from 'postgres';

async function post(url: string, token: string, query: string, variables: Record<string, unknown> = {}): Promise<{ status: number; body: any }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  return { status: res.status, body: await res.json() };
}

const ME = '{ me { tenant { id queueBound suspendedAt } } }';
const SUBMIT = 'mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }';
const job = (i: number) => ({ i: { api: 'dnslookup', params: { domain: `k${i}.example.org` }, priority: 'BULK' } });

describe('API-key cache: every process forgets a changed tenant at once (NOTIFY sluice_auth)', () => {
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  let a: NodeProcess;
  let b: NodeProcess;
  let tenant: { id: string; apiKey: string };
  // A rotation with no overlap ends the old key at once: what the rotation test below checks travels to the other process.
  // Made-up keys of the shape issued before checksums: those are looked up (a forged checksum never is).
  const QUIET = `slc_${'planted_quietly'.padEnd(43, 'q')}`;
  const LOUD = `slc_${'planted_loudly'.padEnd(43, 'l')}`;
  const NOT_YET = `slc_${'not_a_key_yet'.padEnd(43, 'n')}`;
  const env = () => ({ DATABASE_URL: db.url, AUTH_CACHE_TTL_MS: '600000', AUTH_NEGATIVE_CACHE_MS: '600000', DB_POOL_MAX: '4', KEY_ROTATION_OVERLAP_SECONDS: '0' });

  before(async () => {
    db = await createTestDatabase();
    a = await startNode('api', env());
    b = await startNode('api', env());
    const r = await post(a.url!, ADMIN_TOKEN, 'mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }', { i: { name: 'cached', tier: 'PRO' } });
    tenant = { id: r.body.data.createTenant.tenant.id, apiKey: r.body.data.createTenant.apiKey };
  });
  after(async () => {
    await Promise.all([a?.stop(), b?.stop()]);
    await db?.drop();
  });

  test('a key seen unknown is remembered unknown, until a sluice_auth notice: then it works at once', async () => {
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    try {
      const plant = async (key: string, notify: boolean) => {
        await sql.begin(async (tx) => {
          await tx`insert into tenant_api_keys (tenant_id, key_hash, key_prefix) values (${tenant.id}, ${hashSecret(key)}, ${key.slice(0, 10)})`;
          if (notify) await notifyAuthChanged(tx, tenant.id);
        });
      };
      // Made live without the notice: B still answers from its negative cache (the cache is on).
      assert.equal((await post(b.url!, QUIET, ME)).status, 401);
      await plant(QUIET, false);
      assert.equal((await post(b.url!, QUIET, ME)).status, 401);
      // Made live with the notice createTenant and rotateTenantKey send: B forgets every unknown key.
      assert.equal((await post(b.url!, LOUD, ME)).status, 401);
      await plant(LOUD, true);
      await eventually(async () => (await post(b.url!, LOUD, ME)).status === 200, 5_000, 20);
      assert.equal((await post(b.url!, QUIET, ME)).status, 200, 'the notice dropped every unknown key');
      await sql`update tenant_api_keys set revoked_at = now() where key_hash in ${sql([hashSecret(QUIET), hashSecret(LOUD)])}`;
    } finally {
      await sql.end();
    }
  });

  test('createTenant sends the sluice_auth notice, in its transaction', async () => {
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    const notices: string[] = [];
    try {
      await sql.listen(AUTH_CHANNEL, (payload) => void notices.push(payload));
      const r = await post(a.url!, ADMIN_TOKEN, 'mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }', { i: { name: 'noticed', tier: 'PRO' } });
      const id = r.body.data.createTenant.tenant.id as string;
      await eventually(async () => notices.some((n) => parseAuthNotice(n)?.tenantId === id), 5_000, 20);
    } finally {
      await sql.end();
    }
  });

  test('a key created on one process works at once on the other (a made-up key seen unknown first)', async () => {
    // B is asked before the tenant exists... (a made-up key), then right after creation with the real one.
    const unknown = await post(b.url!, NOT_YET, ME);
    assert.equal(unknown.status, 401);
    const r = await post(a.url!, ADMIN_TOKEN, 'mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }', { i: { name: 'fresh', tier: 'PRO' } });
    const created = await post(b.url!, r.body.data.createTenant.apiKey, ME);
    assert.equal(created.status, 200, JSON.stringify(created.body));
    assert.equal(created.body.data.me.tenant.id, r.body.data.createTenant.tenant.id);
  });

  test('rotateTenantKey (no overlap) on one process: the old key is refused on the other, the new one accepted', async () => {
    // Warm B's cache with the key (twice: the second answer is the cached one).
    for (let i = 0; i < 2; i++) assert.equal((await post(b.url!, tenant.apiKey, ME)).status, 200);
    const r = await post(a.url!, ADMIN_TOKEN, 'mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }', { id: tenant.id });
    const newKey = r.body.data.rotateTenantKey.apiKey as string;
    // The process that rotated refuses the old key at once (it invalidates its own cache after commit).
    assert.equal((await post(a.url!, tenant.apiKey, ME)).status, 401);
    const refused = await eventually(async () => {
      const res = await post(b.url!, tenant.apiKey, ME);
      return res.status === 401 ? res : null;
    }, 10_000, 50);
    assert.equal(refused.body.errors[0].extensions.code, 'UNAUTHENTICATED');
    const ok = await post(b.url!, newKey, ME);
    assert.equal(ok.body.data.me.tenant.id, tenant.id);
    tenant = { ...tenant, apiKey: newKey };
  });

  test('suspend and resume on one process: the other refuses, then accepts, submissions', async () => {
    assert.equal((await post(b.url!, tenant.apiKey, SUBMIT, job(1))).body.data.submitJob.job.state, 'QUEUED');
    await post(a.url!, ADMIN_TOKEN, 'mutation($id: ID!) { suspendTenant(id: $id) { id } }', { id: tenant.id });
    const suspended = await eventually(async () => {
      const res = await post(b.url!, tenant.apiKey, ME);
      return res.body.data?.me.tenant.suspendedAt ? res : null;
    }, 10_000, 50);
    assert.ok(suspended.body.data.me.tenant.suspendedAt);
    const refused = await post(b.url!, tenant.apiKey, SUBMIT, job(2));
    assert.equal(refused.body.errors[0].extensions.code, 'TENANT_SUSPENDED');

    await post(a.url!, ADMIN_TOKEN, 'mutation($id: ID!) { resumeTenant(id: $id) { id } }', { id: tenant.id });
    // A cached record still marked suspended would keep refusing for the cache's 10 minutes.
    const accepted = await eventually(async () => {
      const res = await post(b.url!, tenant.apiKey, SUBMIT, job(3));
      return res.body.data?.submitJob ? res : null;
    }, 10_000, 50);
    assert.equal(accepted.body.data.submitJob.job.state, 'QUEUED');
  });

  test('updateTenant limits on one process: admission on the other uses the new bound', async () => {
    await post(a.url!, ADMIN_TOKEN, 'mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, queueBound: 7 } });
    const seen = await eventually(async () => {
      const res = await post(b.url!, tenant.apiKey, ME);
      return res.body.data?.me.tenant.queueBound === 7 ? res : null;
    }, 10_000, 50);
    assert.equal(seen.body.data.me.tenant.queueBound, 7);
    // Two jobs wait already; a submission of 6 more passes the bound of 7: refused on B.
    const many = await post(b.url!, tenant.apiKey, 'mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', {
      i: { jobs: Array.from({ length: 6 }, (_, k) => job(10 + k).i) },
    });
    assert.equal(many.body.errors?.[0]?.extensions.code, 'QUEUE_FULL', JSON.stringify(many.body));
  });

  test('deleteTenant on one process: the key is refused on the other', async () => {
    assert.equal((await post(b.url!, tenant.apiKey, ME)).status, 200);
    await post(a.url!, ADMIN_TOKEN, 'mutation($id: ID!) { deleteTenant(id: $id) { id } }', { id: tenant.id });
    const refused = await eventually(async () => {
      const res = await post(b.url!, tenant.apiKey, ME);
      return res.status === 401 ? res : null;
    }, 10_000, 50);
    assert.equal(refused.body.errors[0].extensions.code, 'UNAUTHENTICATED');
  });
});

describe('KeyCache (in process, a database read stubbed by a map of keys)', () => {
  const record = (id: string): TenantRecord => ({
    id, name: id, tier: 'PRO', weight: null, concurrencyCap: null, monthlyQuota: null, queueBound: null, quotaPolicy: 'WAIT', periodAnchor: new Date(0), createdAt: new Date(0),
  });

  test('hits within the TTL, reads again after it; unknown keys are read every time', async () => {
    let now = 0;
    const keys = new Map([[hashSecret('k1'), record('t1')]]);
    const cache = new KeyCache({ ttlMs: 100, load: async (h) => keys.get(h) ?? null, now: () => now });
    assert.equal((await cache.lookup(hashSecret('k1')))?.id, 't1');
    assert.equal((await cache.lookup(hashSecret('k1')))?.id, 't1');
    assert.equal(cache.loads, 1);
    now = 100;
    await cache.lookup(hashSecret('k1'));
    assert.equal(cache.loads, 2);
    assert.equal(await cache.lookup(hashSecret('nope')), null);
    assert.equal(await cache.lookup(hashSecret('nope')), null);
    assert.equal(cache.loads, 4);
    assert.equal(isFresh(undefined, 0), false);
  });

  test('unknown keys: answered unknown without a read for negativeTtlMs, forgotten by any notice, bounded', async () => {
    let now = 0;
    const keys = new Map<string, TenantRecord>();
    const cache = new KeyCache({ ttlMs: 1_000, negativeTtlMs: 100, maxNegative: 2, load: async (h) => keys.get(h) ?? null, now: () => now });
    assert.equal(await cache.lookup(hashSecret('guess')), null);
    assert.equal(await cache.lookup(hashSecret('guess')), null);
    assert.equal(cache.loads, 1, 'the second guess is answered from memory');
    now = 100;
    assert.equal(await cache.lookup(hashSecret('guess')), null);
    assert.equal(cache.loads, 2, 'past negativeTtlMs it is read again');
    // The key is created (a new tenant): the notice names that tenant, yet every unknown key is forgotten.
    keys.set(hashSecret('guess'), record('t9'));
    assert.equal(await cache.lookup(hashSecret('guess')), null, 'still remembered unknown before the notice');
    cache.invalidate('some-other-tenant');
    assert.equal((await cache.lookup(hashSecret('guess')))?.id, 't9');
    // At most maxNegative unknown keys are kept, the oldest dropped first.
    const loads = cache.loads;
    for (const k of ['u1', 'u2', 'u3']) await cache.lookup(hashSecret(k));
    await cache.lookup(hashSecret('u3'));
    assert.equal(cache.loads, loads + 3);
    await cache.lookup(hashSecret('u1'));
    assert.equal(cache.loads, loads + 4, 'u1 was dropped to keep two');
    // A read that began before a notice does not store its "unknown".
    let release!: () => void;
    const held = new KeyCache({ ttlMs: 1_000, negativeTtlMs: 10_000, load: async () => (await new Promise<void>((r) => (release = r)), null), now: () => now });
    const pending = held.lookup(hashSecret('late'));
    held.invalidate('t1');
    release();
    assert.equal(await pending, null);
    const again = held.lookup(hashSecret('late'));
    release();
    await again;
    assert.equal(held.loads, 2, 'the stale "unknown" was not kept');
  });

  test('a key in use past half its TTL is read again in the background; the entry answers meanwhile', async () => {
    let now = 0;
    let hold: Promise<void> | null = null;
    let release!: () => void;
    const keys = new Map([[hashSecret('k1'), record('t1')]]);
    const cache = new KeyCache({ ttlMs: 100, load: async (h) => {
      const found = keys.get(h) ?? null;
      if (hold) await hold;
      return found;
    }, now: () => now });
    await cache.lookup(hashSecret('k1'));
    now = 40;
    await cache.lookup(hashSecret('k1'));
    assert.equal(cache.loads, 1); // not half way yet
    now = 60;
    hold = new Promise<void>((r) => (release = r));
    keys.set(hashSecret('k1'), record('t1-changed'));
    assert.equal((await cache.lookup(hashSecret('k1')))?.id, 't1'); // answered at once, though the read hangs
    assert.equal((await cache.lookup(hashSecret('k1')))?.id, 't1');
    assert.equal(cache.loads, 2); // one refresh at a time
    release();
    await new Promise((r) => setImmediate(r));
    now = 105; // past the first entry's life, early in the refreshed one's
    assert.equal((await cache.lookup(hashSecret('k1')))?.id, 't1-changed');
    assert.equal(cache.loads, 2);
    assert.equal(needsRefresh({ expiresAt: 100 }, 49, 100), false);
    assert.equal(needsRefresh({ expiresAt: 100 }, 51, 100), true);
  });

  test('background refreshes due within a short while are one read (loadMany); a key revoked meanwhile is dropped', async () => {
    let now = 0;
    const keys = new Map([[hashSecret('k1'), record('t1')], [hashSecret('k2'), record('t2')]]);
    const batches: string[][] = [];
    const cache = new KeyCache({
      ttlMs: 100,
      load: async (h) => keys.get(h) ?? null,
      loadMany: async (hs) => (batches.push([...hs]), new Map(hs.flatMap((h) => (keys.has(h) ? [[h, keys.get(h)!] as const] : [])))),
      now: () => now,
    });
    await Promise.all([cache.lookup(hashSecret('k1')), cache.lookup(hashSecret('k2')), cache.lookup(hashSecret('k1'))]);
    assert.equal(batches.length, 1); // the misses of one turn: one read
    assert.equal(cache.loads, 1);
    batches.length = 0;
    now = 60;
    keys.delete(hashSecret('k2')); // revoked (its notice is another test's business)
    await cache.lookup(hashSecret('k1'));
    await new Promise((r) => setImmediate(r)); // a later turn, still gathered
    await Promise.all([cache.lookup(hashSecret('k2')), cache.lookup(hashSecret('k1'))]);
    await new Promise((r) => setTimeout(r, 80));
    assert.equal(batches.length, 1);
    assert.deepEqual(batches[0]!.sort(), [hashSecret('k1'), hashSecret('k2')].sort());
    assert.equal(cache.size, 1);
    now = 105;
    assert.equal((await cache.lookup(hashSecret('k1')))?.id, 't1');
    assert.equal(await cache.lookup(hashSecret('k2')), null);
  });

  test('a read that began before an invalidation does not store its answer', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const keys = new Map([[hashSecret('k1'), record('t1')]]);
    const cache = new KeyCache({ ttlMs: 60_000, load: async (h) => {
      const found = keys.get(h) ?? null; // read before the change...
      await gate; // ...answered after it
      return found;
    } });
    const slow = cache.lookup(hashSecret('k1'));
    cache.invalidate('t1'); // e.g. the key was revoked while the read was in flight
    keys.clear();
    release();
    assert.equal((await slow)?.id, 't1'); // answered with what it read...
    assert.equal(await cache.lookup(hashSecret('k1')), null); // ...but not kept
  });

  test('invalidate drops only that tenant; null drops everything; TTL 0 never caches', async () => {
    const keys = new Map([[hashSecret('k1'), record('t1')], [hashSecret('k2'), record('t2')]]);
    const cache = new KeyCache({ ttlMs: 60_000, load: async (h) => keys.get(h) ?? null });
    await cache.lookup(hashSecret('k1'));
    await cache.lookup(hashSecret('k2'));
    cache.invalidate('t1');
    assert.equal(cache.size, 1);
    cache.invalidate(null);
    assert.equal(cache.size, 0);
    const off = new KeyCache({ ttlMs: 0, load: async (h) => keys.get(h) ?? null });
    await off.lookup(hashSecret('k1'));
    await off.lookup(hashSecret('k1'));
    assert.equal(off.loads, 2);
    assert.equal(off.size, 0);
  });
});
