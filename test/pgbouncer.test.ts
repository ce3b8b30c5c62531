/**
 * Sluice behind PgBouncer in transaction pool mode (Debian's pgbouncer, its
 * defaults but for the sizes): two API processes and two workers with
 * DATABASE_URL at PgBouncer and DATABASE_DIRECT_URL at Postgres, and no other
 * database setting. The whole path runs (create a tenant, submit, dispatch, a
 * subscription on the other API node sees the workers' results, a key rotated
 * on one node closes its sockets on the other, each job's completion webhook
 * sent by the workers' sender threads over their own pooled connections) with
 * no error in any node's log. The only operator step is the documented one: the timeouts as the
 * role's defaults (docs/SCALING.md), which startup parameters cannot carry
 * through a pooler.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { connectDedicated, DEFAULT_TIMEOUTS, sessionTimeouts, timeoutStatements } from '../src/db/client.ts';
import { adminUrl, createTestDatabase } from './helpers/db.ts';
import { eventually } from './helpers/app.ts';
import { gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';
import { startPgBouncer, type PgBouncer } from './helpers/pgbouncer.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';
import { connected, watch, type Watched } from './helpers/ws-watch.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const KEYS = `query($id: ID!) { apiKeys(tenantId: $id) { id name } }`;
const CREATE_HOOK = `mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { endpoint { id } } }`;
const REVOKE = `mutation($id: ID!) { revokeApiKey(id: $id) { id revokedAt } }`;

/** Lines a node logged at error level or above (pino: 50 error, 60 fatal), or about prepared statements or startup parameters. */
function errorLines(node: NodeProcess): string[] {
  return node.logs.filter((l) => /"level":(50|60)|prepared statement|startup parameter/.test(l));
}

// Four node processes start (and compile) at once: on a loaded 2-core machine that alone has taken
// over 100 s, past the runner's default of 120 s for the whole file.
describe('behind PgBouncer in transaction mode, with a direct connection for sessions', { timeout: 300_000 }, () => {
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  let sim: Simulator;
  let bouncer: PgBouncer;
  const nodes: NodeProcess[] = [];
  let a: NodeProcess;
  let b: NodeProcess;
  const watched: Watched[] = [];
  // The webhook receiver: the jobs' ids its deliveries named.
  const hooked = new Set<string>();
  let receiver: http.Server;

  before(async () => {
    receiver = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        hooked.add(JSON.parse(Buffer.concat(chunks).toString()).data.id);
        res.writeHead(204).end();
      });
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 2, onnotice: () => {} });
    // The operator's one step (docs/SCALING.md): the timeouts as this role's defaults in this database.
    const shown = await sessionTimeouts(sql);
    for (const statement of timeoutStatements(shown.role, shown.database, DEFAULT_TIMEOUTS, shown.timeouts)) await sql.unsafe(statement);
    bouncer = await startPgBouncer(adminUrl(), { poolSize: 20 });
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 50, latencyP95Ms: 100, concurrentCalls: 50, seed: 11 });
    const env = {
      DATABASE_URL: bouncer.urlFor(db.url),
      DATABASE_DIRECT_URL: db.url,
      DB_POOL_MAX: '4',
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: '6000',
      APIVERVE_CONCURRENT_CALLS: '50',
      // pg-boss's maintenance and retention (the session advisory locks) run during the test.
      BOSS_SUPERVISE_INTERVAL_SECONDS: '1',
      RETENTION_INTERVAL_SECONDS: '1',
      SWEEP_INTERVAL_MS: '200',
      // Each worker serves /metrics on a port of its own.
      METRICS_PORT: '0',
      // The receiver is on loopback, over plain http.
      WEBHOOK_ALLOW_PRIVATE: 'true',
      WEBHOOK_POLL_MS: '200',
    };
    // All four start at once: the migrations run on one of them, under the migration lock (a
    // session advisory lock, on the direct connection), while the others wait for it.
    const start = (role: 'api' | 'worker') => startNode(role, env, { readyTimeoutMs: 120_000 });
    const started = await Promise.all([start('api'), start('api'), start('worker'), start('worker')]);
    nodes.push(...started);
    [a, b] = started;
  });
  after(async () => {
    await Promise.all(watched.map((w) => w.client.dispose()));
    await Promise.all(nodes.map((n) => n.stop('SIGKILL')));
    await bouncer?.stop();
    await sql?.end();
    await sim?.stop();
    await db?.drop();
    receiver?.closeAllConnections();
    await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
  });

  test('a pooled connection never pipelines: a query sent behind another is answered, and transactions run', async () => {
    // One connection; a parameterless query, then a parameterized one issued a moment later, while
    // the first is in flight. postgres.js would pipeline the second; PgBouncer (transaction mode)
    // hands the server back at the first one's ReadyForQuery and drops the second one's replies
    // ("got packet '1' from server when not linked"), and the second waits forever.
    const pooled = connectDedicated(bouncer.urlFor(db.url), { max: 1, pooler: true });
    const pause = [() => Promise.resolve(), () => new Promise((r) => setImmediate(r)), () => new Promise((r) => setTimeout(r, 0)), () => new Promise((r) => setTimeout(r, 1))];
    try {
      for (let i = 0; i < 40; i++) {
        let timer: NodeJS.Timeout | undefined;
        const hung = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`round ${i}: a pooled query got no answer in 5 s`)), 5_000)));
        const first = pooled`select 1 as n`;
        await pause[i % pause.length]!();
        const second = pooled`select ${i}::int as n`;
        const inTx = pooled.begin(async (tx) => (await tx`select ${i + 1}::int as n`)[0]!.n as number);
        const [a, b, c] = await Promise.race([Promise.all([first, second, inTx]), hung]).finally(() => clearTimeout(timer));
        assert.deepEqual([a[0]!.n, b[0]!.n, c], [1, i, i + 1]);
      }
    } finally {
      await pooled.end({ timeout: 1 });
    }
  });

  test('two API nodes and two workers run the whole path through the pooler, with no error in their logs', async () => {
    const { createTenant } = await gqlAt(a.url!, CREATE, { i: { name: 'pooled', tier: 'PRO' } });
    const tenant = { id: createTenant.tenant.id as string, apiKey: createTenant.apiKey as string };

    const port = (receiver.address() as AddressInfo).port;
    await gqlAt(a.url!, CREATE_HOOK, { i: { url: `http://127.0.0.1:${port}/hook`, events: ['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED'] } }, tenant.apiKey);

    // Results are subscribed on B; the jobs are submitted on A and run on the workers.
    const completed = watch(b.url!, tenant.apiKey, 'subscription { jobsCompleted { id state } }');
    const usage = watch(b.url!, tenant.apiKey, 'subscription { tenantUsage { usage { quota } } }');
    watched.push(completed, usage);
    await connected(usage);
    await eventually(async () => completed.acknowledged, 20_000, 20);
    const submitted = await gqlAt(
      a.url!,
      SUBMIT_MANY,
      { i: { jobs: Array.from({ length: 40 }, (_, i) => ({ api: 'dnslookup', params: { domain: `p${i}.example` } })) } },
      tenant.apiKey,
    );
    const ids = new Set<string>(submitted.submitJobs.jobs.map((j: { id: string }) => j.id));
    assert.equal(ids.size, 40);
    await eventually(async () => {
      const seen = new Set(completed.events.map((e) => (e as { data?: { jobsCompleted?: { id: string } } }).data?.jobsCompleted?.id));
      return [...ids].every((id) => seen.has(id));
    }, 60_000, 100);
    const states = await assertJobsAccountedFor(sql);
    assert.equal(states.SUCCEEDED, 40, `every job ran: ${JSON.stringify(states)}`);
    await eventually(async () => {
      const [row] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return row!.n === 0;
    }, 10_000);
    await assertLedgerBalances(sql);
    await assertQuiescent(sql);
    assert.equal(sim.stats().keys[sim.apiKey]!.calls, 40, 'one upstream call per job');
    // The workers' sender threads claimed and recorded through the pooler (no prepared statements there).
    await eventually(async () => [...ids].every((id) => hooked.has(id)), 30_000, 100);

    // The key revoked on A: B's sockets of that key close (the notice reached B's LISTEN).
    const { apiKeys } = await gqlAt(a.url!, KEYS, { id: tenant.id });
    assert.equal(apiKeys.length, 1);
    await gqlAt(a.url!, REVOKE, { id: apiKeys[0].id });
    for (const w of [completed, usage]) {
      await eventually(async () => w.closed, 10_000, 20);
      assert.equal(w.closed!.code, 4401, JSON.stringify(w.closed));
    }

    // The pooled work went through PgBouncer: its transactions were counted there.
    const stats = await bouncer.show('stats');
    const ours = stats.find((s) => s.database === new URL(db.url).pathname.slice(1));
    assert.ok(ours && Number(ours.total_xact_count) > 100, `PgBouncer carried the transactions: ${JSON.stringify(ours)}`);
    // The pooled connections run with the configured timeouts (the role's defaults, not startup parameters).
    const pooled = postgres(bouncer.urlFor(db.url), { max: 1, prepare: false, onnotice: () => {} });
    try {
      assert.deepEqual((await sessionTimeouts(pooled)).timeouts, DEFAULT_TIMEOUTS);
    } finally {
      await pooled.end();
    }
    // pg-boss's maintenance found its leader (its session lock on a direct connection): queue stats were written.
    await eventually(async () => {
      const [row] = await sql`select count(*)::int as n from pgboss.queue where name like ${`t.${tenant.id}.%`} and total_count > 0`;
      return row!.n > 0;
    }, 30_000, 200);

    for (const node of nodes) assert.deepEqual(errorLines(node), [], `node ${node.pid} logged errors`);
    assert.deepEqual(
      nodes.flatMap((n) => n.logs.filter((l) => /timeouts/.test(l))),
      [],
      'with the role defaults set, no node warns about the timeouts',
    );
  });
});
