/**
 * Bill only what may have been billed, and per-job billing exact (I11).
 *
 * - The client's requestSent against real sockets: a server that accepts and never reads, a call
 *   queued in the HTTP agent, the simulator's hang.
 * - A lease that committed but never reached its node: refunded at expiry, run once, billed once.
 * - A late settlement after its lease expired: reconciled against the simulator's own count.
 * - A worker SIGKILLed mid-call: each job's creditsBilled is what the simulator billed for it.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { Writable } from 'node:stream';
import pino from 'pino';
import postgres from 'postgres';
import { DEFAULT_CATALOG } from '../src/config/apis.ts';
import { planLateSettlement, reconcileLateSettlements, type ExpiredSettlement, type LateOutcome } from '../src/dispatch/late-settlement.ts';
import { classifyFailure } from '../src/provider/classify.ts';
import { createProviderClient } from '../src/provider/client.ts';
import { billedCredits, expirySettlement } from '../src/scheduler/ledger.ts';
import { leaseCosts } from '../src/scheduler/lease.ts';
import { leaseJobs, markSent } from '../src/scheduler/sql/reservations.ts';
import { billedInputKey, startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { createTestDatabase } from './helpers/db.ts';
import { assertJobsAccountedFor, assertJobsBilledAsLedger, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';
import { unlimitedWindow } from './helpers/lease.ts';
import { crashTestEnv, gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';

const COST = DEFAULT_CATALOG.get('emailvalidator')!.creditCost;
const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;

describe('the bill of a call that got no answer', () => {
  test('classification: only a request fully written may have been billed, whatever ended the call', () => {
    const base = { message: 'x', cost: 5, latencyMs: 1, timeoutBilling: 'billed' as const };
    for (const reason of ['timeout', 'aborted', 'network'] as const) {
      const unsent = classifyFailure({ ...base, reason, requestSent: false });
      assert.equal(unsent.creditsBilled, 0, `${reason} before the request was written bills nothing`);
      assert.equal(unsent.billedIsGuess, undefined, `${reason} before sending: the bill is known`);
      const sent = classifyFailure({ ...base, reason, requestSent: true });
      assert.equal(sent.creditsBilled, 5, `${reason} after sending bills by the timeout rule`);
      assert.equal(sent.billedIsGuess, true);
      assert.equal(billedCredits(sent.creditsBilled, 5), 5, 'and the ledger takes that bill, whatever the kind');
    }
  });

  test('a server that accepts and never reads: a small request is written whole (sent), a huge one never is', async () => {
    const held: net.Socket[] = [];
    const server = net.createServer({ pauseOnConnect: true }, (s) => void held.push(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as net.AddressInfo).port;
    const client = createProviderClient({ baseUrl: `http://127.0.0.1:${port}/v1`, timeoutMs: 1500, catalog: DEFAULT_CATALOG, timeoutBilling: 'billed' });
    try {
      const small = await client.call({ api: 'emailvalidator', params: { email: 'a@example.com' }, apiKey: 'k' });
      assert.equal(small.kind, 'timeout');
      assert.equal(small.creditsBilled, COST, 'written to the socket, unanswered: billed by the timeout rule');
      // 64 MB: more than the kernel's send and receive buffers hold, so the write never completes.
      const big = await client.callBatch({ api: 'emailvalidator', items: [{ id: '0', params: { email: `${'x'.repeat(64 * 1024 * 1024)}@example.com` } }], apiKey: 'k' });
      assert.equal(big.call.kind, 'timeout');
      assert.equal(big.call.creditsBilled, 0, 'a request never fully written cannot have been billed');
    } finally {
      await client.close();
      for (const s of held) s.destroy();
      await new Promise((r) => server.close(r));
    }
  });

  test("the simulator's hang: the sent call is billed by the rule; calls queued behind it in the agent are not", async () => {
    const sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, concurrentCalls: 100, seed: 5 });
    sim.setConditions({ hang: { probability: 1, afterMs: null } });
    // One socket: the first call hangs on it, the others wait in the agent's queue.
    const client = createProviderClient({ baseUrl: sim.url, timeoutMs: 1000, catalog: DEFAULT_CATALOG, timeoutBilling: 'billed', maxSockets: 1 });
    try {
      const abort = new AbortController();
      const calls = [
        client.call({ api: 'emailvalidator', params: { email: 'first@example.com' }, apiKey: sim.apiKey, timeoutMs: 1500 }),
        client.call({ api: 'emailvalidator', params: { email: 'queued@example.com' }, apiKey: sim.apiKey, timeoutMs: 800 }),
        client.call({ api: 'emailvalidator', params: { email: 'aborted@example.com' }, apiKey: sim.apiKey, signal: abort.signal }),
      ];
      setTimeout(() => abort.abort(), 300);
      const [first, queued, aborted] = await Promise.all(calls);
      assert.equal(sim.stats().totals.calls, 1, 'only the first call reached the provider');
      assert.equal(first!.creditsBilled, COST, 'the hung call was sent: billed by the timeout rule');
      assert.equal(queued!.kind, 'timeout');
      assert.equal(queued!.creditsBilled, 0, 'timed out while queued in the agent: not billed');
      assert.equal(aborted!.creditsBilled, 0, 'aborted while queued in the agent: not billed');
    } finally {
      await client.close();
      await sim.stop();
    }
  });
});

describe('late settlements: the rules', () => {
  const expiry = (o: Partial<ExpiredSettlement> = {}): ExpiredSettlement => ({ outcome: 'node_lost', billed: 5, credits: 5, reconciled: false, ...o });
  const late = (o: Partial<LateOutcome> = {}): LateOutcome => ({ attempt: 1, billed: 5, billedIsGuess: false, reaction: 'complete', ...o });
  const waiting = { state: 'QUEUED' as const, attempts: 1 };

  test('only an expiry, only once; a settlement that settled it itself changes nothing', () => {
    assert.deepEqual(planLateSettlement(expiry({ outcome: 'billed' }), waiting, late()), { action: 'none', why: 'settled by this settlement' });
    assert.deepEqual(planLateSettlement(expiry({ reconciled: true }), waiting, late()), { action: 'none', why: 'reconciled already' });
  });

  test('a known bill replaces the guess; a guessed one leaves the expiry, unless the expiry said never sent', () => {
    assert.equal((planLateSettlement(expiry({ billed: 0 }), waiting, late()) as { billedDelta: number }).billedDelta, 5, 'known billed, expiry refunded: +5');
    assert.equal((planLateSettlement(expiry(), waiting, late({ billed: 0, reaction: 'put_back' })) as { billedDelta: number }).billedDelta, -5, 'known unbilled (a 429), expiry billed: -5');
    assert.equal((planLateSettlement(expiry({ billed: 0 }), waiting, late({ billedIsGuess: true, reaction: 'retry' })) as { billedDelta: number }).billedDelta, 0, 'a guess knows no more than the expiry');
    assert.equal((planLateSettlement(expiry({ billed: 0, outcome: 'never_sent' }), waiting, late({ billedIsGuess: true, reaction: 'retry' })) as { billedDelta: number }).billedDelta, 5, 'but the node did send it');
    assert.equal((planLateSettlement(expiry({ billed: 0 }), waiting, late({ billed: 9 })) as { billed: number }).billed, 5, 'never more than reserved');
  });

  test('a final outcome finishes the job only while it waits on the same attempt', () => {
    const finish = (job: { state: 'QUEUED' | 'RUNNING' | 'SUCCEEDED' | 'CANCELLED' | 'WAITING_QUOTA'; attempts: number } | null, l: Partial<LateOutcome> = {}) =>
      (planLateSettlement(expiry(), job, late(l)) as { finish: string | null }).finish;
    assert.equal(finish(waiting), 'SUCCEEDED');
    assert.equal(finish({ state: 'WAITING_QUOTA', attempts: 1 }), 'SUCCEEDED');
    assert.equal(finish(waiting, { reaction: 'fail', billed: 0 }), 'FAILED', 'a 400 ends the job too');
    assert.equal(finish(waiting, { reaction: 'retry' }), null, 'an outcome that would retry leaves the expiry requeue');
    assert.equal(finish(waiting, { reaction: 'put_back', billed: 0 }), null);
    assert.equal(finish({ state: 'RUNNING', attempts: 2 }), null, 'leased again: its new call cannot be taken back');
    assert.equal(finish({ state: 'QUEUED', attempts: 2 }), null, 'a later attempt came and went');
    assert.equal(finish({ state: 'CANCELLED', attempts: 1 }), null);
    assert.equal(finish(null), null, 'the job is gone');
  });

  test('the expiry: never sent is refunded, sent is billed by the timeout rule', () => {
    assert.deepEqual(expirySettlement(5, false, 'billed'), { billed: 0, outcome: 'never_sent' });
    assert.deepEqual(expirySettlement(5, true, 'billed'), { billed: 5, outcome: 'node_lost' });
    assert.deepEqual(expirySettlement(5, true, 'refunded'), { billed: 0, outcome: 'node_lost' });
  });
});

/** A job of its own for a new tenant, on an API process; returns the tenant and the job. */
async function oneJob(api: TestApp, email: string): Promise<{ tenantId: string; jobId: string }> {
  const t = await api.createTenant(`t-${email}`);
  const r = await api.gql(SUBMIT, { i: { api: 'emailvalidator', params: { email } } }, t.apiKey);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return { tenantId: t.id, jobId: r.body.data.submitJob.job.id };
}

/** Leases every ready job on a window of the test's own, as a node would, with a 1 s attempt lease. */
async function leaseDirectly(sql: postgres.Sql) {
  await unlimitedWindow(sql, 'billing-test');
  const { rows } = await leaseJobs(sql, {
    window: 'billing-test', nodeId: crypto.randomUUID(), pool: 10, max: 10, leaseMax: 10, classes: ['INTERACTIVE', 'STANDARD', 'BULK'], leaseSeconds: 1,
    costs: leaseCosts(DEFAULT_CATALOG), hold: [], batch: {}, batchMax: 1, batchQuantum: 1,
  });
  assert.equal(rows.length, 1, 'the lease took the job');
  return rows[0]!;
}

function workerEnv(sim: Simulator, url: string, extra: Record<string, string> = {}): Record<string, string> {
  return {
    SLUICE_ROLE: 'worker', DATABASE_URL: url, APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_PLAN: 'PRO',
    APIVERVE_RATE_PER_MINUTE: '6000', APIVERVE_CONCURRENT_CALLS: '100', SWEEP_INTERVAL_MS: '200', ...extra,
  };
}

describe('leases that never reached their node, and late settlements', () => {
  let sim: Simulator;
  let api: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, concurrentCalls: 100, latencyMs: 20, latencyP95Ms: 20, seed: 9 });
    api = await startTestApp({ SLUICE_ROLE: 'api' });
    sql = postgres(api.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await api.stop();
    await sim.stop();
  });

  test('a lease committed but never delivered: refunded when it expires, then run once and billed once', async () => {
    sim.resetStats();
    const { jobId } = await oneJob(api, 'undelivered@example.com');
    // The lease commits; its rows never reach a node that marks them sent or calls.
    const lost = await leaseDirectly(sql);
    const worker = await startTestApp(workerEnv(sim, api.databaseUrl, { TIMEOUT_BILLING: 'billed' }));
    try {
      await eventually(async () => {
        const [j] = await sql`select state from jobs where id = ${jobId}`;
        return j!.state === 'SUCCEEDED';
      }, 30_000);
      const [r] = await sql`select r.outcome, r.billed, (select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))) as sent_at from reservations r where r.id = ${lost.reservationId}`;
      assert.deepEqual({ outcome: r!.outcome, billed: r!.billed, sent: r!.sent_at !== null }, { outcome: 'never_sent', billed: 0, sent: false }, 'the unsent lease was refunded');
      const stats = sim.stats();
      assert.equal(stats.totals.calls, 1, 'the provider was called once');
      const [job] = await sql`select j.attempts, coalesce(j.credits_billed, 0) as credits_billed from jobs j where j.id = ${jobId}`;
      assert.equal(job!.credits_billed, stats.creditsByInput[billedInputKey('emailvalidator', { email: 'undelivered@example.com' })], 'billed once, as the provider billed');
      assert.equal(job!.credits_billed, COST);
      await assertQuiescent(sql);
      await assertLedgerBalances(sql);
    } finally {
      await worker.app.stop();
    }
  });

  test('a late settlement after its lease expired is reconciled: ledger and job agree with the simulator, and the log names the job', async () => {
    sim.resetStats();
    const email = 'late@example.com';
    const { tenantId, jobId } = await oneJob(api, email);
    const a = await leaseDirectly(sql);
    // Held back from dispatch, so the job waits where the expiry puts it (nobody leases it again).
    const suspended = await api.gql(`mutation($id: ID!) { suspendTenant(id: $id) { id } }`, { id: tenantId });
    assert.ok(suspended.body.data, JSON.stringify(suspended.body.errors));
    assert.equal((await markSent(sql, [a.reservationId])).size, 1, 'marked sent');
    const client = createProviderClient({ baseUrl: sim.url, timeoutMs: 5000, catalog: DEFAULT_CATALOG });
    const outcome = await client.call({ api: 'emailvalidator', params: { email }, apiKey: sim.apiKey });
    await client.close();
    assert.equal(outcome.kind, 'billed');
    // Its settlement does not land before the lease expires: a worker's sweeper (TIMEOUT_BILLING=refunded) settles it first.
    const worker = await startTestApp(workerEnv(sim, api.databaseUrl, { TIMEOUT_BILLING: 'refunded' }));
    try {
      await eventually(async () => {
        const [r] = await sql`select outcome from reservations where id = ${a.reservationId} and settled_at is not null`;
        return r?.outcome === 'node_lost';
      }, 30_000);
      const [queued] = await sql`select state from jobs where id = ${jobId}`;
      assert.equal(queued!.state, 'QUEUED', 'the expiry put the job back');
      const [before] = await sql`select billed from tenant_ledger where tenant_id = ${tenantId}`;
      assert.equal(Number(before!.billed), 0, 'the expiry refunded what the provider billed');

      const lines: string[] = [];
      const log = pino({ level: 'debug' }, new Writable({ write: (c, _e, cb) => void (lines.push(String(c)), cb()) }));
      const late = { reservationId: a.reservationId, jobId, tenantId, queue: a.queue, attempt: a.attempt, outcome, billed: billedCredits(outcome.creditsBilled, a.credits) };
      assert.equal(await reconcileLateSettlements(sql, [late], log), 1);
      assert.ok(lines.some((l) => l.includes(jobId) && l.includes('reconciled')), `the log names the job: ${lines.join('')}`);
      assert.equal(await reconcileLateSettlements(sql, [late], log), 0, 'a retried settlement changes nothing more');

      const stats = sim.stats();
      assert.equal(stats.totals.calls, 1, 'finished with the late result: the provider was not called again');
      const [job] = await sql`select j.state, coalesce(j.credits_billed, 0) as credits_billed, j.result as data from jobs j where j.id = ${jobId}`;
      assert.equal(job!.state, 'SUCCEEDED');
      assert.ok(job!.data, 'with the late call\'s data');
      assert.equal(job!.credits_billed, stats.creditsByInput[billedInputKey('emailvalidator', { email })], "the job's bill is the provider's");
      const [ledger] = await sql`select billed from tenant_ledger where tenant_id = ${tenantId}`;
      assert.equal(Number(ledger!.billed), stats.totals.creditsBilled, "the tenant's ledger is the provider's count");
      const [boss] = await sql`select count(*)::int as n from pgboss.job where id = ${jobId} and state < 'active'`;
      assert.equal(boss!.n, 0, 'its waiting pg-boss job was removed');
      await assertJobsAccountedFor(sql);
      await assertQuiescent(sql);
      await assertLedgerBalances(sql);
    } finally {
      await worker.app.stop();
    }
  });
});

describe('the sent mark costs one statement per lease', () => {
  test('every lease that returned jobs is marked by ONE statement for all its reservations, not one per job', async () => {
    const sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, concurrentCalls: 100, latencyMs: 50, latencyP95Ms: 50, seed: 2 });
    const api = await startTestApp({ SLUICE_ROLE: 'api' });
    const sql = postgres(api.databaseUrl, { max: 2, onnotice: () => {} });
    try {
      // Count sluice_lease calls in this test database only (pg_stat_user_functions).
      await sql.unsafe(`alter database "${new URL(api.databaseUrl).pathname.slice(1)}" set track_functions = 'pl'`);
      const emails: string[] = [];
      for (let t = 0; t < 6; t++) {
        const tenant = await api.createTenant(`marks${t}`, 'ENTERPRISE');
        const mine = Array.from({ length: 5 }, (_, i) => `m${t}-${i}@example.com`);
        emails.push(...mine);
        const r = await api.gql(SUBMIT_MANY, { i: { jobs: mine.map((email) => ({ api: 'emailvalidator', params: { email } })) } }, tenant.apiKey);
        assert.ok(r.body.data, JSON.stringify(r.body.errors));
      }
      // Queued before the worker starts, with a large pool and a full bucket (no slow start): leases take several jobs each.
      const worker = await startTestApp(workerEnv(sim, api.databaseUrl, { INITIAL_LATENCY_MS: '1000', LEASE_MAX: '5', PACE_START: '1' }));
      await eventually(async () => {
        const [r] = await sql`select count(*)::int as n from jobs where state <> 'SUCCEEDED'`;
        return r!.n === 0;
      }, 30_000);
      // Its backends flush their function statistics when they exit.
      await worker.app.stop();
      const [marks] = await sql`select count(distinct x.sent_at)::int as marks, count(*)::int as sent from (select (select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))) as sent_at from reservations r) x where x.sent_at is not null`;
      const leases = await eventually(async () => {
        const [f] = await sql`select coalesce(sum(calls), 0)::int as n from pg_stat_user_functions where funcname = 'sluice_lease'`;
        return f!.n > 0 ? f!.n : null;
      }, 10_000, 200);
      assert.equal(marks!.sent, emails.length, 'every call was marked sent');
      assert.ok(leases < emails.length, `the leases took several jobs each (${leases} leases for ${emails.length} jobs), so a mark per job would show`);
      assert.ok(marks!.marks <= leases, `${marks!.marks} mark statements for ${leases} lease calls`);
      await assertQuiescent(sql);
    } finally {
      await sql.end();
      await api.stop();
      await sim.stop();
    }
  });
});

/**
 * Real processes on a database and a simulator of their own, for one describe: `ctx` is filled
 * before its tests, and every node pushed on `ctx.nodes` is killed after them (thawed first).
 */
function processWorld(latencyMs: number, seed: number) {
  const ctx = { db: null as unknown as { url: string; drop(): Promise<void> }, sql: null as unknown as postgres.Sql, sim: null as unknown as Simulator, nodes: [] as NodeProcess[] };
  before(async () => {
    ctx.db = await createTestDatabase();
    ctx.sql = postgres(ctx.db.url, { max: 2, onnotice: () => {} });
    ctx.sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs, latencyP95Ms: latencyMs, concurrentCalls: 100, seed });
  });
  after(async () => {
    for (const n of ctx.nodes) if (n.child.exitCode === null && n.child.signalCode === null) n.child.kill('SIGCONT');
    await Promise.all(ctx.nodes.map((n) => n.stop('SIGKILL')));
    await ctx.sql.end();
    await ctx.sim.stop();
    await ctx.db.drop();
  });
  return ctx;
}

/** An API process and a PRO tenant on it. */
async function apiWithTenant(ctx: ReturnType<typeof processWorld>, env: Record<string, string>, name: string): Promise<{ url: string; apiKey: string }> {
  const apiNode = await startNode('api', env);
  ctx.nodes.push(apiNode);
  const { createTenant } = await gqlAt(apiNode.url!, `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`, { i: { name, tier: 'PRO' } });
  return { url: apiNode.url!, apiKey: createTenant.apiKey as string };
}

describe('a worker SIGKILLed mid-call', () => {
  const ctx = processWorld(1500, 4);

  test("each job's creditsBilled is what the simulator billed for it; the tenant's ledger is the simulator's count", async () => {
    const { sql, sim, nodes } = ctx;
    const env = crashTestEnv(sim, ctx.db.url, 6000, { INITIAL_LATENCY_MS: '1500', ATTEMPT_LEASE_SECONDS: '3', BATCH_MAX: '1' });
    const api = await apiWithTenant(ctx, env, 'killed');
    const emails = Array.from({ length: 12 }, (_, i) => `k${i}@example.com`);
    const victim = await startNode('worker', env);
    nodes.push(victim);
    await gqlAt(api.url, SUBMIT_MANY, { i: { jobs: emails.map((email) => ({ api: 'emailvalidator', params: { email } })) } }, api.apiKey);
    // Every open attempt of the victim has reached the provider (marked sent, and arrived), then kill it.
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n, count((select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))))::int as sent from reservations r where r.settled_at is null`;
      return r!.n >= 4 && r!.sent === r!.n && sim.stats().account.inFlight === r!.n;
    }, 30_000, 20);
    await victim.stop('SIGKILL');
    nodes.push(await startNode('worker', env));
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where state <> 'SUCCEEDED'`;
      const [o] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return r!.n === 0 && o!.n === 0;
    }, 60_000, 200);

    const stats = sim.stats();
    const rows = await sql`select j.params->>'email' as email, j.attempts, coalesce(j.credits_billed, 0) as credits_billed from jobs j`;
    assert.equal(rows.length, emails.length);
    let rerun = 0;
    for (const r of rows) {
      const provider = stats.creditsByInput[billedInputKey('emailvalidator', { email: r.email as string })] ?? 0;
      assert.equal(r.credits_billed, provider, `job ${r.email}: creditsBilled ${r.credits_billed}, the provider billed ${provider}`);
      if ((r.attempts as number) >= 2) rerun++;
    }
    assert.ok(rerun >= 4, `the killed worker's jobs ran again (${rerun})`);
    const [ledger] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(ledger!.n, stats.totals.creditsBilled, "the tenant's ledger equals the simulator's count");
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
    await assertJobsBilledAsLedger(sql);
    await assertLedgerBalances(sql);
  });
});

describe('a worker frozen mid-call (SIGSTOP) while another takes its job over', () => {
  const ctx = processWorld(2500, 6);

  test('its settlement, late after the expiry, is reconciled through the dispatcher: logged with the job id, billed as the provider billed', async () => {
    const { sql, sim, nodes } = ctx;
    const env = crashTestEnv(sim, ctx.db.url, 6000, { INITIAL_LATENCY_MS: '2500', ATTEMPT_LEASE_SECONDS: '1', BATCH_MAX: '1' });
    const api = await apiWithTenant(ctx, env, 'frozen');
    const frozen = await startNode('worker', env);
    nodes.push(frozen);
    const email = 'frozen@example.com';
    const { submitJobs } = await gqlAt(api.url, SUBMIT_MANY, { i: { jobs: [{ api: 'emailvalidator', params: { email } }] } }, api.apiKey);
    const jobId = submitJobs.jobs[0].id as string;
    // Its call has reached the provider (billed on arrival, answered after 2.5 s): freeze the worker.
    await eventually(async () => sim.stats().account.inFlight === 1, 30_000, 20);
    frozen.child.kill('SIGSTOP');
    // Another worker's sweeper finds the lease expired (billed by the timeout rule) and runs the job again.
    nodes.push(await startNode('worker', env));
    await eventually(async () => {
      const [j] = await sql`select state from jobs where id = ${jobId}`;
      return j!.state === 'SUCCEEDED';
    }, 60_000, 100);
    const [lost] = await sql`select count(*)::int as n from reservations where job_id = ${jobId} and outcome = 'node_lost'`;
    assert.equal(lost!.n, 1, 'the frozen attempt was settled by expiry');
    // Thawed: its answer (or, if its lease timer fires first, its abort) settles late.
    frozen.child.kill('SIGCONT');
    await eventually(async () => frozen.logs.some((l) => l.includes(`late settlement of job ${jobId}`)), 30_000, 100);
    await eventually(async () => {
      const [o] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return o!.n === 0;
    }, 10_000);
    const stats = sim.stats();
    const provider = stats.creditsByInput[billedInputKey('emailvalidator', { email })];
    assert.equal(provider, 2 * COST, 'the provider billed both calls');
    const [job] = await sql`select coalesce(j.credits_billed, 0) as credits_billed from jobs j where j.id = ${jobId}`;
    assert.equal(job!.credits_billed, provider, "the job's bill is the provider's, the late settlement not counted twice");
    const [ledger] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(ledger!.n, stats.totals.creditsBilled, "the tenant's ledger equals the simulator's count");
    await assertJobsAccountedFor(sql);
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
  });
});
