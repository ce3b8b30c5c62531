/**
 * `npm run bench -- cluster`: how Sluice scales as nodes are added
 * on ONE Postgres. Configurations (`--shapes`), each on a fresh database:
 *   1 API + 1 worker, 1 API + 2 workers, 1 API + 4 workers, then 2 APIs + 2
 *   workers and 2 APIs + 4 workers.
 * Every node is its own child process (SLUICE_ROLE api or worker) with
 * DB_POOL_MAX `--pool-max` (default 8: ~15 connections a node, so the six
 * nodes of the largest shape fit under max_connections 100).
 *
 * For each: a backlog (`--tenants` × `--jobs` dnslookup jobs, unique params,
 * submitted before the workers start) is dispatched against the simulator
 * (MEGA plan: no pacer, 500 concurrent calls, 20 ms latency, so Sluice and
 * Postgres are what bound it) while `--submitters` clients submit single jobs
 * to the API nodes (round robin) as fast as answers come back. Measured over
 * the `--window` seconds after a `--warmup`:
 *  - dispatch: jobs finished per second (SUCCEEDED or FAILED in `jobs`);
 *  - ingest: submitJob answers per second (and their p50/p99);
 *  - Postgres: CPU seconds per second of the backends serving the bench
 *    database (pids from pg_stat_activity, /proc/<pid>/stat), and the peak
 *    connection count per application_name.
 *
 * `--pgbouncer`: every shape runs twice in the same run, direct and then with
 * DATABASE_URL at a PgBouncer in transaction mode (Debian's, server pool
 * `--pgbouncer-pool` 20; test/helpers/pgbouncer.ts) and DATABASE_DIRECT_URL
 * at Postgres; `--pgbouncer-shapes` adds shapes run through PgBouncer only
 * (more nodes than fit direct). Through PgBouncer it also reports its server
 * and client connections (peak), clients that had to wait, its refusals, the
 * direct connections Sluice opened (Postgres backends not PgBouncer's), and
 * the nodes' error lines: "nothing refused" is all of those at zero.
 */
import { readFileSync } from 'node:fs';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { gql, gqlRaw, submitBody } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor, type SluiceHandle } from './lib/sluice.ts';
import { check, mapLimit, median, percentile, round, sleep, type Check } from './lib/stats.ts';
import { sessionTimeouts, timeoutStatements, DEFAULT_TIMEOUTS } from '../src/db/client.ts';
import { startPgBouncer, type PgBouncer } from '../test/helpers/pgbouncer.ts';

export const description = 'scale-out on one Postgres: 1 API + 1/2/4 workers, then 2 APIs + 2/4 workers: dispatch jobs/s, ingest answers/s, Postgres CPU and connections';

const TICKS = 100; // USER_HZ: /proc/<pid>/stat counts CPU time in 1/100 s on Linux

function procCpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / TICKS; // utime + stime
  } catch {
    return null;
  }
}

type Mode = 'direct' | 'pgbouncer';

/** PgBouncer's log lines that mean a client was refused or an error reached one. */
const REFUSED = /WARNING|ERROR|no more connections|pooler error|query_wait_timeout/;

async function config(pg: BenchPostgres, apis: number, workers: number, mode: Mode, o: { tenants: number; jobs: number; submitters: number; warmupS: number; windowS: number; poolMax: number; bouncerPool: number; extraEnv: Record<string, string> }) {
  const label = `${apis}api+${workers}w${mode === 'pgbouncer' ? ' via PgBouncer' : ''}`;
  const db = await freshDatabase(pg.adminUrl, `cluster_${apis}_${workers}`);
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  let sim: Simulator | null = null;
  let bouncer: PgBouncer | null = null;
  const nodes: SluiceHandle[] = [];
  try {
    sim = await startSimulator({ plan: 'MEGA', concurrentCalls: 500, latencyMs: 20, latencyP95Ms: 60, seed: 1, credits: 1_000_000_000, maxCredits: 1_000_000_000 });
    let dbEnv: Record<string, string> = { DATABASE_URL: db.url };
    if (mode === 'pgbouncer') {
      // The operator's step behind a pooler (docs/SCALING.md): the timeouts as the role's defaults.
      const shown = await sessionTimeouts(sql);
      for (const statement of timeoutStatements(shown.role, shown.database, DEFAULT_TIMEOUTS, shown.timeouts)) await sql.unsafe(statement);
      bouncer = await startPgBouncer(pg.adminUrl, { poolSize: o.bouncerPool, maxClientConn: 2000 });
      dbEnv = { DATABASE_URL: bouncer.urlFor(db.url), DATABASE_DIRECT_URL: db.url };
    }
    const env = { ...dbEnv, APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_PLAN: 'MEGA', APIVERVE_CONCURRENT_CALLS: '500', METRICS_PORT: '0', DB_POOL_MAX: String(o.poolMax), ...o.extraEnv };
    for (let i = 0; i < apis; i++) nodes.push(await startSluiceFor({ ...env, SLUICE_ROLE: 'api' }, 'child'));
    const urls = nodes.map((n) => n.url!);
    const keys = await mapLimit(Array.from({ length: o.tenants }, (_, i) => i), 8, async (i) => {
      const r = await gql<{ createTenant: { tenant: { id: string }; apiKey: string } }>(urls[0]!, ADMIN_TOKEN, 'mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }', { i: { name: `c-${i}`, tier: 'ENTERPRISE' } });
      await gql(urls[0]!, ADMIN_TOKEN, 'mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: r.createTenant.tenant.id, concurrencyCap: 200, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 } });
      return r.createTenant.apiKey;
    });
    progress(`[cluster ${label}] submitting the backlog: ${o.tenants} x ${o.jobs}`);
    await mapLimit(keys, 4, (key, t) => gqlRaw(urls[t % urls.length]!, key, submitBody(Array.from({ length: o.jobs }, (_, k) => ({ api: 'dnslookup', params: { domain: `b${t}-${k}.example.com` }, priority: 'STANDARD' as const })))));
    for (let i = 0; i < workers; i++) nodes.push(await startSluiceFor({ ...env, SLUICE_ROLE: 'worker' }, 'child'));
    progress(`[cluster ${label}] ${workers} workers up; warming up ${o.warmupS} s, measuring ${o.windowS} s`);

    // Ingest load: single-job submissions as fast as answers come back.
    let ingesting = true;
    const answers: Array<{ at: number; ms: number; ok: boolean }> = [];
    let seq = 0;
    const submitters = Array.from({ length: o.submitters }, async (_, s) => {
      while (ingesting) {
        const t0 = performance.now();
        const n = seq++;
        let ok = true;
        try {
          await gql(urls[n % urls.length]!, keys[s % keys.length]!, 'mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }', { i: { api: 'dnslookup', params: { domain: `i${n}.example.com` }, priority: 'BULK' } });
        } catch {
          ok = false;
        }
        answers.push({ at: Date.now(), ms: performance.now() - t0, ok });
      }
    });

    await sleep(o.warmupS * 1000);
    const finished = async () => Number((await sql`select count(*) from jobs where state in ('SUCCEEDED', 'FAILED')`)[0]!.count);
    const backends = async () => (await sql`select pid, client_port, coalesce(nullif(application_name, ''), 'unnamed') as app from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`).map((r) => ({ pid: r.pid as number, port: r.client_port as number | null, app: r.app as string }));
    const cpu0 = new Map<number, number>();
    const peakConnections = new Map<string, number>();
    const dbName = new URL(db.url).pathname.slice(1);
    const peaks = { direct: 0, servers: 0, clients: 0, waiting: 0, maxWaitS: 0 };
    const sampleBackends = async () => {
      const rows = await backends();
      if (bouncer) {
        // PgBouncer's own server connections, by the port they connect from; every other Sluice backend is direct.
        const servers = (await bouncer.show('servers')).filter((r) => r.database === dbName);
        const viaBouncer = new Set(servers.map((r) => Number(r.local_port)));
        peaks.direct = Math.max(peaks.direct, rows.filter((r) => r.app.startsWith('sluice') && r.port !== null && !viaBouncer.has(r.port)).length);
        const pool = (await bouncer.show('pools')).find((r) => r.database === dbName);
        if (pool) {
          const n = (k: string) => Number(pool[k] ?? 0);
          peaks.servers = Math.max(peaks.servers, n('sv_active') + n('sv_idle') + n('sv_used') + n('sv_tested') + n('sv_login'));
          peaks.clients = Math.max(peaks.clients, n('cl_active') + n('cl_waiting'));
          peaks.waiting = Math.max(peaks.waiting, n('cl_waiting'));
          peaks.maxWaitS = Math.max(peaks.maxWaitS, n('maxwait') + n('maxwait_us') / 1e6);
        }
      }
      const byApp = new Map<string, number>();
      for (const r of rows) {
        byApp.set(r.app, (byApp.get(r.app) ?? 0) + 1);
        if (!cpu0.has(r.pid)) {
          const c = procCpuSeconds(r.pid);
          if (c !== null) cpu0.set(r.pid, c);
        }
      }
      for (const [app, n] of byApp) peakConnections.set(app, Math.max(peakConnections.get(app) ?? 0, n));
      return rows.length;
    };
    await sampleBackends();
    const machine = cpuMeter();
    const t1 = Date.now();
    const f1 = await finished();
    let f2 = f1;
    let t2 = t1;
    let peakTotal = 0;
    const backlog = o.tenants * o.jobs;
    while (Date.now() - t1 < o.windowS * 1000) {
      await sleep(1_000);
      peakTotal = Math.max(peakTotal, await sampleBackends());
      f2 = await finished();
      t2 = Date.now();
      if (f2 >= backlog) break; // drained: the rate is measured up to here
    }
    const busy = machine.end();
    let pgCpu = 0;
    for (const [pid, c0] of cpu0) {
      const c = procCpuSeconds(pid);
      if (c !== null) pgCpu += c - c0;
    }
    ingesting = false;
    await Promise.all(submitters);
    const inWindow = answers.filter((a) => a.at >= t1 && a.at <= t2);
    const okMs = inWindow.filter((a) => a.ok).map((a) => a.ms);
    const seconds = (t2 - t1) / 1000;
    const result = {
      mode,
      apis,
      workers,
      dispatchJobsPerS: round((f2 - f1) / seconds, 1),
      ingestAnswersPerS: round(okMs.length / seconds, 1),
      ingestLatencyMs: okMs.length ? { p50: round(median(okMs), 1), p99: round(percentile(okMs, 99), 1) } : null,
      ingestErrors: inWindow.filter((a) => !a.ok).length,
      postgresCpuCores: round(pgCpu / seconds, 2),
      postgresConnectionsPeak: peakTotal,
      connectionsByApplication: Object.fromEntries(peakConnections),
      windowS: round(seconds, 1),
      drainedInWindow: f2 >= backlog,
      machineCpuBusy: busy,
      nodeErrorLines: nodes.reduce((sum, n) => sum + n.errorLines(), 0),
      ...(bouncer
        ? {
            pgbouncer: {
              serverPool: o.bouncerPool,
              serverConnectionsPeak: peaks.servers,
              clientConnectionsPeak: peaks.clients,
              clientsWaitingPeak: peaks.waiting,
              maxWaitSPeak: round(peaks.maxWaitS, 3),
              refusedLines: bouncer.logs.filter((l) => REFUSED.test(l)).length,
            },
            directConnectionsPeak: peaks.direct,
          }
        : {}),
    };
    progress(`[cluster ${label}] dispatch ${result.dispatchJobsPerS} jobs/s, ingest ${result.ingestAnswersPerS}/s, Postgres ${result.postgresCpuCores} cores, ${peakTotal} connections`);
    return result;
  } finally {
    for (const n of nodes.reverse()) await n.stop().catch(() => null);
    if (bouncer) await bouncer.stop();
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sim) await sim.stop();
    await db.drop();
  }
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const o = {
    tenants: flags.number('tenants', 40),
    // 1,500: with the one-call lease a 40 x 500 backlog drained inside the window.
    jobs: flags.number('jobs', 1500),
    submitters: flags.number('submitters', 16),
    warmupS: flags.number('warmup', 3),
    windowS: flags.number('window', 15),
    poolMax: flags.number('pool-max', 8),
    bouncerPool: flags.number('pgbouncer-pool', 20),
    extraEnv: parseEnvFlag(flags.optionalString('env')),
  };
  // `--shapes 1x1,1x2,1x4,2x2,2x4`: APIs x workers per configuration.
  const parseShapes = (text: string) => text.split(',').filter(Boolean).map((x) => x.split('x').map(Number) as [number, number]);
  const shapes = parseShapes(flags.optionalString('shapes') ?? '1x1,1x2,1x4,2x2,2x4');
  const pgbouncer = flags.bool('pgbouncer');
  const bouncerOnly = parseShapes(flags.optionalString('pgbouncer-shapes') ?? '');
  flags.done();
  if (bouncerOnly.length > 0 && !pgbouncer) throw new Error('--pgbouncer-shapes needs --pgbouncer');
  const runs: Array<[number, number, Mode]> = [
    ...shapes.flatMap(([a, w]): Array<[number, number, Mode]> => (pgbouncer ? [[a, w, 'direct'], [a, w, 'pgbouncer']] : [[a, w, 'direct']])),
    ...bouncerOnly.map(([a, w]): [number, number, Mode] => [a, w, 'pgbouncer']),
  ];
  const configs = [];
  for (const [a, w, mode] of runs) configs.push(await config(pg, a, w, mode, o));
  const base = configs[0]!;
  const targets: Record<string, Check> = {};
  for (const c of configs) {
    const k = `${c.apis}api_${c.workers}w${c.mode === 'pgbouncer' ? '_pgbouncer' : ''}`;
    targets[`${k}_dispatchJobsPerS`] = check(c.dispatchJobsPerS, 'reported', null);
    targets[`${k}_ingestAnswersPerS`] = check(c.ingestAnswersPerS, 'reported', null);
    if (c.pgbouncer) {
      const refused = c.ingestErrors + c.nodeErrorLines + c.pgbouncer.refusedLines;
      targets[`${k}_refused`] = check(refused, '0 (ingest errors + node error lines + PgBouncer refusals)', refused === 0);
      const nodes = c.apis + c.workers;
      // Steady: one LISTEN per node and the maintenance leader's lock; for seconds a minute, a worker's retention pass.
      targets[`${k}_directConnectionsPerNode`] = check(c.directConnectionsPeak! / nodes, '<= 1 per node (LISTEN) + 1 (maintenance leader) + 1 per worker in a retention pass', c.directConnectionsPeak! <= nodes + 1 + c.workers);
    }
  }
  return {
    summary: {
      configs: configs.map((c) => ({
        nodes: `${c.apis} API + ${c.workers} workers${c.mode === 'pgbouncer' ? ' via PgBouncer' : ''}`,
        dispatchJobsPerS: c.dispatchJobsPerS,
        dispatchVs1Worker: round(c.dispatchJobsPerS / Math.max(0.001, base.dispatchJobsPerS), 2),
        ingestAnswersPerS: c.ingestAnswersPerS,
        postgresCpuCores: c.postgresCpuCores,
        postgresConnectionsPeak: c.postgresConnectionsPeak,
        ...(c.pgbouncer ? { pgbouncerServersPeak: c.pgbouncer.serverConnectionsPeak, directConnectionsPeak: c.directConnectionsPeak, refused: c.ingestErrors + c.nodeErrorLines + c.pgbouncer.refusedLines } : {}),
      })),
    },
    targets,
    setup: {
      backlog: `${o.tenants} ENTERPRISE tenants (cap 200) x ${o.jobs} STANDARD dnslookup jobs, submitted before the workers start`,
      ingest: `${o.submitters} clients submitting one BULK job each (a lower class, so dispatch measures the backlog, not the ingest rate), back to back, round robin over the API nodes`,
      upstream: 'simulator MEGA plan (no pacer), 500 concurrent calls, latency median 20 ms, in the bench process',
      nodes: `each node a child process (bench/lib/sluice-child.ts) with Sluice defaults (batching on, DISPATCH_LOOPS 4) and DB_POOL_MAX ${o.poolMax}`,
      window: `${o.warmupS} s warm-up after the workers start, then up to ${o.windowS} s (shorter if the backlog drains)`,
      postgresCpu: 'CPU seconds per second of the backends connected to the bench database (excludes the checkpointer, WAL writer and other databases)',
      extraEnv: o.extraEnv,
      ...(pgbouncer ? { pgbouncer: `Debian's PgBouncer in transaction mode, default_pool_size ${o.bouncerPool}, max_client_conn 2000, no other setting; DATABASE_DIRECT_URL at Postgres; the three timeouts as the role's defaults (ALTER ROLE ... IN DATABASE)` } : {}),
    },
    configs,
  };
}
