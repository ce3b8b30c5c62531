/**
 * An attempt's local deadline counts from when the lease RETURNED (the
 * database starts the lease inside the call, after any lock it waited on):
 * a lease call held on a tenant row for most of a lease does not have its
 * calls aborted right after they are sent. Judged by the provider's calls per
 * job (a counting proxy) and the attempts' outcomes, not by timings: the test
 * only checks, from pg_stat_activity, that the lease really waited.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { startCallCounter, type CallCounter } from './helpers/call-counter.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;
const LEASE_SECONDS = 3;

describe('a lease that waited on a lock', () => {
  let sim: Simulator;
  let counter: CallCounter;
  let t: TestApp;
  let sql: postgres.Sql;
  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 1000, latencyP95Ms: 1100, seed: 43 });
    counter = await startCallCounter(sim.url);
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: counter.url,
      APIVERVE_RATE_PER_MINUTE: '6000',
      BATCH_MAX: '1',
      ATTEMPT_LEASE_SECONDS: String(LEASE_SECONDS),
      INITIAL_LATENCY_MS: '1000',
      SWEEP_INTERVAL_MS: '200',
    });
    sql = postgres(t.databaseUrl, { max: 3, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await counter.stop();
    await sim.stop();
  });

  test('does not abort its calls early: one call per job, none settled as a timeout', async () => {
    const tenant = await t.createTenant('waited', 'ENTERPRISE');
    // Hold the window shut while the jobs arrive, so the next lease finds the tenant's row locked.
    await sql`update windows set paused_until = now() + interval '1 second', pause_reason = 'TEST'`;
    const domains = Array.from({ length: 5 }, (_, i) => `w${i}.example`);
    const r = await t.gql(SUBMIT_MANY, { i: { jobs: domains.map((domain) => ({ api: 'dnslookup', params: { domain } })) } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    await sql.begin(async (tx) => {
      await tx`select 1 from sched_tenants where tenant_id = ${tenant.id} for update`;
      // The lease call is waiting for this row (its first tenant is waited for, not skipped).
      await eventually(async () => {
        const [w] = await sql`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and query like '%sluice_lease%' and datname = current_database()`;
        return w!.n > 0;
      }, 20_000, 20);
      // Held for a whole lease: counted from its send, the lease would be lost by the time it returns.
      await new Promise((res) => setTimeout(res, LEASE_SECONDS * 1000));
    });
    await eventually(async () => {
      const [q] = await sql`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
      return q!.n === 0;
    }, 30_000, 100);

    const outcomes = await sql`select outcome, count(*)::int as n from reservations group by outcome order by outcome`;
    assert.deepEqual(outcomes.map((o) => [o.outcome, o.n]), [['billed', domains.length]], 'every attempt ran to its answer, none aborted');
    const calls = counter.byTarget();
    for (const d of domains) assert.equal(calls.get(`/v1/dnslookup?domain=${d}`), 1, `${d}: one call`);
    const [ledger] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(ledger!.n, sim.stats().totals.creditsBilled);
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
  });
});
