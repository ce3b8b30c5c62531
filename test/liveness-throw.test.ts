/**
 * A call whose run throws (a bug in the client or in our own code) settles
 * its attempts instead of leaving them open, their leases refreshed for the
 * life of the process. The throw comes through the real path: the real
 * provider client wrapped so it throws on a chosen request, before sending
 * (a refunded put-back: nothing was sent) or after the provider answered (a
 * timeout-like outcome, billed per TIMEOUT_BILLING, and the job runs again
 * once). Judged per job by a counting proxy in front of the simulator.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import type { ProviderClient } from '../src/provider/types.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { startCallCounter, type CallCounter } from './helpers/call-counter.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;

/** The real client, throwing once on the first call whose input matches: before it sends, or after the provider answered. */
function throwingOnce(real: ProviderClient, rules: { before?: (domain: string) => boolean; after?: (domain: string) => boolean; afterBatch?: boolean }): ProviderClient {
  const fired = new Set<string>();
  const once = (key: string) => !fired.has(key) && fired.add(key) !== undefined;
  return {
    async call(req) {
      const domain = String(req.params.domain ?? '');
      if (rules.before?.(domain) && once(`before:${domain}`)) throw new TypeError(`test: thrown before sending ${domain}`);
      const outcome = await real.call(req);
      if (rules.after?.(domain) && once(`after:${domain}`)) throw new TypeError(`test: thrown after the answer for ${domain}`);
      return outcome;
    },
    async callBatch(req) {
      const outcome = await real.callBatch(req);
      if (rules.afterBatch && once('batch')) throw new TypeError(`test: thrown after a batch answer of ${req.items.length} items`);
      return outcome;
    },
    lastStatus: (k) => real.lastStatus(k),
    close: () => real.close(),
  };
}

async function allFinal(sql: postgres.Sql): Promise<boolean> {
  const [r] = await sql`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
  return r!.n === 0;
}

describe('a single call that throws', () => {
  let sim: Simulator;
  let counter: CallCounter;
  let t: TestApp;
  let sql: postgres.Sql;
  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 30, latencyP95Ms: 40, seed: 41 });
    counter = await startCallCounter(sim.url);
    t = await startTestApp(
      { APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: counter.url, APIVERVE_RATE_PER_MINUTE: '6000', BATCH_MAX: '1', TIMEOUT_BILLING: 'billed', SWEEP_INTERVAL_MS: '200', INITIAL_LATENCY_MS: '30' },
      { wrapProviderClient: (real) => throwingOnce(real, { before: (d) => d === 'before.example', after: (d) => d === 'after.example' }) },
    );
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await counter.stop();
    await sim.stop();
  });

  test('before sending: refunded and put back; after the answer: billed by the timeout rule and run again once', async () => {
    const tenant = await t.createTenant('thrower', 'PRO');
    const domains = ['before.example', 'after.example', ...Array.from({ length: 6 }, (_, i) => `plain${i}.example`)];
    const r = await t.gql(SUBMIT_MANY, { i: { jobs: domains.map((domain) => ({ api: 'dnslookup', params: { domain } })) } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    await eventually(() => allFinal(sql), 30_000, 100);

    const jobs = await sql`
      select j.params->>'domain' as domain, j.state, j.attempts,
        (select json_agg(json_build_object('outcome', r.outcome, 'billed', r.billed) order by r.created_at) from reservations r where r.job_id = j.id) as tries
      from jobs j`;
    const by = new Map(jobs.map((j) => [j.domain as string, j]));
    const calls = counter.byTarget();
    const callsFor = (d: string) => calls.get(`/v1/dnslookup?domain=${d}`) ?? 0;

    // Thrown before the request left: nothing was sent, so nothing billed and no attempt used.
    assert.equal(callsFor('before.example'), 1, 'the put-back job was sent once (after the throw)');
    assert.deepEqual(by.get('before.example')!.tries, [{ outcome: 'server_error', billed: 0 }, { outcome: 'billed', billed: 1 }]);
    assert.equal(by.get('before.example')!.attempts, 1, 'a put-back uses none of its attempts');
    // Thrown after the provider answered (and billed): settled like a timeout, billed, and run once more.
    assert.equal(callsFor('after.example'), 2, 'the job whose run threw after sending ran again exactly once');
    assert.deepEqual(by.get('after.example')!.tries, [{ outcome: 'timeout', billed: 1 }, { outcome: 'billed', billed: 1 }]);
    assert.equal(by.get('after.example')!.attempts, 2);
    for (let i = 0; i < 6; i++) assert.equal(callsFor(`plain${i}.example`), 1);
    for (const j of jobs) assert.equal(j.state, 'SUCCEEDED', `${j.domain} succeeded`);

    const [ledger] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(ledger!.n, sim.stats().totals.creditsBilled, 'the ledger equals what the provider billed');
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
  });
});

describe('a batch call that throws after the answer', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;
  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 30, latencyP95Ms: 40, seed: 42 });
    t = await startTestApp(
      { APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_RATE_PER_MINUTE: '6000', BATCH_MAX: '50', TIMEOUT_BILLING: 'billed', SWEEP_INTERVAL_MS: '200', INITIAL_LATENCY_MS: '30' },
      { wrapProviderClient: (real) => throwingOnce(real, { afterBatch: true }) },
    );
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  test("every item's attempt is settled like a timeout and runs again once", async () => {
    const tenant = await t.createTenant('batch-thrower', 'PRO');
    const total = 20;
    const r = await t.gql(SUBMIT_MANY, { i: { jobs: Array.from({ length: total }, (_, i) => ({ api: 'dnslookup', params: { domain: `b${i}.example` } })) } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    await eventually(() => allFinal(sql), 30_000, 100);

    const timedOut = await sql`select job_id, billed from reservations where outcome = 'timeout'`;
    assert.ok(timedOut.length >= 2, `the thrown batch's attempts were settled as timeouts (${timedOut.length})`);
    const [states] = await sql`select count(*) filter (where state = 'SUCCEEDED')::int as ok, count(*)::int as n from jobs`;
    assert.equal(states!.ok, total, 'every job succeeded in the end');
    // The provider saw each job once, plus once more for each item of the batch whose run threw.
    assert.equal(sim.stats().totals.calls, total + timedOut.length, 'the thrown batch ran again once, nothing else twice');
    const [ledger] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(ledger!.n, sim.stats().totals.creditsBilled, 'the ledger equals what the provider billed');
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
  });
});
