/**
 * `npm run bench -- fanout`: graphql-ws subscribers on
 * `jobsCompleted`, one job per tenant, every event must arrive.
 *
 * Phases (each on a fresh database and a fresh Sluice child, role all):
 *  - 1,000 subscribers = 200 tenants × 5 (the shape measured on main: p50 102 ms, p99 433 ms from finishedAt);
 *  - 5,000 subscribers = 1,000 tenants × 5 (`--large-tenants`).
 * `--warm`: one job per tenant first, finished before the subscribers connect, so every pool
 * connection of the fresh child has settled once (what a long-running process looks like).
 * Each subscriber is its own WebSocket from the bench process. Once all are
 * connected and idle, the Sluice child's VmRSS is compared with its RSS
 * before they connected: memory per idle subscriber. Then one job per tenant
 * is submitted (MEGA plan, 20 ms simulator latency, so dispatch is not the
 * bottleneck) and each receipt is timed two ways:
 *  - from COMMIT (the target): a separate process of the bench
 *    (lib/commit-listener.ts) LISTENs on the job events channel; Postgres
 *    delivers a NOTIFY at its transaction's commit, so the moment the job's
 *    final-state notification reaches it is the commit (+ one loopback hop).
 *  - from the job's finishedAt (kept for comparison with main's figure):
 *    now() of the settling transaction, stamped before the settlement's own
 *    work and its commit, so it also counts settlement time.
 */
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import postgres from 'postgres';
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { gql } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter, rssMb } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor, type MemoryReport } from './lib/sluice.ts';
import { check, mapLimit, median, percentile, round, sleep, type Check } from './lib/stats.ts';

export const description = 'graphql-ws fan-out: 200 tenants x 5 and 1,000 x 5 subscribers on jobsCompleted, one job per tenant: delivery, commit-to-receipt p50/p99, memory per idle subscriber';

/** The commit stamps of final-state notifications, from a LISTEN in its own process (lib/commit-listener.ts). */
async function commitListener(databaseUrl: string) {
  const commits = new Map<string, { at: number; carriesRow: boolean }>();
  const childEnv: Record<string, string> = { DATABASE_URL: databaseUrl };
  for (const k of ['PATH', 'HOME', 'TMPDIR', 'LANG', 'TZ']) if (process.env[k] !== undefined) childEnv[k] = process.env[k]!;
  const child = fork(fileURLToPath(new URL('./lib/commit-listener.ts', import.meta.url)), [], { env: childEnv, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`the commit listener exited with ${code}`)));
    child.on('message', (m: { type: string; jobId: string; at: number; carriesRow: boolean }) => {
      if (m.type === 'listening') resolve();
      else if (m.type === 'commit' && !commits.has(m.jobId)) commits.set(m.jobId, { at: m.at, carriesRow: m.carriesRow });
    });
  });
  return {
    commits,
    stop: () =>
      new Promise<void>((resolve) => {
        child.removeAllListeners('exit');
        child.once('exit', () => resolve());
        child.send({ type: 'stop' });
        setTimeout(() => child.kill('SIGKILL'), 5_000).unref();
      }),
  };
}

/**
 * When the simulator wrote each tenant's answer (bench clock), from its call log: the job of tenant
 * i looks up `t<i>.example.com`; a job called more than once (a retry) counts its last answer.
 */
function answersByTenant(sim: Simulator, tenants: number): Map<number, number> {
  const out = new Map<number, number>();
  for (let since = 0; ; ) {
    const page = sim.calls(since, 10_000);
    for (const c of page.calls) {
      const m = /^t(\d+)\.example\.com$/.exec(String(c.params.domain ?? ''));
      const tenant = m ? Number(m[1]) : -1;
      if (tenant < 0 || tenant >= tenants || c.answeredAtMs === null) continue;
      out.set(tenant, Math.max(out.get(tenant) ?? 0, c.answeredAtMs));
    }
    if (page.calls.length === 0) return out;
    since = page.next;
  }
}

function roundMem(m: MemoryReport) {
  return { rss: round(m.rssMb, 1), heapUsed: round(m.heapUsedMb, 1), external: round(m.externalMb, 1) };
}

function perSubscriberKb(before: MemoryReport, after: MemoryReport, n: number) {
  const kb = (a: number, b: number) => round(((b - a) * 1024) / n, 1);
  return { heapUsed: kb(before.heapUsedMb, after.heapUsedMb), external: kb(before.externalMb, after.externalMb), rss: kb(before.rssMb, after.rssMb) };
}

async function phase(pg: BenchPostgres, tenants: number, perTenant: number, mode: 'child' | 'inproc', extraEnv: Record<string, string>, o: { waitS: number; warm: boolean }) {
  const label = `${tenants}x${perTenant}`;
  const db = await freshDatabase(pg.adminUrl, `fanout_${tenants}`);
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const clients: Client[] = [];
  let listener: Awaited<ReturnType<typeof commitListener>> | null = null;
  try {
    // The call log stamps each answer as the simulator writes it: the provider's answer, on the bench's clock.
    sim = await startSimulator({ plan: 'MEGA', concurrentCalls: 500, latencyMs: 20, latencyP95Ms: 60, seed: 1, credits: 100_000_000, maxCredits: 100_000_000, callLog: true });
    sluice = await startSluiceFor(
      { DATABASE_URL: db.url, APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_PLAN: 'MEGA', APIVERVE_CONCURRENT_CALLS: '500', ...extraEnv },
      mode,
    );
    const url = sluice.url!;
    progress(`[fanout ${label}] Sluice (${sluice.mode}, pid ${sluice.pid}) at ${url}; creating ${tenants} tenants`);
    const keys = await mapLimit(Array.from({ length: tenants }, (_, i) => i), 8, async (i) => {
      const r = await gql<{ createTenant: { apiKey: string } }>(url, ADMIN_TOKEN, 'mutation($i: CreateTenantInput!) { createTenant(input: $i) { apiKey } }', { i: { name: `fanout-${i}`, tier: 'PRO' } });
      return r.createTenant.apiKey;
    });
    if (o.warm) {
      // One job per tenant first, finished before anyone subscribes: Sluice's pool connections have
      // each run the settlement once (Postgres plans a PL/pgSQL function's statements per connection).
      progress(`[fanout ${label}] warm-up: one job per tenant`);
      await mapLimit(keys, 20, (key, i) => gql(url, key, 'mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }', { i: { api: 'dnslookup', params: { domain: `w${i}.example.com` }, priority: 'INTERACTIVE' } }));
      const wsql = postgres(db.url, { max: 1, onnotice: () => {} });
      try {
        for (const until = Date.now() + o.waitS * 1000; Date.now() < until; await sleep(250)) {
          if (Number((await wsql`select count(*) from jobs where state in ('SUCCEEDED', 'FAILED')`)[0]!.count) >= tenants) break;
        }
      } finally {
        await wsql.end({ timeout: 2 }).catch(() => {});
      }
    }
    await sleep(1_000);
    const memBefore = await sluice.memory();
    const rssBefore = rssMb(sluice.pid);

    // Subscribers: one socket each.
    const receipts: Array<{ tenant: number; at: number; finishedAt: number; id: string }> = [];
    let errors = 0;
    let connected = 0;
    const wsUrl = url.replace(/^http/, 'ws');
    await mapLimit(Array.from({ length: tenants * perTenant }, (_, i) => i), 50, async (i) => {
      const tenant = Math.floor(i / perTenant);
      const client = createClient({ url: wsUrl, webSocketImpl: WebSocket, connectionParams: { authorization: `Bearer ${keys[tenant]}` }, retryAttempts: 0, lazy: false });
      clients.push(client);
      await new Promise<void>((resolve, reject) => {
        client.on('connected', () => resolve());
        client.on('closed', () => reject(new Error('closed before connected')));
      });
      connected++;
      client.subscribe<{ jobsCompleted: { id: string; finishedAt: string } }>(
        { query: 'subscription { jobsCompleted { id finishedAt } }' },
        {
          next: (v) => receipts.push({ tenant, at: Date.now(), finishedAt: Date.parse(v.data!.jobsCompleted.finishedAt), id: v.data!.jobsCompleted.id }),
          error: () => errors++,
          complete: () => {},
        },
      );
    });
    // Let every subscribe message be processed and the process settle (GC) before measuring idle memory.
    await sleep(5_000);
    const memIdle = await sluice.memory();
    const rssIdle = rssMb(sluice.pid);
    progress(`[fanout ${label}] ${connected} subscribers connected; after GC: RSS ${round(memBefore?.rssMb ?? rssBefore ?? 0, 1)} → ${round(memIdle?.rssMb ?? rssIdle ?? 0, 1)} MB, heap ${round(memBefore?.heapUsedMb ?? 0, 1)} → ${round(memIdle?.heapUsedMb ?? 0, 1)} MB; submitting one job per tenant`);

    listener = await commitListener(db.url);
    const cpu = cpuMeter();
    const started = Date.now();
    await mapLimit(keys, 20, (key, i) =>
      gql(url, key, 'mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }', { i: { api: 'dnslookup', params: { domain: `t${i}.example.com` }, priority: 'INTERACTIVE' } }),
    );
    const expected = tenants * perTenant;
    // Every job must finish (dispatch of one job per tenant can be slow on a crowded machine); then
    // every subscriber must have its tenant's event. Delivery is judged on the jobs that finished.
    const sql = postgres(db.url, { max: 1, onnotice: () => {} });
    let jobsFinished = 0;
    const deadline = Date.now() + o.waitS * 1000;
    try {
      while (Date.now() < deadline) {
        jobsFinished = Number((await sql`select count(*) from jobs where state in ('SUCCEEDED', 'FAILED')`)[0]!.count) - (o.warm ? tenants : 0);
        if (jobsFinished >= tenants && receipts.length >= expected) break;
        await sleep(250);
      }
      if (receipts.length < jobsFinished * perTenant) await sleep(5_000); // the last events' grace
    } finally {
      await sql.end({ timeout: 2 }).catch(() => {});
    }
    const busy = cpu.end();
    const { commits } = listener;
    const answers = answersByTenant(sim, tenants);
    const fromFinishedAt = receipts.map((r) => r.at - r.finishedAt);
    const fromCommit = receipts.filter((r) => commits.has(r.id)).map((r) => r.at - commits.get(r.id)!.at);
    const dist = (xs: number[]) => (xs.length ? { p50: round(median(xs), 1), p99: round(percentile(xs, 99), 1), max: round(Math.max(...xs), 1) } : null);
    // The three stamps of each job (the answer, its settlement's commit, each receipt) and finishedAt between the first two.
    const jobs = new Map<string, { answer: number | undefined; finishedAt: number; commit: number | undefined }>();
    for (const r of receipts) if (!jobs.has(r.id)) jobs.set(r.id, { answer: answers.get(r.tenant), finishedAt: r.finishedAt, commit: commits.get(r.id)?.at });
    const perJob = (f: (j: { answer: number; finishedAt: number; commit: number }) => number) =>
      [...jobs.values()].filter((j): j is { answer: number; finishedAt: number; commit: number } => j.answer !== undefined && j.commit !== undefined).map(f);
    const stages = {
      answerToFinishedAtMs: dist(perJob((j) => j.finishedAt - j.answer)),
      finishedAtToCommitMs: dist(perJob((j) => j.commit - j.finishedAt)),
      answerToCommitMs: dist(perJob((j) => j.commit - j.answer)),
      commitToReceiptMs: dist(fromCommit),
      answerToReceiptMs: dist(receipts.filter((r) => answers.has(r.tenant)).map((r) => r.at - answers.get(r.tenant)!)),
    };
    const perTenantReceived = new Map<number, number>();
    for (const r of receipts) perTenantReceived.set(r.tenant, (perTenantReceived.get(r.tenant) ?? 0) + 1);
    const result = {
      subscribers: expected,
      tenants,
      perTenant,
      connected,
      jobsFinished,
      delivered: receipts.length,
      deliveredOfFinished: `${receipts.length} of ${jobsFinished * perTenant}`,
      subscriptionErrors: errors,
      tenantsFullyServed: [...perTenantReceived.values()].filter((n) => n === perTenant).length,
      latencyMs: dist(fromCommit),
      stages,
      receiptsWithoutCommitStamp: receipts.length - fromCommit.length,
      latencyFromFinishedAtMs: dist(fromFinishedAt),
      finalNotificationsCarryingRow: `${[...commits.values()].filter((c) => c.carriesRow).length} of ${commits.size}`,
      rssMb: { beforeSubscribers: rssBefore === null ? null : round(rssBefore, 1), idleSubscribed: rssIdle === null ? null : round(rssIdle, 1) },
      memoryAfterGcMb: memBefore && memIdle ? { before: roundMem(memBefore), idleSubscribed: roundMem(memIdle) } : null,
      // Per idle subscriber, after a full GC on both sides: the JS heap (the subscription, its
      // iterator, graphql-ws state), off-heap buffers, and the process's RSS (adds the socket's
      // native buffers; the allocator keeps freed pages, so RSS is the noisier one).
      memoryPerIdleSubscriberKb: memBefore && memIdle ? perSubscriberKb(memBefore, memIdle, expected) : rssBefore !== null && rssIdle !== null ? { rss: round(((rssIdle - rssBefore) * 1024) / expected, 1) } : null,
      wallS: round((Date.now() - started) / 1000, 1),
      machineCpuBusy: busy,
    };
    const pp = (d: { p50: number; p99: number } | null) => (d ? `p50 ${d.p50} / p99 ${d.p99} ms` : 'n/a');
    progress(
      `[fanout ${label}] delivered ${result.delivered}/${expected}; answer → commit ${pp(stages.answerToCommitMs)} (answer → finishedAt ${pp(stages.answerToFinishedAtMs)}, finishedAt → commit ${pp(stages.finishedAtToCommitMs)}); commit → receipt ${pp(stages.commitToReceiptMs)}; finishedAt → receipt ${pp(result.latencyFromFinishedAtMs)}; answer → receipt ${pp(stages.answerToReceiptMs)}`,
    );
    return result;
  } finally {
    await Promise.all(clients.map((c) => c.dispose()));
    if (listener) await listener.stop();
    if (sluice) await sluice.stop().catch(() => null);
    if (sim) await sim.stop();
    await db.drop();
  }
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const small = flags.number('tenants', 200);
  const large = flags.number('large-tenants', 1_000);
  const perTenant = flags.number('per-tenant', 5);
  const waitS = flags.number('wait', 300);
  const warm = flags.bool('warm');
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const phases = [await phase(pg, small, perTenant, mode, extraEnv, { waitS, warm })];
  if (large > 0) phases.push(await phase(pg, large, perTenant, mode, extraEnv, { waitS, warm }));
  const targets: Record<string, Check> = {};
  for (const p of phases) {
    const k = `s${p.subscribers}`;
    targets[`${k}_allDelivered`] = check(p.delivered, `== ${p.subscribers} (every job finished, every subscriber got its event)`, p.delivered === p.subscribers && p.subscriptionErrors === 0);
    targets[`${k}_p99Ms`] = check(p.latencyMs?.p99 ?? null, '< 50 ms (commit to receipt)', p.latencyMs ? p.latencyMs.p99 < 50 : false);
    targets[`${k}_p99FromFinishedAtMs`] = check(p.latencyFromFinishedAtMs?.p99 ?? null, '< 50 ms (finishedAt to receipt)', p.latencyFromFinishedAtMs ? p.latencyFromFinishedAtMs.p99 < 50 : false);
    const mem = p.memoryPerIdleSubscriberKb;
    targets[`${k}_memoryPerIdleSubscriberKb`] = check(mem ? mem.rss : null, 'reported (RSS growth after a full GC, per subscriber; heap and off-heap in the phase)', null);
  }
  return {
    summary: Object.fromEntries(
      phases.map((p) => [
        `s${p.subscribers}`,
        {
          delivered: p.delivered,
          latencyFromCommitMs: p.latencyMs,
          latencyFromFinishedAtMs: p.latencyFromFinishedAtMs,
          answerToCommitMs: p.stages.answerToCommitMs,
          answerToReceiptMs: p.stages.answerToReceiptMs,
          memoryPerIdleSubscriberKb: p.memoryPerIdleSubscriberKb,
        },
      ]),
    ),
    targets,
    setup: {
      shape: 'N tenants x 5 graphql-ws subscribers on jobsCompleted (one WebSocket each, from the bench process), one INTERACTIVE dnslookup job per tenant',
      plan: 'MEGA (no pacer), concurrency 500, simulator latency median 20 ms',
      latency:
        "latencyMs: receipt time (bench process, graphql-ws next) minus the commit: when the job's final-state NOTIFY reached a LISTEN connection in a separate bench process (Postgres delivers a notification at its transaction's commit). latencyFromFinishedAtMs: receipt minus the job's finishedAt (now() of the settling transaction, before its commit; includes settlement time). stages: the answer is when the simulator wrote the job's answer (its call log); answer -> finishedAt is Sluice reading the answer and the settlement queue, finishedAt -> commit the settling statement and its commit, commit -> receipt the fan-out.",
      sluice: { mode, extraEnv },
    },
    phases,
  };
}
