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
 *      the baseline rotates over their queues). (b) and (c) run interleaved,
 *      --slices slices of each in the order b c c b b c c b, their answers
 *      pooled per shape, so their ratio compares the same minutes.
 *  (s) counted: on a second, API-only child counting its statements, single
 *      submissions for --count-seconds from 1 tenant, then from (c)'s tenants
 *      (after as long of warm-up), then one bulk: statements, WAL bytes and
 *      rows written per accepted job for each.
 *  (d) full: 64 clients (fetch loops) submitting one job each against a small
 *      global bound (--full-bound) that a faster simulator drains, so most are
 *      refused: p99 of all answers, of accepts and of refusals, answers/s, and
 *      what a refusal costs (Sluice child CPU per answer; SQL statements per
 *      answer in a second, counted run).
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
import { cpuDelta, cpuMeter, procCpuSeconds } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, interleaved, mapLimit, median, percentile, round, sleep, type Check } from './lib/stats.ts';

export const description = 'submitJobs of 10,000 vs boss.insert; 64 clients of single submitJob for 20 s (1 and 1,000 tenants) vs boss.insert loops';

// autocannon is CommonJS without types; its run is a promise and an event emitter ('response' per answer).
type AutocannonRun = Promise<AutocannonResult> & { on(event: 'response', fn: (client: unknown, status: number, bytes: number, ms: number) => void): void };
const autocannon = createRequire(import.meta.url)('autocannon') as (opts: Record<string, unknown>) => AutocannonRun;
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
  const slices = flags.number('slices', 4);
  const baselineSeconds = flags.number('baseline-seconds', 10);
  const clients = flags.number('clients', 64);
  const tenantsN = flags.number('tenants', 1_000);
  const countSeconds = flags.number('count-seconds', 3);
  const apiOnly = flags.bool('api-only');
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  const only = flags.optionalString('only');
  const fullBound = flags.number('full-bound', 200);
  const fullSeconds = flags.number('full-seconds', 20);
  flags.done();
  const fullOpts = { clients, seconds: fullSeconds, bound: fullBound, countSeconds, mode, extraEnv };
  if (only === 'full') {
    const full = await fullPhase(pg, fullOpts);
    return { summary: { full: full.summary }, targets: full.targets, detail: { full: full.detail }, setup: { full: full.setup } };
  }
  if (only !== undefined) throw new Error(`--only: "full" is the one phase that runs alone (got "${only}")`);

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
    // One slice: `clients` autocannon connections for `at.seconds`, each answer's latency kept so
    // that slices of one shape pool into one distribution.
    let nextJob = 1_000_000; // unique domains across slices (below (s)' and (d)'s ranges)
    // The CPU a slice cost: the Sluice child's and its Postgres backends' (/proc), per accepted job.
    const backendPids = async () => (await sql`select pid from pg_stat_activity where datname = current_database() and application_name like 'sluice%'`).map((r) => r.pid as number);
    const closedSlice = async (keys: readonly string[], at: { url: string; seconds: number; pid: number }) => {
      const [{ n: before }] = (await sql`select count(*)::int as n from jobs`) as unknown as [{ n: number }];
      const cpuBefore = { sluice: procCpuSeconds([at.pid]), backends: procCpuSeconds(await backendPids()) };
      let seq = 0;
      const latencies: number[] = [];
      const cpu = cpuMeter();
      const instance = autocannon({
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
                body: JSON.stringify({ query: SUBMIT_ONE, variables: { i: jobSpec(nextJob++) } }),
              };
            },
          },
        ],
      });
      instance.on('response', (_client, _status, _bytes, ms) => latencies.push(ms));
      const result = await instance;
      const busy = cpu.end();
      const cpuS = { sluice: cpuDelta(cpuBefore.sluice, procCpuSeconds([at.pid])), backends: cpuDelta(cpuBefore.backends, procCpuSeconds(await backendPids())) };
      const [{ n: after }] = (await sql`select count(*)::int as n from jobs`) as unknown as [{ n: number }];
      return { result, latencies, accepted: after - before, busy, cpuS };
    };
    type Slice = Awaited<ReturnType<typeof closedSlice>>;
    const summarize = (label: string, slices: readonly Slice[]) => {
      const seconds = slices.reduce((a, s) => a + s.result.duration, 0);
      const answers = slices.reduce((a, s) => a + s.result.requests.total, 0);
      const accepted = slices.reduce((a, s) => a + s.accepted, 0);
      const lat = slices.flatMap((s) => s.latencies);
      const busy = slices.map((s) => s.busy).filter((b): b is number => b !== null);
      const out = {
        clients,
        seconds: round(seconds, 1),
        slices: slices.length,
        answers,
        answersPerS: round(answers / seconds, 0),
        acceptedJobs: accepted,
        acceptedPerS: round(accepted / seconds, 0),
        latencyMs: { p50: round(median(lat), 1), p99: round(percentile(lat, 99), 1), average: round(lat.reduce((a, b) => a + b, 0) / Math.max(1, lat.length), 1), max: round(Math.max(...lat), 1) },
        cpuMsPerAccepted: {
          sluice: round((slices.reduce((a, s) => a + s.cpuS.sluice, 0) * 1000) / Math.max(1, accepted), 3),
          postgresBackends: round((slices.reduce((a, s) => a + s.cpuS.backends, 0) * 1000) / Math.max(1, accepted), 3),
        },
        sliceAcceptedPerS: slices.map((s) => round(s.accepted / s.result.duration, 0)),
        sliceP99Ms: slices.map((s) => round(percentile(s.latencies, 99), 1)),
        non2xx: slices.reduce((a, s) => a + s.result.non2xx, 0),
        errors: slices.reduce((a, s) => a + s.result.errors, 0),
        timeouts: slices.reduce((a, s) => a + s.result.timeouts, 0),
        machineCpuBusy: busy.length ? round(busy.reduce((a, b) => a + b, 0) / busy.length, 3) : null,
      };
      progress(`[ingest] ${label}: ${out.answersPerS} answers/s, ${out.acceptedPerS} accepted/s (slices ${out.sliceAcceptedPerS.join(', ')}), p50 ${out.latencyMs.p50} ms, p99 ${out.latencyMs.p99} ms; CPU per accepted job: Sluice ${out.cpuMsPerAccepted.sluice} ms, its backends ${out.cpuMsPerAccepted.postgresBackends} ms`);
      return out;
    };
    const closedLoop = async (label: string, keys: readonly string[], at: { url: string; seconds: number; pid: number }) => summarize(label, [await closedSlice(keys, at)]);
    const rawSlice = async (queues: readonly string[], sliceSeconds: number) => {
      const lat: number[] = [];
      let seq = 0;
      const endAt = Date.now() + sliceSeconds * 1000;
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
      return { lat, seconds: (performance.now() - t0) / 1000 };
    };
    const rawSummary = (label: string, slices: ReadonlyArray<Awaited<ReturnType<typeof rawSlice>>>) => {
      const lat = slices.flatMap((x) => x.lat);
      const s = slices.reduce((a, x) => a + x.seconds, 0);
      const out = { clients, seconds: round(s, 1), slices: slices.length, insertsPerS: round(lat.length / s, 0), latencyMs: { p50: round(median(lat), 1), p99: round(percentile(lat, 99), 1) }, sliceInsertsPerS: slices.map((x) => round(x.lat.length / x.seconds, 0)) };
      progress(`[ingest] ${label}: ${out.insertsPerS} inserts/s (slices ${out.sliceInsertsPerS.join(', ')}), p50 ${out.latencyMs.p50} ms, p99 ${out.latencyMs.p99} ms`);
      return out;
    };

    progress(`[ingest] creating ${tenantsN} tenants`);
    const many = await mapLimit(Array.from({ length: tenantsN }, (_, i) => i), 8, (i) => createTenant(url, ADMIN_TOKEN, `ingest-t${i}`, limits));
    // Each tenant's first job, and pg-boss's first maintenance of its queue, before the slices: a
    // queue pg-boss has never maintained is due at once (then daily), so the first pass after 1,000
    // queues get jobs walks all of them (~5 s of statements here) and would land in whichever slice
    // ran then. One-time costs of a new tenant, not of a submission; the wait is printed.
    const warm = performance.now();
    await mapLimit([one, ...many], 16, async (t, i) => {
      const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${t.apiKey}` }, body: JSON.stringify({ query: SUBMIT_ONE, variables: { i: jobSpec(900_000 + i) } }) });
      const json = (await res.json()) as { data?: { submitJob?: unknown } | null; errors?: unknown };
      if (!json.data?.submitJob) throw new Error(`warm-up submission refused: ${JSON.stringify(json.errors).slice(0, 300)}`);
    });
    const unmaintained = async () => {
      const [{ n: left }] = (await sql`select count(*)::int as n from pgboss.queue q where q.maintain_on is null and exists (select 1 from pgboss.job j where j.name = q.name)`) as unknown as [{ n: number }];
      return left;
    };
    let left = await unmaintained();
    for (const until = performance.now() + 90_000; left > 0 && performance.now() < until; left = await unmaintained()) await sleep(500);
    const warmUp = { seconds: round((performance.now() - warm) / 1000, 1), queuesNotYetMaintained: left };
    progress(`[ingest] warm-up: one job per tenant, pg-boss's first maintenance of their queues: ${warmUp.seconds} s (${left} queues left unmaintained)`);
    // (b) and (c) interleaved in slices, so that both shapes see the same minutes of the machine and
    // the same growth of the tables: run one after the other, their ratio moved 0.72-1.07 on one
    // code with whichever phase the machine slowed.
    const manyKeys = many.map((t) => t.apiKey);
    const sliceSeconds = Math.max(1, Math.round(seconds / slices));
    const shapes = await interleaved(slices, async (isOne, i) => {
      const slice = await closedSlice(isOne ? [one.apiKey] : manyKeys, { url, seconds: sliceSeconds, pid: sluice!.pid });
      progress(`[ingest] slice ${i + 1}/${2 * slices} ${isOne ? '(b) 1 tenant' : `(c) ${tenantsN} tenants`}: ${round(slice.accepted / slice.result.duration, 0)} accepted/s, p99 ${round(percentile(slice.latencies, 99), 1)} ms`);
      return slice;
    });
    const single = summarize('(b) 1 tenant', shapes.first);
    const spread = summarize(`(c) ${tenantsN} tenants`, shapes.second);
    // The raw baselines interleaved the same way: pg-boss's own cost of many queues, same minutes.
    const oneQueue = [queueName(one.id, 'BULK')];
    const manyQueues = many.map((t) => queueName(t.id, 'BULK'));
    const rawSliceSeconds = Math.max(1, Math.round(baselineSeconds / slices));
    const raw = await interleaved(slices, (isOne) => rawSlice(isOne ? oneQueue : manyQueues, rawSliceSeconds));
    const singleRaw = rawSummary('(b) raw boss.insert, 1 queue', raw.first);
    const spreadRaw = rawSummary(`(c) raw boss.insert, ${tenantsN} queues`, raw.second);

    const stopped = await sluice.stop();
    sluice = null;

    // ---- statements per accepted submission: a second Sluice (API only, so no dispatcher or
    // sweeper statements), counting what its pools send (SLUICE_COUNT_SQL), after the timed runs ----
    progress('[ingest] counting SQL statements per accepted submission (API-only child, SLUICE_COUNT_SQL=1)');
    const counted = await startSluiceFor({ ...env, SLUICE_ROLE: 'api', SLUICE_COUNT_SQL: '1' }, 'child');
    let sqlPerSubmission: { single: number | null; bulkPerJob: number | null; singleAccepted: number; manyTenants?: number | null; note: string };
    let writesPerJob: Record<string, unknown> = {};
    // WAL bytes (the server's, so only meaningful on a quiet server) and rows written (table
    // counters, flushed by idle backends within a second: read after 2 s) over a phase.
    const writes = async () => {
      await sleep(2_000);
      const [w] = await sql`
        select pg_current_wal_lsn()::text as lsn,
          (select coalesce(sum(n_tup_ins), 0) from pg_stat_user_tables)::bigint as ins,
          (select coalesce(sum(n_tup_upd), 0) from pg_stat_user_tables)::bigint as upd,
          (select coalesce(sum(n_tup_del), 0) from pg_stat_user_tables)::bigint as del`;
      return w!;
    };
    const perJob = async (a: Awaited<ReturnType<typeof writes>>, b: Awaited<ReturnType<typeof writes>>, n: number) => {
      const [{ bytes }] = (await sql`select pg_wal_lsn_diff(${b.lsn}::pg_lsn, ${a.lsn}::pg_lsn)::bigint as bytes`) as unknown as [{ bytes: string }];
      const per = (x: unknown, y: unknown) => round((Number(y) - Number(x)) / Math.max(1, n), 2);
      return { jobs: n, walBytes: per(0, bytes), rowsInserted: per(a.ins, b.ins), rowsUpdated: per(a.upd, b.upd), rowsDeleted: per(a.del, b.del) };
    };
    try {
      const t = await createTenant(counted.url!, ADMIN_TOKEN, 'ingest-count', limits);
      const w0 = await writes();
      const s0 = await counted.statements();
      const loop = await closedLoop('(s) counted singles', [t.apiKey], { url: counted.url!, seconds: countSeconds, pid: counted.pid });
      const s1 = await counted.statements();
      const w1 = await writes();
      const jobs = Array.from({ length: bulkN }, (_, i) => jobSpec(10_000_000 + i));
      const res = await fetch(counted.url!, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${t.apiKey}` }, body: JSON.stringify({ query: SUBMIT_MANY, variables: { i: { jobs } } }) });
      await res.json();
      const s2 = await counted.statements();
      const w2 = await writes();
      writesPerJob = { single: await perJob(w0, w1, loop.acceptedJobs), bulk: await perJob(w1, w2, bulkN), note: 'per accepted job, API-only child: WAL bytes (pg_current_wal_lsn difference, the whole server) and rows inserted/updated/deleted (pg_stat_user_tables, all tables)' };
      progress(`[ingest] per accepted job: single ${JSON.stringify(writesPerJob.single)}, bulk ${JSON.stringify(writesPerJob.bulk)}`);
      sqlPerSubmission = {
        single: s0 === null || s1 === null ? null : round((s1 - s0) / Math.max(1, loop.acceptedJobs), 3),
        bulkPerJob: s1 === null || s2 === null ? null : round((s2 - s1) / bulkN, 4),
        singleAccepted: loop.acceptedJobs,
        note: `statements Sluice's pools sent (BEGIN/COMMIT included, auth, admission, inserts) over accepted jobs: ${clients} clients of single submitJob for ${countSeconds} s, then one submitJobs of ${bulkN}`,
      };
      progress(`[ingest] statements per accepted single submission ${sqlPerSubmission.single}, per job of a bulk submission ${sqlPerSubmission.bulkPerJob}`);
      // The same for (c)'s tenants, after as long again of warm-up: their keys, request budgets and
      // queues as they are in (c)'s slices, not cold. What 1,000 tenants cost beyond one, counted.
      await closedLoop(`(s) ${tenantsN} tenants, warm-up`, manyKeys, { url: counted.url!, seconds: countSeconds, pid: counted.pid });
      const m0 = await counted.statements();
      const wm0 = await writes();
      const manyLoop = await closedLoop(`(s) counted singles, ${tenantsN} tenants`, manyKeys, { url: counted.url!, seconds: countSeconds, pid: counted.pid });
      const m1 = await counted.statements();
      const wm1 = await writes();
      sqlPerSubmission.manyTenants = m0 === null || m1 === null ? null : round((m1 - m0) / Math.max(1, manyLoop.acceptedJobs), 3);
      writesPerJob.singleManyTenants = await perJob(wm0, wm1, manyLoop.acceptedJobs);
      progress(`[ingest] ${tenantsN} tenants: statements per accepted single submission ${sqlPerSubmission.manyTenants}; per accepted job ${JSON.stringify(writesPerJob.singleManyTenants)}`);
    } finally {
      await counted.stop();
    }

    const full = await fullPhase(pg, fullOpts);

    const targets: Record<string, Check> = {
      bulkVsBossInsert: check(bulk.ratio, '>= 0.8 (boss.insert time / submitJobs time, medians)', bulk.ratio >= 0.8),
      singleAcceptedPerS: check(single.acceptedPerS, '>= 1,000 accepted submissions/s (64 clients, 1 tenant)', single.acceptedPerS >= 1000),
      singleP99Ms: check(single.latencyMs.p99, '< 100 ms', single.latencyMs.p99 < 100),
      manyTenantsVsOne: check(round(spread.acceptedPerS / Math.max(1, single.acceptedPerS), 3), `within 10 % of (b) (${tenantsN} tenants / 1 tenant accepted/s)`, spread.acceptedPerS >= 0.9 * single.acceptedPerS),
      noErrors: check(single.errors + single.non2xx + spread.errors + spread.non2xx, '== 0 (every answer a 200)', single.errors + single.non2xx + spread.errors + spread.non2xx === 0),
      ...full.targets,
    };
    return {
      summary: {
        bulk: { submitJobsMedianMs: bulk.submitJobsMedianMs, bossInsertMedianMs: bulk.bossInsertMedianMs, ratio: bulk.ratio },
        single: { acceptedPerS: single.acceptedPerS, p50Ms: single.latencyMs.p50, p99Ms: single.latencyMs.p99, rawInsertsPerS: singleRaw.insertsPerS },
        manyTenants: { tenants: tenantsN, acceptedPerS: spread.acceptedPerS, p50Ms: spread.latencyMs.p50, p99Ms: spread.latencyMs.p99, rawInsertsPerS: spreadRaw.insertsPerS, vsOne: round(spread.acceptedPerS / Math.max(1, single.acceptedPerS), 3), rawVsOne: round(spreadRaw.insertsPerS / Math.max(1, singleRaw.insertsPerS), 3) },
        full: full.summary,
      },
      targets,
      sqlPerSubmission,
      writesPerJob,
      detail: { bulk, single, singleRaw, spread, spreadRaw, full: full.detail },
      setup: {
        warmUp,
        sluice: { mode, role: apiOnly ? 'api' : 'all (dispatcher running against a 60/min simulator)', extraEnv },
        jobs: 'dnslookup, BULK, unique domain per job, no idempotency key',
        client: '(a) fetch with the body serialised before the clock; (b)/(c) autocannon in the bench process, keep-alive, one request in flight per connection',
        baseline: 'pg-boss 12 boss.insert from the bench process into the same database (one connection pool of 10)',
        full: full.setup,
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

/**
 * (d) full: `clients` fetch loops, each one submitJob in flight, against GLOBAL_QUEUE_BOUND
 * `bound` on a fresh database, drained by a simulator at 6,000 calls/min (paced 90/s), so most
 * answers are refusals: every answer's latency (fetch sent to JSON read), split by accepted and
 * refused (429 QUEUE_FULL with Retry-After); the Sluice child's CPU per answer from /proc over
 * the timed run; then a second, counted child (SLUICE_COUNT_SQL=1, same setup) for `countSeconds`:
 * SQL statements per answer, per accepted job and per refusal (the statements of the counted run
 * over its answers; refusals are most of them).
 */
async function fullPhase(pg: BenchPostgres, o: { clients: number; seconds: number; bound: number; countSeconds: number; mode: 'child' | 'inproc'; extraEnv: Record<string, string> }) {
  const run = async (seconds: number, counted: boolean) => {
    const db = await freshDatabase(pg.adminUrl, counted ? 'ingestfullc' : 'ingestfull');
    const sql = postgres(db.url, { max: 2, onnotice: () => {} });
    const sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6_000, concurrentCalls: 50, latencyMs: 100, latencyP95Ms: 200, seed: 1, credits: 1e9, maxCredits: 1e9 });
    let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
    try {
      const env = {
        DATABASE_URL: db.url,
        APIVERVE_API_KEY: sim.apiKey,
        APIVERVE_BASE_URL: sim.url,
        APIVERVE_PLAN: 'PRO',
        APIVERVE_RATE_PER_MINUTE: '6000',
        APIVERVE_CONCURRENT_CALLS: '50',
        GLOBAL_QUEUE_BOUND: String(o.bound),
        ...(counted ? { SLUICE_COUNT_SQL: '1' } : {}),
        ...o.extraEnv,
      };
      sluice = await startSluiceFor(env, counted ? 'child' : o.mode);
      const url = sluice.url!;
      const limits = { weight: 1, concurrencyCap: 50, monthlyQuota: 1_000_000_000, queueBound: 100_000_000, requestBurst: 1_000_000_000, requestRate: 1_000_000_000 };
      const tenant = await createTenant(url, ADMIN_TOKEN, 'ingest-full', limits);
      const answers: Array<{ ms: number; accepted: boolean; ok429: boolean; status: number; atMs: number }> = [];
      let seq = 0;
      const s0 = counted ? await sluice.statements() : null;
      const cpu0 = procCpuSeconds([sluice.pid]).get(sluice.pid) ?? null;
      const meter = cpuMeter();
      const t0 = performance.now();
      const endAt = t0 + seconds * 1000;
      await Promise.all(
        Array.from({ length: o.clients }, async () => {
          while (performance.now() < endAt) {
            const body = JSON.stringify({ query: SUBMIT_ONE, variables: { i: jobSpec(20_000_000 + seq++) } });
            const sent = performance.now();
            const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${tenant.apiKey}` }, body });
            const json = (await res.json()) as { data?: { submitJob?: { job: { id: string } } } | null; errors?: Array<{ extensions?: { code?: string } }> };
            const accepted = !!json.data?.submitJob?.job.id && !json.errors?.length;
            const ok429 = res.status === 429 && json.errors?.[0]?.extensions?.code === 'QUEUE_FULL' && res.headers.get('retry-after') !== null;
            answers.push({ ms: performance.now() - sent, accepted, ok429, status: res.status, atMs: sent - t0 });
          }
        }),
      );
      const wallS = (performance.now() - t0) / 1000;
      const busy = meter.end();
      const cpu1 = procCpuSeconds([sluice.pid]).get(sluice.pid) ?? null;
      const s1 = counted ? await sluice.statements() : null;
      const [{ n: stored }] = (await sql`select count(*)::int as n from jobs`) as unknown as [{ n: number }];
      const acc = answers.filter((a) => a.accepted);
      const ref = answers.filter((a) => !a.accepted);
      const pct = (v: number[]) => (v.length ? { n: v.length, p50: round(median(v), 1), p99: round(percentile(v, 99), 1), max: round(Math.max(...v), 1) } : { n: 0, p50: null, p99: null, max: null });
      return {
        wallS: round(wallS, 1),
        answers: answers.length,
        answersPerS: round(answers.length / wallS, 0),
        accepted: acc.length,
        refused: ref.length,
        refused429WithRetryAfter: ref.filter((a) => a.ok429).length,
        otherAnswers: ref.filter((a) => !a.ok429).length,
        storedJobs: stored,
        latencyMs: { all: pct(answers.map((a) => a.ms)), accepted: pct(acc.map((a) => a.ms)), refused: pct(ref.map((a) => a.ms)) },
        // Not judged: the same without the requests sent in the first 2 s (the bound fills from
        // empty then, on a cold process: ~140 of the ~1,800 accepts, enough to carry a p99).
        latencyAfter2sMs: { all: pct(answers.filter((a) => a.atMs >= 2_000).map((a) => a.ms)), accepted: pct(acc.filter((a) => a.atMs >= 2_000).map((a) => a.ms)), refused: pct(ref.filter((a) => a.atMs >= 2_000).map((a) => a.ms)) },
        sluiceCpuMsPerAnswer: cpu0 === null || cpu1 === null ? null : round(((cpu1 - cpu0) * 1000) / Math.max(1, answers.length), 3),
        statementsPerAnswer: s0 === null || s1 === null ? null : round((s1 - s0) / Math.max(1, answers.length), 3),
        statements: s0 === null || s1 === null ? null : s1 - s0,
        machineCpuBusy: busy,
      };
    } finally {
      if (sluice) await sluice.stop().catch(() => null);
      await sql.end({ timeout: 2 }).catch(() => {});
      await sim.stop();
      await db.drop();
    }
  };
  const timed = await run(o.seconds, false);
  progress(`[ingest] (d) full, bound ${o.bound}: ${timed.answersPerS} answers/s, ${timed.accepted} accepted, ${timed.refused} refused; p99 all ${timed.latencyMs.all.p99} ms, accepted ${timed.latencyMs.accepted.p99} ms, refused ${timed.latencyMs.refused.p99} ms; Sluice CPU ${timed.sluiceCpuMsPerAnswer} ms/answer`);
  const counted = await run(o.countSeconds, true);
  progress(`[ingest] (d) counted: ${counted.statementsPerAnswer} statements per answer (${counted.accepted} accepted, ${counted.refused} refused)`);
  const p99All = timed.latencyMs.all.p99;
  const p99Acc = timed.latencyMs.accepted.p99;
  const targets: Record<string, Check> = {
    fullP99AllMs: check(p99All, '< 200 ms (64 clients against a small global bound, every answer)', p99All === null ? null : p99All < 200),
    fullP99AcceptedMs: check(p99Acc, '< 200 ms (the accepts among them)', p99Acc === null ? null : p99Acc < 200),
    fullMostRefused: check(round(timed.refused / Math.max(1, timed.answers), 3), '> 0.5 (the phase is the one it means to be)', timed.refused > timed.answers / 2),
    fullEveryRefusalA429: check(timed.otherAnswers, '== 0 (each refusal 429 QUEUE_FULL with Retry-After)', timed.otherAnswers === 0),
    fullNothingLost: check(timed.storedJobs - timed.accepted, '== 0 (jobs stored = accepted answers)', timed.storedJobs === timed.accepted),
  };
  return {
    summary: { bound: o.bound, answersPerS: timed.answersPerS, accepted: timed.accepted, refused: timed.refused, p99AllMs: p99All, p99AcceptedMs: p99Acc, p99RefusedMs: timed.latencyMs.refused.p99, sluiceCpuMsPerAnswer: timed.sluiceCpuMsPerAnswer, statementsPerAnswer: counted.statementsPerAnswer },
    targets,
    detail: { timed, counted },
    setup: { clients: o.clients, seconds: o.seconds, countSeconds: o.countSeconds, globalQueueBound: o.bound, simulator: 'PRO 6,000/min (paced 90/s), 50 concurrent, latency 100 ms', jobs: 'dnslookup BULK (may fill 70 % of the bound), one tenant, no key', client: 'fetch loops in the bench process, one request in flight each' },
  };
}
