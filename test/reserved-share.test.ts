/**
 * Reserved shares: `reservedShare` on createTenant / updateTenant (0 to 1, read back on Tenant),
 * the sum over tenants at most 0.8 (RESERVATION_OVERCOMMITTED), held under concurrent updates;
 * and live, against the simulator over real HTTP: a tenant reserving 0.3 among six equal tenants,
 * all backlogged, gets its 0.3 first and its part of the rest by weight: 0.3 + 0.7 / 7 = 0.4 of the
 * dispatches (its weight alone would give it 1/7).
 *
 * The jobs are in before a worker starts (an API process first, then a worker on the same
 * database), as in fairness-live.test.ts: a submission committing while leases run joins at the
 * clock its transaction read.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

let sim: Simulator;
let t: TestApp;
let worker: TestApp | undefined;
let sql: postgres.Sql;

const env = () => ({
  APIVERVE_API_KEY: sim.apiKey,
  APIVERVE_BASE_URL: sim.url,
  APIVERVE_RATE_PER_MINUTE: '1200',
  INITIAL_LATENCY_MS: '20',
  BATCH_DISABLED_APIS: 'dnslookup',
});

before(async () => {
  sim = await startSimulator({ plan: 'PRO', ratePerMinute: 1200, latencyMs: 20, latencyP95Ms: 40, seed: 11 });
  t = await startTestApp({ ...env(), SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
});

after(async () => {
  await worker?.stop();
  await sql?.end();
  await t?.stop();
  await sim?.stop();
});

const UPDATE = 'mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id reservedShare } }';
const update = (id: string, reservedShare: number | null) => t.gql(UPDATE, { i: { id, reservedShare } });
const code = (r: { body: { errors?: Array<{ extensions?: { code?: string } }> } }) => r.body.errors?.[0]?.extensions?.code;

test('reservedShare: 0 to 1, read back, 0 and null clear it; createTenant takes it too', async () => {
  const a = await t.createTenant('res-a');
  for (const bad of [-0.1, 1.5]) {
    const r = await update(a.id, bad);
    assert.equal(code(r), 'BAD_USER_INPUT', JSON.stringify(r.body));
    assert.equal(r.body.errors[0].extensions.field, 'reservedShare');
  }
  let r = await update(a.id, 0.25);
  assert.equal(r.body.data.updateTenant.reservedShare, 0.25);
  const [s] = await sql`select reserved_share from sched_tenants where tenant_id = ${a.id}`;
  assert.equal(s!.reserved_share, 0.25, "the scheduler's copy follows");
  r = await update(a.id, 0);
  assert.equal(r.body.data.updateTenant.reservedShare, null);
  await update(a.id, 0.25);
  r = await update(a.id, null);
  assert.equal(r.body.data.updateTenant.reservedShare, null);
  const c = await t.gql('mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id reservedShare } } }', { i: { name: 'res-created', tier: 'PRO', reservedShare: 0.1 } });
  assert.equal(c.body.data.createTenant.tenant.reservedShare, 0.1);
  await update(c.body.data.createTenant.tenant.id, null);
});

test('the sum over tenants stays <= 0.8: RESERVATION_OVERCOMMITTED, also for createTenant', async () => {
  const a = await t.createTenant('over-a');
  const b = await t.createTenant('over-b');
  assert.equal((await update(a.id, 0.5)).body.data.updateTenant.reservedShare, 0.5);
  const r = await update(b.id, 0.4);
  assert.equal(code(r), 'RESERVATION_OVERCOMMITTED', JSON.stringify(r.body));
  assert.equal(r.body.errors[0].extensions.reservedElsewhere, 0.5);
  assert.equal(r.body.errors[0].extensions.max, 0.8);
  assert.equal((await t.gql('{ tenants { id reservedShare } }')).body.data.tenants.find((x: { id: string }) => x.id === b.id).reservedShare, null, 'nothing written');
  // Exactly up to 0.8 passes (0.5 + 0.3 in floats is 0.8).
  assert.equal((await update(b.id, 0.3)).body.data.updateTenant.reservedShare, 0.3);
  // Lowering one's own share always passes; raising it is counted without its old value.
  assert.equal((await update(a.id, 0.2)).body.data.updateTenant.reservedShare, 0.2);
  assert.equal((await update(a.id, 0.5)).body.data.updateTenant.reservedShare, 0.5);
  const c = await t.gql('mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } } }', { i: { name: 'over-c', tier: 'PRO', reservedShare: 0.1 } });
  assert.equal(code(c), 'RESERVATION_OVERCOMMITTED', JSON.stringify(c.body));
  assert.equal((await t.gql('{ tenants { name } }')).body.data.tenants.some((x: { name: string }) => x.name === 'over-c'), false, 'the tenant was not created');
  await update(a.id, null);
  await update(b.id, null);
});

test('concurrent updates cannot overcommit: of two raises that each fit alone, one passes', async () => {
  const a = await t.createTenant('race-a');
  const b = await t.createTenant('race-b');
  for (let round = 0; round < 5; round++) {
    const [ra, rb] = await Promise.all([update(a.id, 0.5), update(b.id, 0.5)]);
    const codes = [code(ra), code(rb)];
    assert.equal(codes.filter((x) => x === undefined).length, 1, `one passes: ${JSON.stringify(codes)}`);
    assert.equal(codes.filter((x) => x === 'RESERVATION_OVERCOMMITTED').length, 1, `one is refused: ${JSON.stringify(codes)}`);
    const [{ total }] = (await sql`select coalesce(sum(reserved_share), 0)::float8 as total from tenants`) as unknown as [{ total: number }];
    assert.ok(total <= 0.8 + 1e-9, `sum ${total}`);
    await update(a.id, null);
    await update(b.id, null);
  }
});

test('a tenant reserving 0.3 among six equal tenants, all backlogged, gets 0.3 + 0.7 / 7 of the dispatches', async () => {
  const tenants: Array<{ id: string; apiKey: string }> = [];
  for (let i = 0; i < 7; i++) tenants.push(await t.createTenant(`live-${i}`, 'PRO'));
  const reserved = tenants[0]!;
  for (const [i, tenant] of tenants.entries()) {
    const r = await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', {
      i: { id: tenant.id, weight: 1, concurrencyCap: 100, ...(i === 0 ? { reservedShare: 0.3 } : {}) },
    });
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
  }
  for (const tenant of tenants) {
    const jobs = Array.from({ length: tenant === reserved ? 120 : 80 }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tenant.id.slice(0, 8)}-${i}.example` } }));
    const r = await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, tenant.apiKey);
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
  }
  worker = await startTestApp({ ...env(), SLUICE_ROLE: 'worker', DATABASE_URL: t.databaseUrl });
  // The first 200 dispatches: every tenant is backlogged throughout (the reserved one's 120 last
  // ~300 at 0.4; an equal one's 80 last ~800 at 0.1).
  const N = 200;
  const first = await eventually(async () => {
    const rows = await sql`select tenant_id from jobs where started_at is not null and tenant_id = any(${tenants.map((x) => x.id)}::uuid[]) order by started_at, id limit ${N}`;
    return rows.length === N ? rows : null;
  }, 60_000, 200);
  const share = first.filter((r) => r.tenant_id === reserved.id).length / N;
  // By weight alone: 1/7 = 0.143. Its reservation first, then a seventh of the rest: 0.4 (a
  // lease's jobs share one started_at, so the cut at N may split a call: a few jobs either way).
  assert.ok(share >= 0.36, `the reserved tenant's share of the first ${N} dispatches: ${share}`);
  assert.ok(share <= 0.45, `and not much more: ${share}`);
});
