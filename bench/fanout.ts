/**
 * `npm run bench -- fanout` (issue 13): graphql-ws subscribers on
 * `jobsCompleted`, one job per tenant, every event must arrive.
 *
 * Phases (each on a fresh database and a fresh Sluice child, role all):
 *  - 1,000 subscribers = 200 tenants × 5 (the shape measured on main: p50 102 ms, p99 433 ms);
 *  - 5,000 subscribers = 1,000 tenants × 5 (`--large-tenants`).
 * Each subscriber is its own WebSocket from the bench process. Once all are
 * connected and idle, the Sluice child's VmRSS is compared with its RSS
 * before they connected: memory per idle subscriber. Then one job per tenant
 * is submitted (MEGA plan, 20 ms simulator latency, so dispatch is not the
 * bottleneck) and each receipt is timed against the job's finishedAt (set in
 * the settling transaction, before its commit: the figure slightly
 * overstates commit-to-receipt).
 */
import postgres from 'postgres';
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { gql } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter, rssMb } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, mapLimit, median, percentile, round, sleep, type Check } from './lib/stats.ts';

export const description = 'graphql-ws fan-out: 200 tenants x 5 and 1,000 x 5 subscribers on jobsCompleted, one job per tenant: delivery, commit-to-receipt p50/p99, memory per idle subscriber';

async function phase(pg: BenchPostgres, tenants: number, perTenant: number, mode: 'child' | 'inproc', extraEnv: Record<string, string>, o: { waitS: number }) {
  const label = `${tenants}x${perTenant}`;
  const db = await freshDatabase(pg.adminUrl, `fanout_${tenants}`);
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const clients: Client[] = [];
  try {
    sim = await startSimulator({ plan: 'MEGA', concurrentCalls: 500, latencyMs: 20, latencyP95Ms: 60, seed: 1, credits: 100_000_000, maxCredits: 100_000_000 });
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
    await sleep(1_000);
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
    const rssIdle = rssMb(sluice.pid);
    progress(`[fanout ${label}] ${connected} subscribers connected; RSS ${round(rssBefore ?? 0, 1)} → ${round(rssIdle ?? 0, 1)} MB; submitting one job per tenant`);

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
        jobsFinished = Number((await sql`select count(*) from jobs where state in ('SUCCEEDED', 'FAILED')`)[0]!.count);
        if (jobsFinished >= tenants && receipts.length >= expected) break;
        await sleep(250);
      }
      if (receipts.length < jobsFinished * perTenant) await sleep(5_000); // the last events' grace
    } finally {
      await sql.end({ timeout: 2 }).catch(() => {});
    }
    const busy = cpu.end();
    const latencies = receipts.map((r) => r.at - r.finishedAt);
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
      latencyMs: latencies.length ? { p50: round(median(latencies), 1), p99: round(percentile(latencies, 99), 1), max: round(Math.max(...latencies), 1) } : null,
      rssMb: { beforeSubscribers: rssBefore === null ? null : round(rssBefore, 1), idleSubscribed: rssIdle === null ? null : round(rssIdle, 1) },
      memoryPerIdleSubscriberKb: rssBefore !== null && rssIdle !== null ? round(((rssIdle - rssBefore) * 1024) / expected, 1) : null,
      wallS: round((Date.now() - started) / 1000, 1),
      machineCpuBusy: busy,
    };
    progress(`[fanout ${label}] delivered ${result.delivered}/${expected}, p50 ${result.latencyMs?.p50} ms, p99 ${result.latencyMs?.p99} ms`);
    return result;
  } finally {
    await Promise.all(clients.map((c) => c.dispose()));
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
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const phases = [await phase(pg, small, perTenant, mode, extraEnv, { waitS })];
  if (large > 0) phases.push(await phase(pg, large, perTenant, mode, extraEnv, { waitS }));
  const targets: Record<string, Check> = {};
  for (const p of phases) {
    const k = `s${p.subscribers}`;
    targets[`${k}_allDelivered`] = check(p.delivered, `== ${p.subscribers} (every job finished, every subscriber got its event)`, p.delivered === p.subscribers && p.subscriptionErrors === 0);
    targets[`${k}_p99Ms`] = check(p.latencyMs?.p99 ?? null, '< 50 ms (finishedAt to receipt)', p.latencyMs ? p.latencyMs.p99 < 50 : false);
    targets[`${k}_memoryPerIdleSubscriberKb`] = check(p.memoryPerIdleSubscriberKb, 'reported', null);
  }
  return {
    summary: Object.fromEntries(phases.map((p) => [`s${p.subscribers}`, { delivered: p.delivered, latencyMs: p.latencyMs, memoryPerIdleSubscriberKb: p.memoryPerIdleSubscriberKb }])),
    targets,
    setup: {
      shape: 'N tenants x 5 graphql-ws subscribers on jobsCompleted (one WebSocket each, from the bench process), one INTERACTIVE dnslookup job per tenant',
      plan: 'MEGA (no pacer), concurrency 500, simulator latency median 20 ms',
      latency: "receipt time (bench process) minus the job's finishedAt (Postgres now() of the settling transaction, before its commit)",
      sluice: { mode, extraEnv },
    },
    phases,
  };
}
