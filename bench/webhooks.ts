/**
 * `npm run bench -- webhooks`: completion webhooks under load, and what they cost dispatch.
 *
 * One Sluice child (role all, SLUICE_COUNT_SQL=1, WEBHOOK_ALLOW_PRIVATE=true) against a MEGA
 * simulator (20 ms median latency), a receiver (node:http, 200 at once) in the bench process.
 * Rounds alternate two shapes on the same process, `--jobs` (1,000) jobs each, submitted in one
 * `submitJobs` by a fresh tenant:
 *  - `without`: the tenant has no endpoint (and, in the first round, no tenant has one: the
 *    trigger's join is empty);
 *  - `with`: the tenant has one endpoint for every event.
 * Per round: the dispatch rate (jobs / (last finishedAt - first startedAt), Postgres clocks), the
 * SQL statements per job the Sluice child's main pools sent (the dispatch and settlement path; the
 * webhook sender has its own pool, counted apart as its statements are not on that path), and,
 * with an endpoint, deliveries per second (jobs / (last receipt - first finishedAt)) and the
 * latency from the job's finishedAt (now() of its settling transaction, so settlement time is
 * included) to the receipt at the receiver, p50/p99.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gql, gqlRaw, submitBody } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, median, percentile, round, sleep, type Check } from './lib/stats.ts';

export const description = 'completion webhooks: N jobs (1,000) finishing, deliveries/s and p99 from finishedAt to the receiver; dispatch jobs/s and SQL statements per job with and without an endpoint, alternating in one run';

interface Round {
  shape: 'with' | 'without';
  jobs: number;
  dispatchJobsPerSecond: number;
  sqlStatementsPerJob: number | null;
  deliveries: number | null;
  deliveriesPerSecond: number | null;
  latencyFromFinishMs: { p50: number; p99: number; max: number } | null;
  machineCpuBusy: number | null;
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const jobs = flags.number('jobs', 1_000);
  const rounds = flags.number('rounds', 3);
  const waitS = flags.number('wait', 180);
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const db = await freshDatabase(pg.adminUrl, 'webhooks');
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const receipts = new Map<string, number>();
  let duplicates = 0;
  const receiver = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const at = Date.now();
      const id = (JSON.parse(Buffer.concat(chunks).toString()) as { data: { id: string } }).data.id;
      if (receipts.has(id)) duplicates++;
      else receipts.set(id, at);
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  const hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  const results: Round[] = [];
  try {
    sim = await startSimulator({ plan: 'MEGA', concurrentCalls: 500, latencyMs: 20, latencyP95Ms: 60, seed: 1, credits: 1_000_000_000, maxCredits: 1_000_000_000 });
    sluice = await startSluiceFor(
      { DATABASE_URL: db.url, APIVERVE_API_KEY: sim.apiKey, APIVERVE_BASE_URL: sim.url, APIVERVE_PLAN: 'MEGA', APIVERVE_CONCURRENT_CALLS: '500', SLUICE_COUNT_SQL: '1', WEBHOOK_ALLOW_PRIVATE: 'true', ...extraEnv },
      mode,
    );
    const url = sluice.url!;
    progress(`[webhooks] Sluice (${sluice.mode}, pid ${sluice.pid}) at ${url}; ${rounds} rounds of ${jobs} jobs without and with an endpoint`);
    for (let r = 0; r < rounds * 2; r++) {
      const shape = r % 2 === 0 ? 'without' : 'with';
      const tenant = await createTenant(url, ADMIN_TOKEN, `wh-${r}-${shape}`, { weight: 1, concurrencyCap: 1_000, monthlyQuota: 1_000_000_000, queueBound: 1_000_000, requestBurst: 100_000, requestRate: 100_000 });
      if (shape === 'with') {
        await gql(url, tenant.apiKey, 'mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { secret } }', { i: { url: hookUrl, events: ['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED'] } });
      }
      const body = submitBody(Array.from({ length: jobs }, (_, i) => ({ api: 'dnslookup', params: { domain: `r${r}-${i}.example.com` } })));
      const stmtsBefore = await sluice.statements();
      const cpu = cpuMeter();
      const submitted = await gqlRaw<{ submitJobs: { jobs: Array<{ id: string }> } }>(url, tenant.apiKey, body);
      const ids = submitted.submitJobs.jobs.map((j) => j.id);
      const deadline = Date.now() + waitS * 1000;
      // Statements are counted up to the last job's finish (not while the deliveries drain: an
      // idle dispatcher's polls would be charged to the jobs).
      let stmtsAfter: number | null = null;
      for (;;) {
        const [c] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant.id} and state in ('SUCCEEDED', 'FAILED', 'CANCELLED')`;
        if (c!.n >= jobs && stmtsAfter === null) stmtsAfter = await sluice.statements();
        const delivered = shape === 'with' ? ids.filter((id) => receipts.has(id)).length : jobs;
        if ((c!.n >= jobs && delivered >= jobs) || Date.now() > deadline) break;
        await sleep(50);
      }
      const busy = cpu.end();
      stmtsAfter ??= await sluice.statements();
      const [span] = await sql`
        select extract(epoch from min(started_at)) * 1000 as first_start, extract(epoch from max(finished_at)) * 1000 as last_finish,
          extract(epoch from min(finished_at)) * 1000 as first_finish, count(*)::int as n
        from jobs where tenant_id = ${tenant.id} and finished_at is not null`;
      const finished = await sql`select id, extract(epoch from finished_at) * 1000 as f from jobs where tenant_id = ${tenant.id} and finished_at is not null`;
      const dispatchSeconds = (Number(span!.last_finish) - Number(span!.first_start)) / 1000;
      let deliveries: number | null = null;
      let perSecond: number | null = null;
      let latency: Round['latencyFromFinishMs'] = null;
      if (shape === 'with') {
        const lat = finished.filter((j) => receipts.has(j.id)).map((j) => receipts.get(j.id)! - Number(j.f));
        deliveries = lat.length;
        const lastReceipt = Math.max(...ids.filter((id) => receipts.has(id)).map((id) => receipts.get(id)!));
        perSecond = round(lat.length / ((lastReceipt - Number(span!.first_finish)) / 1000), 1);
        latency = lat.length ? { p50: round(median(lat), 1), p99: round(percentile(lat, 99), 1), max: round(Math.max(...lat), 1) } : null;
      }
      const round_: Round = {
        shape,
        jobs: span!.n,
        dispatchJobsPerSecond: round(span!.n / dispatchSeconds, 1),
        sqlStatementsPerJob: stmtsBefore !== null && stmtsAfter !== null ? round((stmtsAfter - stmtsBefore) / Math.max(1, span!.n), 3) : null,
        deliveries,
        deliveriesPerSecond: perSecond,
        latencyFromFinishMs: latency,
        machineCpuBusy: busy,
      };
      results.push(round_);
      progress(`[webhooks] round ${r + 1}/${rounds * 2} ${shape}: ${JSON.stringify(round_)}`);
    }
  } finally {
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sluice) await sluice.stop().catch(() => null);
    if (sim) await sim.stop();
    receiver.closeAllConnections();
    await new Promise<void>((r) => receiver.close(() => r()));
    await db.drop();
  }

  const of = (shape: Round['shape']) => results.filter((r) => r.shape === shape);
  const med = (xs: Array<number | null>) => {
    const v = xs.filter((x): x is number => x !== null);
    return v.length ? round(median(v), 3) : null;
  };
  const withR = of('with');
  const withoutR = of('without');
  const rate = { without: med(withoutR.map((r) => r.dispatchJobsPerSecond)), with: med(withR.map((r) => r.dispatchJobsPerSecond)) };
  const stmts = { without: med(withoutR.map((r) => r.sqlStatementsPerJob)), with: med(withR.map((r) => r.sqlStatementsPerJob)) };
  const p99 = med(withR.map((r) => r.latencyFromFinishMs?.p99 ?? null));
  const delivered = withR.reduce((a, r) => a + (r.deliveries ?? 0), 0);
  const targets: Record<string, Check> = {
    allDelivered: check(delivered, `== ${withR.length * jobs} (every job of a tenant with an endpoint delivered)`, delivered === withR.length * jobs),
    duplicates: check(duplicates, 'reported (at least once: a duplicate is allowed, none expected without faults)', null),
    deliveriesPerSecond: check(med(withR.map((r) => r.deliveriesPerSecond)), 'reported (median of rounds)', null),
    p99FromFinishMs: check(p99, 'reported (median of rounds; finishedAt to receipt)', null),
    dispatchRateWithEndpointRatio: check(rate.with !== null && rate.without ? rate.with / rate.without : null, '>= 0.9 (dispatch keeps its pace with an endpoint; median of rounds)', rate.with !== null && rate.without ? rate.with / rate.without >= 0.9 : null),
    sqlStatementsPerJobDelta: check(stmts.with !== null && stmts.without !== null ? stmts.with - stmts.without : null, '<= 0.05 (the trigger adds no round trip to dispatch or settlement)', stmts.with !== null && stmts.without !== null ? stmts.with - stmts.without <= 0.05 : null),
  };
  return {
    summary: { dispatchJobsPerSecond: rate, sqlStatementsPerJob: stmts, deliveriesPerSecond: targets.deliveriesPerSecond!.value, p99FromFinishMs: p99, delivered, duplicates },
    targets,
    setup: {
      shape: `${rounds} rounds of (without, with) on one Sluice child; ${jobs} dnslookup jobs per round from a fresh tenant in one submitJobs`,
      plan: 'MEGA (no pacer), concurrency 500, simulator latency median 20 ms; receiver in the bench process answering 204 at once',
      sluice: { mode, extraEnv },
    },
    rounds: results,
  };
}
