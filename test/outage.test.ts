/**
 * Postgres killed (SIGKILL, as a crash would) and restarted mid-run, under a
 * real Sluice process (`node src/main.ts`) with calls in flight, submissions
 * arriving and a subscriber listening:
 *  - the process lives;
 *  - while Postgres is down every request is answered, fast, with 503
 *    DATABASE_UNAVAILABLE and Retry-After (never a 500, never a hang);
 *  - a submission that was answered with an error is not stored;
 *  - after recovery dispatch resumes by itself, every accepted job runs
 *    exactly once (the provider's call count equals the jobs), nothing stays
 *    reserved, and the subscriber receives every job's final event.
 * The outage timeline (down, answering 503, recovered, drained) is printed.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { ensureDatabase } from '../src/db/client.ts';
import { startEmbeddedPostgres, type EmbeddedDatabase } from '../src/db/embedded.ts';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually } from './helpers/app.ts';
import { crashTestEnv, gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';


const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const CURRENCIES = ['EUR', 'GBP', 'JPY', 'CHF', 'CAD', 'AUD'];

async function post(url: string, key: string, query: string, variables: Record<string, unknown>) {
  const started = performance.now();
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify({ query, variables }) });
  const body: any = await res.json().catch(() => null);
  return { status: res.status, retryAfter: res.headers.get('retry-after'), body, ms: performance.now() - started };
}

const debug = (msg: string) => {
  if (process.env.TEST_DEBUG) console.error(`[outage ${new Date().toISOString()}] ${msg}`);
};

function postmasterPid(dataDir: string): number {
  return Number(readFileSync(path.join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
}

describe('Postgres killed and restarted mid-run', () => {
  let dir: string;
  let dataDir: string;
  let port: number;
  let pg: EmbeddedDatabase | null = null;
  let sim: Simulator;
  let node: NodeProcess | null = null;
  let ws: Client | null = null;

  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'sluice-outage-'));
    chmodSync(dir, 0o755); // as root, Postgres runs as `postgres` and must enter the folder
    dataDir = path.join(dir, 'pg');
    pg = await startEmbeddedPostgres(dataDir); // its port, kept for the restart
    port = pg.port;
    await ensureDatabase(pg.url, 'sluice');
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 300, latencyP95Ms: 600, concurrentCalls: 100, seed: 5 });
  });
  after(async () => {
    if (process.env.TEST_DEBUG && node) console.error(node.logs.slice(-60).join('\n'));
    await ws?.dispose();
    await node?.stop('SIGKILL');
    await sim.stop();
    await pg?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test('the process lives, answers 503 DATABASE_UNAVAILABLE meanwhile, then every accepted job runs once and every event arrives', async (t) => {
    const databaseUrl = pg!.urlFor('sluice');
    // The attempt lease (2 s) is a fraction of the outage (10-20 s): known outcomes wait through it and
    // land after recovery, before any sweep may expire their leases (calls take ≤ 0.6 s, under ¾ of it).
    node = await startNode('all', crashTestEnv(sim, databaseUrl, 6000, { BATCH_MAX: '1', REQUEST_TIMEOUT_MS: '3000', NODE_TIMEOUT_SECONDS: '30', ATTEMPT_LEASE_SECONDS: '2', DISPATCH_IDLE_POLL_MS: '200' }));
    const url = node.url!;
    const { createTenant } = await gqlAt(url, CREATE, { i: { name: 'outage', tier: 'PRO' } });
    const key = createTenant.apiKey as string;

    // A subscriber that must see every job finish, outage or not.
    const completed = new Set<string>();
    ws = createClient({ url: url.replace(/^http/, 'ws'), webSocketImpl: WebSocket, connectionParams: { authorization: `Bearer ${key}` }, retryAttempts: 0, lazy: false });
    const subscriptionErrors: unknown[] = [];
    ws.subscribe<{ jobsCompleted: { id: string } }>({ query: 'subscription { jobsCompleted { id state } }' }, {
      next: (v) => {
        if (v.data) completed.add(v.data.jobsCompleted.id);
      },
      error: (e) => void subscriptionErrors.push(e),
      complete: () => {},
    });
    await new Promise((r) => setTimeout(r, 300)); // the subscription is registered before work starts (no wall-clock assertion)

    // Submissions in batches with idempotency keys; an error answer is retried with the same keys.
    const accepted = new Set<string>();
    let batchNo = 0;
    const batch = (n: number) => ({ i: { jobs: Array.from({ length: 10 }, (_, k) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: CURRENCIES[(n + k) % 6] }, idempotencyKey: `b${n}-${k}` })) } });
    const submit = async (n: number) => {
      const r = await post(url, key, SUBMIT_MANY, batch(n));
      if (r.status === 200 && r.body?.data?.submitJobs) {
        for (const j of r.body.data.submitJobs.jobs) accepted.add(j.id);
        return r;
      }
      return r;
    };
    for (; batchNo < 6; batchNo++) assert.equal((await submit(batchNo)).status, 200);

    // Calls in flight, then the crash.
    const sql = postgres(databaseUrl, { max: 1, onnotice: () => {} });
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return r!.n >= 2;
    }, 30_000, 10);
    await sql.end();
    const t0 = performance.now();
    debug('killing postmaster');
    const timeline: Record<string, number> = {};
    process.kill(postmasterPid(dataDir), 'SIGKILL');
    timeline.killedAt = 0;

    // While it is down: every request answered, 503 DATABASE_UNAVAILABLE with Retry-After, never a 500.
    const outageAnswers: Array<{ status: number; code: string | undefined; ms: number }> = [];
    const refusedUnkeyed: string[] = [];
    for (let i = 0; i < 8; i++) {
      const sub = await submit(batchNo);
      outageAnswers.push({ status: sub.status, code: sub.body?.errors?.[0]?.extensions?.code, ms: sub.ms });
      if (sub.status === 200) batchNo++; // Postgres not down yet from this connection's view
      // A submission without an idempotency key, answered with an error: it must not be stored.
      const domain = `outage-${i}.example`;
      const bare = await post(url, key, SUBMIT_MANY, { i: { jobs: [{ api: 'dnslookup', params: { domain } }] } });
      outageAnswers.push({ status: bare.status, code: bare.body?.errors?.[0]?.extensions?.code, ms: bare.ms });
      if (bare.status !== 200) refusedUnkeyed.push(domain);
      const read = await post(url, key, '{ me { usage { creditsUsed } } jobs(first: 1) { totalCount } }', {});
      outageAnswers.push({ status: read.status, code: read.body?.errors?.[0]?.extensions?.code, ms: read.ms });
      for (const r of [sub, bare, read]) {
        if (r.status !== 200) {
          assert.equal(r.status, 503, JSON.stringify(r.body));
          assert.equal(r.body?.errors?.[0]?.extensions?.code, 'DATABASE_UNAVAILABLE', JSON.stringify(r.body));
          assert.ok(Number(r.retryAfter) >= 1, 'Retry-After says when to come back');
          timeline.first503At ??= performance.now() - t0;
        }
      }
      assert.equal(node.child.exitCode, null, 'the process is alive');
      await new Promise((r) => setTimeout(r, 500));
    }
    timeline.last503At = performance.now() - t0;
    debug(`outage answers: ${JSON.stringify(outageAnswers)}`);
    assert.ok(outageAnswers.filter((a) => a.status === 503).length >= 12, `most requests in the outage got 503: ${JSON.stringify(outageAnswers)}`);
    assert.ok(outageAnswers.every((a) => a.status === 200 || a.status === 503), JSON.stringify(outageAnswers));

    // Postgres comes back (crash recovery), on the same port.
    pg = await startEmbeddedPostgres(dataDir, () => {}, { port });
    timeline.restartedAt = performance.now() - t0;
    debug('restarted');
    await eventually(async () => (await post(url, key, '{ me { usage { creditsUsed } } }', {})).status === 200, 60_000, 100);
    timeline.recoveredAt = performance.now() - t0;
    debug('recovered');

    // The rest of the submissions (retrying any refused batch with the same keys), then the drain.
    for (let tries = 0; batchNo < 12 && tries < 200; tries++) {
      const r = await submit(batchNo);
      if (r.status === 200) batchNo++;
      else await new Promise((res) => setTimeout(res, 200));
    }
    const check = postgres(databaseUrl, { max: 2, onnotice: () => {} });
    debug(`batches done: ${batchNo}`);
    try {
      await eventually(async () => {
        const [r] = await check`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
        return r!.n === 0;
      }, 120_000, 200);
      timeline.drainedAt = performance.now() - t0;
    debug('drained');
      await eventually(async () => completed.size >= accepted.size, 30_000, 100).catch(() => {});
      timeline.eventsDeliveredAt = performance.now() - t0;

      const [stored] = await check`select count(*)::int as n from jobs`;
      const [unkeyed] = await check`select count(*)::int as n from jobs where params->>'domain' = any(${refusedUnkeyed}::text[])`;
      console.log(JSON.stringify({ outage: { timelineMs: Object.fromEntries(Object.entries(timeline).map(([k, v]) => [k, Math.round(v)])), answersDuringOutage: outageAnswers.length, status503: outageAnswers.filter((a) => a.status === 503).length, slowest503Ms: Math.round(Math.max(...outageAnswers.filter((a) => a.status === 503).map((a) => a.ms))), accepted: accepted.size, stored: stored!.n, providerCalls: sim.stats().totals.calls, eventsReceived: completed.size, subscriptionErrors: subscriptionErrors.length } }));

      // Every check runs and reports, so one run shows the whole picture; then all must hold.
      const checks: Array<[string, () => unknown | Promise<unknown>]> = [
        ['the process lived through it', () => assert.equal(node!.child.exitCode, null)],
        ['every batch was eventually accepted', () => assert.equal(batchNo, 12)],
        ['no submission answered with an error was stored', () => assert.equal(unkeyed!.n, 0)],
        ['the jobs stored are exactly the jobs accepted', () => assert.equal(stored!.n, accepted.size)],
        ['every accepted job succeeded, once, with its result', async () => assert.equal((await assertJobsAccountedFor(check)).SUCCEEDED, accepted.size)],
        ['the subscription survived the outage', () => assert.deepEqual(subscriptionErrors, [])],
        ["the subscriber got every job's final event", () => assert.deepEqual([...accepted].filter((id) => !completed.has(id)), [])],
        ['every accepted job ran exactly once (provider calls == jobs)', () => assert.equal(sim.stats().totals.calls, accepted.size)],
        ['nothing stays reserved', () => assertQuiescent(check)],
        ['the ledger balances', () => assertLedgerBalances(check)],
      ];
      const failed: string[] = [];
      for (const [name, fn] of checks) {
        try {
          await fn();
        } catch (err) {
          const line = `${name}: ${(err as Error).message.split('\n')[0]}`;
          failed.push(line);
        }
      }
      console.log(JSON.stringify({ outageChecks: { passed: checks.length - failed.length, failed } }));
      assert.deepEqual(failed, []);
    } finally {
      await check.end();
    }
  });
});
