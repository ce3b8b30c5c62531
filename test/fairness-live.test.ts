/**
 * The live fairness figures: two tenants (weights 1 and 3) backlogged on a paced window against
 * the simulator over real HTTP; the admin `system { fairness }` shows both tenants' lag against
 * start-time fair queueing's bound (scheduler/sfq-lag.ts liveFairness over the recent leases),
 * within it, and GET /metrics carries the worst pair's lag and bound.
 *
 * Both tenants' jobs are in before a worker starts (an API process first, then a worker on the
 * same database): a submission that commits while leases run joins at the clock its transaction
 * read, which the leases may have moved by then (up to LAG_SLACK behind; see docs/ARCHITECTURE.md,
 * "Virtual time"), and this test is about the figures, not that case.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

let sim: Simulator;
let t: TestApp;
let worker: TestApp | undefined;

const env = () => ({
  APIVERVE_API_KEY: sim.apiKey,
  APIVERVE_BASE_URL: sim.url,
  APIVERVE_RATE_PER_MINUTE: '1200',
  INITIAL_LATENCY_MS: '20',
});

before(async () => {
  sim = await startSimulator({ plan: 'PRO', ratePerMinute: 1200, latencyMs: 20, latencyP95Ms: 40, seed: 7 });
  t = await startTestApp({ ...env(), SLUICE_ROLE: 'api' });
});

after(async () => {
  await worker?.stop();
  await t?.stop();
  await sim?.stop();
});

test('system { fairness } and /metrics show the backlogged tenants\' lag and the SFQ bound', async () => {
  const light = await t.createTenant('light', 'PRO');
  const heavy = await t.createTenant('heavy', 'PRO');
  for (const [tenant, weight] of [[light, 1], [heavy, 3]] as const) {
    const r = await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id weight } }', { i: { id: tenant.id, weight, concurrencyCap: 100 } });
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
  }
  for (const tenant of [light, heavy]) {
    const jobs = Array.from({ length: 400 }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tenant.id.slice(0, 8)}-${i}.example` } }));
    const r = await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, tenant.apiKey);
    assert.equal(r.body.errors, undefined, JSON.stringify(r.body.errors));
  }
  worker = await startTestApp({ ...env(), SLUICE_ROLE: 'worker', DATABASE_URL: t.databaseUrl });
  // Both served and both still waiting (400 each at 18/s take ~45 s): both are in the figures.
  const fairness = await eventually(async () => {
    const r = await t.gql('{ system { fairness { seconds worst { tenantA tenantB lag bound } tenants { tenantId lag bound } } } }');
    const f = r.body.data?.system.fairness;
    return f && f.tenants.length === 2 && f.seconds >= 2 ? f : null;
  }, 60_000, 200);
  assert.deepEqual(new Set(fairness.tenants.map((x: { tenantId: string }) => x.tenantId)), new Set([light.id, heavy.id]));
  assert.deepEqual(new Set([fairness.worst.tenantA, fairness.worst.tenantB]), new Set([light.id, heavy.id]));
  // The bound for weights 1 and 3: 1 + 1/3 + P/4, P >= 1.
  assert.ok(fairness.worst.bound >= 1 + 1 / 3 + 1 / 4 - 1e-9, `bound ${fairness.worst.bound}`);
  assert.ok(fairness.worst.lag <= fairness.worst.bound + 1e-9, `lag ${fairness.worst.lag} within the bound ${fairness.worst.bound}`);
  const text = await (await fetch(new URL('/metrics', t.url))).text();
  const lag = /^sluice_fair_lag (\S+)$/m.exec(text);
  const bound = /^sluice_fair_lag_bound (\S+)$/m.exec(text);
  assert.ok(lag && bound, 'the worst pair\'s lag and bound are exported');
  assert.ok(Number(lag[1]) <= Number(bound[1]) + 1e-9, `metrics: lag ${lag[1]} within the bound ${bound[1]}`);
});
