/**
 * `npm run bench -- ingest`: the front door at full speed, each
 * shape against a raw pg-boss baseline measured in the same run, on the same
 * database:
 *
 *  (a) bulk: `submitJobs` of 10,000 jobs through GraphQL over HTTP (fetch →
 *      JSON read) against `boss.insert` of the same 10,000 jobs into one queue
 *      (in the bench process); --repeats alternating rounds, medians compared.
 *  (b) closed loop: 64 clients (autocannon, keep-alive) submitting single jobs
 *      (`submitJob`) over HTTP for --seconds: answers/s, accepted/s, p50/p99;
 *      baseline: 64 concurrent loops of `boss.insert` of one job.
 *  (c) the same with 1,000 tenants (requests rotate over their API keys;
 *      the baseline rotates over their queues).
 *
 * Sluice runs as a child process with its defaults (role `all`: the dispatcher
 * runs too, against a simulator, as deployed), API-only with `--api-only`.
 */
import { createRequire } from 'node:module';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { startBoss, queueName } from '../src/queue/boss.ts';
import type { FlagReader } from './lib/args.ts';
import { createTenant, type JobSpec } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, mapLimit, median, percentile, round, type Check } from './lib/stats.ts';

export const description = 'submitJobs of 10,000 vs boss.insert; 64 clients of single submitJob for 20 s (1 and 1,000 tenants) vs boss.insert loops';

// autocannon is CommonJS without types.
const autocannon = createRequire(import.meta.url)('autocannon') as (opts: Record<string, unknown>) => Promise<AutocannonResult>;
interface AutocannonResult {
  latency: { p50: number; p99: number; average: number; max: number };
  requests: { total: number; average: number };
  duration: number;
  non2xx: number;
  errors: number;
  timeouts: number;
  statusCodeStats: Record<string, { count: number }>;
}

const SUBMIT_ONE = 'mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }';
const SUBMIT_MANY = 'mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }';

const jobSpec = (i: number): JobSpec => ({ api: 'dnslookup', params: { domain: `i${i}.example.org` }, priority: 'BULK' });

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const bulkN = flags.number('jobs', 10_000);
  const repeats = flags.number('repeats', 3);
  const seconds = flags.number('seconds', 20);
  const baselineSeconds = flags.number('baseline-seconds', 10);
  const clients = flags.number('clients', 64);
  const tenantsN = flags.number('tenants', 1_000);
  const countSeconds = flags.number('count-seconds', 3);
  const apiOnly = flags.bool('api-only');
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const db = await freshDatabase(pg.adminUrl, 'ingest');
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  let boss: Awaited<ReturnType<typeof startBoss>> | null = null;
  try {
    // A slow, small upstream: the dispatcher runs (as deployed) but drains little, so queues only grow.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 60, concurrentCalls: 5, latencyMs: 500, latencyP95Ms: 1000, seed: 1, credits: 1e9, maxCredits: 1e9 });
    const env = {
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: '60',
      APIVERVE_CONCURRENT_CALLS: '5',
      GLOBAL_QUEUE_BOUND: '100000000',
      ...(apiOnly ? { SLUICE_ROLE: 'api' } : {}),
      ...extraEnv,
    };
    sluice = await startSluiceFor(env, mode);
    const url = sluice.url!;
    boss = await startBoss(db.url, { supervise: false });
    // The bench measures the front door's cost, not a tenant's request budget: the budget is sized
    // never to bind, so every request is still charged and refunded (its statements are measured).
    const limits = { weight: 1, concurrencyCap: 5, monthlyQuota: 1_000_000_000, queueBound: 100_000_000, requestBurst: 1_000_000_000, requestRate: 1_000_000_000 };
    const one = await createTenant(url, ADMIN_TOKEN, 'ingest-0', limits);
    progress(`[ingest] Sluice (${sluice.mode}, pid ${sluice.pid}) at ${url}`);

    // ---- (a) bulk: submitJobs of N over HTTP vs boss.insert of N ----
    const rawQueue = 'raw.ingest';
    await boss.createQueue(rawQueue);
    const cpuA = cpuMeter();
    const sluiceMs: number[] = [];
    const rawMs: number[] = [];
    for (let r = 0; r < repeats; r++) {
      const jobs = Array.from({ length: bulkN }, (_, i) => jobSpec(r * bulkN + i));
      const body = JSON.stringify({ query: SUBMIT_MANY, variables: { i: { jobs } } });
      const t0 = performance.now();
      const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${one.apiKey}` }, body });
      const json = (await res.json()) as { data?: { submitJobs: { jobs: unknown[] } }; errors?: unknown };
      sluiceMs.push(performance.now() - t0);
      if (json.data?.submitJobs.jobs.length !== bulkN) throw new Error(`submitJobs failed: ${JSON.stringify(json.errors).slice(0, 300)}`);
      // The same jobs, as Sluice hands them to pg-boss, straight into one queue.
      const raw = jobs.map((j) => ({ data: { tenantId: one.id, api: j.api, params: j.params } }));
      const t1 = performance.now();
      await boss.insert(rawQueue, raw);
      rawMs.push(performance.now() - t1);
      progress(`[ingest] (a) round ${r + 1}: submitJobs ${round(sluiceMs.at(-1)!, 0)} ms, boss.insert ${round(rawMs.at(-1)!, 0)} ms`);
    }
    const busyA = cpuA.end();
    const bulk = {
      jobs: bulkN,
      rounds: repeats,
      submitJobsMs: sluiceMs.map((x) => round(x, 1)),
      bossInsertMs: rawMs.map((x) => round(x, 1)),
      submitJobsMedianMs: round(median(sluiceMs), 1),
      bossInsertMedianMs: round(median(rawMs), 1),
      submitJobsPerS: round(bulkN / (median(sluiceMs) / 1000), 0),
      bossInsertPerS: round(bulkN / (median(rawMs) / 1000), 0),
      ratio: round(median(rawMs) / median(sluiceMs), 3),
      machineCpuBusy: busyA,
    };

    // ---- (b) and (c): closed loop of single submissions ----
    const closedLoop = async (label: string, keys: readonly string[], at = { url, seconds }) => {
      const [{ n: before }] = (await sql`select count(*)::int as n from jobs`) as unknown as [{ n: number }];
      let seq = 0;
      const cpu = cpuMeter();
      const result = await autocannon({
        url: at.url,
        connections: clients,
        duration: at.seconds,
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        requests: [
          {
            method: 'POST',
            setupRequest: (req: Record<string, unknown>) => {
              const i = seq++;
              return {
                ...req,
                headers: { 'content-type': 'application/json', authorization: `Bearer ${keys[i % keys.length]}` },
                body: JSON.stringify({ query: SUBMIT_ONE, variables: { i: jobSpec(i) } }),
              };
            },
          },
        ],
      });
      const busy = cpu.end();
      const [{ n: after }] = (await sql`select count(*)::int as n from jobs`) as unknown as [{ n: number }];
      const accepted = after - before;
      const out = {
        clients,
        seconds: result.duration,
        answers: result.requests.total,
        answersPerS: round(result.requests.total / result.duration, 0),
        acceptedJobs: accepted,
        acceptedPerS: round(accepted / result.duration, 0),
        latencyMs: { p50: result.latency.p50, p99: result.latency.p99, average: round(result.latency.average, 1), max: result.latency.max },
        non2xx: result.non2xx,
        errors: result.errors,
        timeouts: result.timeouts,
        machineCpuBusy: busy,
      };
      progress(`[ingest] ${label}: ${out.answersPerS} answers/s, ${out.acceptedPerS} accepted/s, p50 ${out.latencyMs.p50} ms, p99 ${out.latencyMs.p99} ms`);
      return out;
    };
    const rawLoop = async (label: string, queues: readonly string[]) => {
      const lat: number[] = [];
      let seq = 0;
      const endAt = Date.now() + baselineSeconds * 1000;
      const t0 = performance.now();
      await Promise.all(
        Array.from({ length: clients }, async () => {
          while (Date.now() < endAt) {
            const i = seq++;
            const t = performance.now();
            await boss!.insert(queues[i % queues.length]!, [{ data: { tenantId: one.id, ...jobSpec(i) } }]);
            lat.push(performance.now() - t);
          }
        }),
      );
      const s = (performance.now() - t0) / 1000;
      const out = { clients, seconds: round(s, 1), insertsPerS: round(lat.length / s, 0), latencyMs: { p50: round(median(lat), 1), p99: round(percentile(lat, 99), 1) } };
      progress(`[ingest] ${label}: ${out.insertsPerS} inserts/s, p50 ${out.latencyMs.p50} ms, p99 ${out.latencyMs.p99} ms`);
      return out;
    };

    const single = await closedLoop('(b) 1 tenant', [one.apiKey]);
    const singleRaw = await rawLoop('(b) raw boss.insert, 1 queue', [queueName(one.id, 'BULK')]);

    progress(`[ingest] creating ${tenantsN} tenants`);
    const many = await mapLimit(Array.from({ length: tenantsN }, (_, i) => i), 8, (i) => createTenant(url, ADMIN_TOKEN, `ingest-t${i}`, limits));
    const spread = await closedLoop(`(c) ${tenantsN} tenants`, many.map((t) => t.apiKey));
    const spreadRaw = await rawLoop(`(c) raw boss.insert, ${tenantsN} queues`, many.map((t) => queueName(t.id, 'BULK')));

    const stopped = await sluice.stop();
    sluice = null;

    // ---- statements per accepted submission: a second Sluice (API only, so no dispatcher or
    // sweeper statements), counting what its pools send (SLUICE_COUNT_SQL), after the timed runs ----
    progress('[ingest] counting SQL statements per accepted submission (API-only child, SLUICE_COUNT_SQL=1)');
    const counted = await startSluiceFor({ ...env, SLUICE_ROLE: 'api', SLUICE_COUNT_SQL: '1' }, 'child');
    let sqlPerSubmission: { single: number | null; bulkPerJob: number | null; singleAccepted: number; note: string };
    try {
      const t = await createTenant(counted.url!, ADMIN_TOKEN, 'ingest-count', limits);
      const s0 = await counted.statements();
      const loop = await closedLoop('(s) counted singles', [t.apiKey], { url: counted.url!, seconds: countSeconds });
      const s1 = await counted.statements();
      const jobs = Array.from({ length: bulkN }, (_, i) => jobSpec(10_000_000 + i));
      const res = await fetch(counted.url!, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${t.apiKey}` }, body: JSON.stringify({ query: SUBMIT_MANY, variables: { i: { jobs } } }) });
      await res.json();
      const s2 = await counted.statements();
      sqlPerSubmission = {
        single: s0 === null || s1 === null ? null : round((s1 - s0) / Math.max(1, loop.acceptedJobs), 3),
        bulkPerJob: s1 === null || s2 === null ? null : round((s2 - s1) / bulkN, 4),
        singleAccepted: loop.acceptedJobs,
        note: `statements Sluice's pools sent (BEGIN/COMMIT included, auth, admission, inserts) over accepted jobs: ${clients} clients of single submitJob for ${countSeconds} s, then one submitJobs of ${bulkN}`,
      };
      progress(`[ingest] statements per accepted single submission ${sqlPerSubmission.single}, per job of a bulk submission ${sqlPerSubmission.bulkPerJob}`);
    } finally {
      await counted.stop();
    }

    const targets: Record<string, Check> = {
      bulkVsBossInsert: check(bulk.ratio, '>= 0.7 (boss.insert time / submitJobs time, medians)', bulk.ratio >= 0.7),
      singleAcceptedPerS: check(single.acceptedPerS, '>= 1,000 accepted submissions/s (64 clients, 1 tenant)', single.acceptedPerS >= 1000),
      singleP99Ms: check(single.latencyMs.p99, '< 100 ms', single.latencyMs.p99 < 100),
      manyTenantsVsOne: check(round(spread.acceptedPerS / Math.max(1, single.acceptedPerS), 3), `within 10 % of (b) (${tenantsN} tenants / 1 tenant accepted/s)`, spread.acceptedPerS >= 0.9 * single.acceptedPerS),
      noErrors: check(single.errors + single.non2xx + spread.errors + spread.non2xx, '== 0 (every answer a 200)', single.errors + single.non2xx + spread.errors + spread.non2xx === 0),
    };
    return {
      summary: {
        bulk: { submitJobsMedianMs: bulk.submitJobsMedianMs, bossInsertMedianMs: bulk.bossInsertMedianMs, ratio: bulk.ratio },
        single: { acceptedPerS: single.acceptedPerS, p50Ms: single.latencyMs.p50, p99Ms: single.latencyMs.p99, rawInsertsPerS: singleRaw.insertsPerS },
        manyTenants: { tenants: tenantsN, acceptedPerS: spread.acceptedPerS, p50Ms: spread.latencyMs.p50, p99Ms: spread.latencyMs.p99, rawInsertsPerS: spreadRaw.insertsPerS },
      },
      targets,
      sqlPerSubmission,
      detail: { bulk, single, singleRaw, spread, spreadRaw },
      setup: {
        sluice: { mode, role: apiOnly ? 'api' : 'all (dispatcher running against a 60/min simulator)', extraEnv },
        jobs: 'dnslookup, BULK, unique domain per job, no idempotency key',
        client: '(a) fetch with the body serialised before the clock; (b)/(c) autocannon in the bench process, keep-alive, one request in flight per connection',
        baseline: 'pg-boss 12 boss.insert from the bench process into the same database (one connection pool of 10)',
      },
      noise: { sluiceProcessCpu: stopped },
    };
  } finally {
    if (sluice) await sluice.stop().catch(() => null);
    if (boss) await boss.stop({ graceful: false }).catch(() => {});
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sim) await sim.stop();
    await db.drop();
  }
}
