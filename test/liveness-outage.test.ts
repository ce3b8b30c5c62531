/**
 * Outages longer than the attempt lease, judged per job against the
 * provider's own record (a counting proxy in front of the simulator):
 *  - Postgres killed for 3 x ATTEMPT_LEASE_SECONDS while calls of known
 *    length are in flight: the calls finish during the outage (their outcomes
 *    are known but cannot be stored); after recovery the node settles them
 *    before any sweep may expire their leases, so every job is called exactly
 *    once and billed exactly what the provider billed, per job and per tenant;
 *  - SIGTERM while Postgres is down with such outcomes pending: the process
 *    keeps retrying them within SHUTDOWN_GRACE_SECONDS, they land when
 *    Postgres is back, and after a restart every job ran once;
 *  - one worker cut off from Postgres while another still reaches it, with
 *    calls longer than ¾ of the lease in flight: the cut-off worker lets its
 *    calls run to their answers and starts no other, the other worker takes
 *    their jobs over only once those calls are over (never two calls of a job
 *    at once), and the answers held settle late, reconciled.
 * Each test runs real Sluice processes (`node src/main.ts`) against their own
 * embedded Postgres, which the test kills (SIGKILL, as a crash would) or cuts
 * one process off from.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { eventually } from './helpers/app.ts';
import { crashTestEnv, gqlAt, startNode } from './helpers/processes.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';
import { assertOneCallPerJob, useOutageRig } from './helpers/outage-rig.ts';
import { startCallCounter } from './helpers/call-counter.ts';
import { startTcpLink } from './helpers/tcp-link.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;

/** The attempt lease of these tests; every outage is longer than it. */
const LEASE_SECONDS = 3;
/** Calls take about 1 s: well inside ¾ of the lease, so none is aborted for its lease. */
const simulatorOptions = { plan: 'PRO' as const, ratePerMinute: 6000, latencyMs: 1000, latencyP95Ms: 1150, concurrentCalls: 100, seed: 31 };

const debug = (msg: string) => {
  if (process.env.TEST_DEBUG) console.error(`[liveness ${new Date().toISOString()}] ${msg}`);
};

/** The outage rig (test/helpers/outage-rig.ts) with these tests' timings, and a kill with calls in flight. */
function useLivenessRig() {
  const { rig, killPostgres } = useOutageRig(simulatorOptions);
  const env = (extra: Record<string, string> = {}) =>
    crashTestEnv({ apiKey: rig.sim.apiKey, url: rig.counter.url }, rig.databaseUrl, 6000, {
      BATCH_MAX: '1',
      ATTEMPT_LEASE_SECONDS: String(LEASE_SECONDS),
      NODE_TIMEOUT_SECONDS: '30',
      REQUEST_TIMEOUT_MS: '3000',
      DISPATCH_IDLE_POLL_MS: '200',
      INITIAL_LATENCY_MS: '1000',
      ...extra,
    });
  /**
   * A node with `total` jobs of one tenant (unique inputs tagged `tag`); once calls are in flight,
   * Postgres is killed. Returns the node, how many calls were in flight then, and the restart.
   */
  const killWithCallsInFlight = async (extraEnv: Record<string, string>, tag: string, total: number) => {
    const node = await startNode('all', env(extraEnv));
    rig.nodes.push(node);
    const { createTenant } = await gqlAt(node.url!, CREATE, { i: { name: tag, tier: 'ENTERPRISE' } });
    await submitUnique(node.url!, createTenant.apiKey, tag, total);
    const sql = postgres(rig.databaseUrl, { max: 1, onnotice: () => {} });
    await eventually(async () => (await openReservations(sql)) >= 5 && rig.counter.inFlight() >= 5, 30_000, 10);
    await sql.end();
    const restart = killPostgres();
    const inFlightAtKill = rig.counter.inFlight();
    debug(`killed with ${inFlightAtKill} calls in flight`);
    return { node, inFlightAtKill, restart };
  };
  return { rig, env, killWithCallsInFlight };
}

async function submitUnique(url: string, key: string, tag: string, n: number): Promise<string[]> {
  const jobs = Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}${i}.example` } }));
  const r = await gqlAt(url, SUBMIT_MANY, { i: { jobs } }, key);
  return r.submitJobs.jobs.map((j: { id: string }) => j.id);
}

async function openReservations(sql: postgres.Sql): Promise<number> {
  const [r] = await sql`select count(*)::int as n from reservations where settled_at is null`;
  return r!.n;
}

describe('Postgres down for 3 attempt leases with calls in flight', () => {
  const { rig, killWithCallsInFlight } = useLivenessRig();

  test('every known outcome lands after recovery: one call per job, billed as the provider billed', async () => {
    const total = 80;
    const { node, inFlightAtKill, restart } = await killWithCallsInFlight({}, 'long', total);
    // The calls in flight finish during the outage: their outcomes are known and wait to be stored.
    await eventually(async () => rig.counter.inFlight() === 0, 10_000, 20);
    await new Promise((r) => setTimeout(r, 3 * LEASE_SECONDS * 1000));
    await restart();
    debug('restarted');

    const check = postgres(rig.databaseUrl, { max: 2, onnotice: () => {} });
    try {
      await eventually(async () => {
        const [r] = await check`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
        return r!.n === 0;
      }, 120_000, 200);
      assert.ok(inFlightAtKill > 0, 'calls were in flight when Postgres died');
      const [lost] = await check`select count(*)::int as n from reservations where outcome in ('node_lost', 'never_sent')`;
      assert.equal(lost!.n, 0, "no reservation of the live node was expired: it settled its known outcomes first");
      await assertOneCallPerJob(check, rig.counter, rig.sim, total);
      await assertJobsAccountedFor(check);
      await assertQuiescent(check);
      await assertLedgerBalances(check);
      assert.equal(node.child.exitCode, null, 'the process lived through it');
    } finally {
      await check.end();
    }
  });
});

describe('SIGTERM while Postgres is down, with known outcomes pending', () => {
  const { rig, env, killWithCallsInFlight } = useLivenessRig();

  test('the stop keeps retrying them within the grace; they land once Postgres is back; after a restart each job ran once', async () => {
    const total = 80;
    const { node, inFlightAtKill, restart } = await killWithCallsInFlight({ SHUTDOWN_GRACE_SECONDS: '60' }, 'stop', total);
    await eventually(async () => rig.counter.inFlight() === 0, 10_000, 20);
    const callsAtStop = rig.counter.calls.length;
    const exit = new Promise<number | null>((r) => node.child.once('exit', (code) => r(code)));
    node.child.kill('SIGTERM');
    // Down for longer than a lease after the SIGTERM: the process must still be retrying, not gone.
    await new Promise((r) => setTimeout(r, 2 * LEASE_SECONDS * 1000));
    assert.equal(node.child.exitCode, null, `still retrying its settlements within the grace:\n${node.logs.slice(-10).join('\n')}`);
    await restart();
    assert.equal(await exit, 0, `clean exit after the drain:\n${node.logs.slice(-20).join('\n')}`);
    assert.ok(node.logs.some((l) => l.includes('dispatcher drained')), `every known outcome landed before the exit:\n${node.logs.slice(-20).join('\n')}`);
    assert.ok(inFlightAtKill > 0, 'calls were in flight when Postgres died');
    assert.equal(rig.counter.calls.length, callsAtStop, 'nothing was called after the stop');

    const check = postgres(rig.databaseUrl, { max: 2, onnotice: () => {} });
    try {
      assert.equal(await openReservations(check), 0, 'no reservation left open by the stop');
      const [done] = await check`select count(*)::int as n from jobs where state in ('SUCCEEDED', 'FAILED')`;
      assert.equal(done!.n, callsAtStop, 'every call made before the stop was settled as its job');

      const second = await startNode('all', env());
      rig.nodes.push(second);
      await eventually(async () => {
        const [r] = await check`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
        return r!.n === 0;
      }, 120_000, 200);
      await second.stop('SIGTERM');
      await assertOneCallPerJob(check, rig.counter, rig.sim, total);
      await assertJobsAccountedFor(check);
      await assertQuiescent(check);
      await assertLedgerBalances(check);
    } finally {
      await check.end();
    }
  });
});

describe('SIGTERM while Postgres stays down past the grace', () => {
  const { rig, killWithCallsInFlight } = useLivenessRig();

  test('the stop gives up once the grace is over, and names the jobs whose known outcomes it abandons', async () => {
    const { node, restart } = await killWithCallsInFlight({ SHUTDOWN_GRACE_SECONDS: String(LEASE_SECONDS) }, 'gone', 40);
    await eventually(async () => rig.counter.inFlight() === 0, 10_000, 20);
    const exit = new Promise<number | null>((r) => node.child.once('exit', (code) => r(code)));
    node.child.kill('SIGTERM');
    assert.equal(await exit, 0, `the process stops once the grace is over:\n${node.logs.slice(-20).join('\n')}`);
    const line = node.logs.find((l) => l.includes('stop grace over'));
    assert.ok(line, `the abandonment is logged:\n${node.logs.slice(-20).join('\n')}`);
    const logged = JSON.parse(line) as { knownOutcomes: string[]; callsAborted: string[] };

    await restart();
    const check = postgres(rig.databaseUrl, { max: 1, onnotice: () => {} });
    try {
      // What the log names is exactly what was left open: the jobs whose calls had answered.
      const open = await check`select job_id from reservations where settled_at is null order by job_id`;
      assert.ok(logged.knownOutcomes.length > 0, 'known outcomes were pending');
      assert.deepEqual([...logged.knownOutcomes].sort(), open.map((r) => r.job_id as string), 'the log names every abandoned job');
      assert.deepEqual(logged.callsAborted, [], 'no call was in flight (they had all answered)');
    } finally {
      await check.end();
    }
  });
});

describe('one worker cut off from Postgres while another still reaches it', () => {
  // Calls of ~2.5 s: longer than ¾ of the 2 s lease, well inside the 4 s provider timeout.
  const { rig } = useOutageRig({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 2500, latencyP95Ms: 2600, concurrentCalls: 100, seed: 37 });

  test('its calls run to their answers, no call of the same job overlaps them, and what it held settles late', async () => {
    const lease = { ATTEMPT_LEASE_SECONDS: '2', PROVIDER_TIMEOUT_MS: '4000', INITIAL_LATENCY_MS: '2500' };
    const env = (url: string, databaseUrl: string) =>
      crashTestEnv({ apiKey: rig.sim.apiKey, url }, databaseUrl, 6000, { BATCH_MAX: '1', NODE_TIMEOUT_SECONDS: '30', REQUEST_TIMEOUT_MS: '3000', DISPATCH_IDLE_POLL_MS: '200', ...lease });
    const linked = await startTcpLink(rig.port);
    // The cut-off worker's calls go through a counter of their own: whose call it was is known.
    const cutCounter = await startCallCounter(rig.sim.url);
    const check = postgres(rig.databaseUrl, { max: 2, onnotice: () => {} });
    try {
      const other = await startNode('all', env(rig.counter.url, rig.databaseUrl));
      rig.nodes.push(other);
      const cut = await startNode('worker', env(cutCounter.url, rig.databaseUrl.replace(`:${rig.port}/`, `:${linked.port}/`)));
      rig.nodes.push(cut);
      const { createTenant } = await gqlAt(other.url!, CREATE, { i: { name: 'split', tier: 'ENTERPRISE' } });
      // The two workers race for the jobs: on a loaded machine the one started first can lease a
      // whole wave before the cut-off worker's first lease. Another wave until the cut-off worker
      // holds calls (each wave's domains its own, so a job's calls are still told apart).
      for (let wave = 0; cutCounter.inFlight() < 3; wave++) {
        assert.ok(wave < 5, 'the cut-off worker held calls within five waves of 60 jobs');
        await submitUnique(other.url!, createTenant.apiKey, `split${wave}-`, 60);
        await eventually(async () => cutCounter.inFlight() >= 3, 10_000, 10).catch(() => {});
      }
      linked.cut();
      const cutAt = performance.now();
      const [{ at: cutDb }] = (await check`select clock_timestamp() as at`) as unknown as [{ at: Date }];
      const heldCalls = cutCounter.calls.filter((c) => c.endedAt === null);
      debug(`cut off with ${heldCalls.length} calls in flight`);

      // The other worker finishes every job, the cut-off worker's too once their leases expire.
      await eventually(async () => {
        const [r] = await check`select count(*)::int as n from jobs where state <> 'SUCCEEDED'`;
        return r!.n === 0;
      }, 60_000, 200);
      // A call may leave just after the cut when its lease and its sent mark committed before it
      // (the mark is the last statement before the request): it was the node's already. No other.
      const late = cutCounter.calls.filter((c) => c.startedAt > cutAt);
      for (const c of late) {
        const domain = new URL(c.target, 'http://x').searchParams.get('domain');
        const [m] = await check`select count(*)::int as n from reservations r join jobs j on j.id = r.job_id
          where j.params->>'domain' = ${domain} and (select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))) <= ${cutDb}`;
        assert.equal(m!.n, 1, `the cut-off worker started no call it had not marked sent before the cut (${c.target})`);
      }
      heldCalls.push(...late);
      linked.heal();
      // Back: its answers find their reservations settled by expiry and are reconciled.
      await eventually(async () => {
        const [r] = await check`select count(*)::int as n from reservations r where r.outcome in ('node_lost', 'never_sent') and (select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))) is not null and r.reconciled_at is null`;
        return r!.n === 0;
      }, 30_000, 200);

      assert.ok(heldCalls.length >= 3, 'calls were in flight when the worker was cut off');
      assert.deepEqual(heldCalls.filter((c) => !c.delivered).map((c) => c.target), [], 'each call in flight ran to its answer: none was cut short');
      const byTarget = new Map<string, typeof heldCalls>();
      for (const c of [...rig.counter.calls, ...cutCounter.calls]) byTarget.set(c.target, [...(byTarget.get(c.target) ?? []), c]);
      const overlapping: string[] = [];
      for (const [target, calls] of byTarget) {
        calls.sort((a, b) => a.startedAt - b.startedAt);
        for (let i = 1; i < calls.length; i++) if (calls[i]!.startedAt < (calls[i - 1]!.endedAt ?? Infinity)) overlapping.push(target);
      }
      assert.deepEqual(overlapping, [], 'never two calls of one job at once');
      const held = new Set(heldCalls.map((c) => c.target));
      const twice = [...byTarget].filter(([, calls]) => calls.length > 1).map(([t]) => t);
      assert.deepEqual(twice.filter((t) => !held.has(t)), [], 'only jobs whose call the cut-off worker held ran again');
      const [ledger] = await check`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
      assert.equal(ledger!.n, rig.sim.stats().totals.creditsBilled, "the tenant's ledger equals the provider's bill");
      await assertJobsAccountedFor(check);
      await assertQuiescent(check);
      await assertLedgerBalances(check);
    } finally {
      await check.end();
      await cutCounter.stop();
      await linked.stop();
    }
  });
});
