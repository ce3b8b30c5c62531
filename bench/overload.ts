/**
 * `npm run bench -- overload`: 200 concurrent submitters offering
 * ~5× what the pace drains, for --duration seconds, against small tenant and
 * global queue bounds, so the system fills and refuses with 429 QUEUE_FULL.
 *
 * Plan 600 calls/min paced at 0.9 = 9/s drain; 200 submitters each send one
 * submitJobs every 200 / 45 s (≈4.4 s, first one at a random offset), one job
 * per submission (every 5th submission carries 3 jobs, so the offered rate is
 * kept near 45 jobs/s by stretching the interval), spread over 10 tenants and
 * the three classes (INTERACTIVE 20 %, STANDARD 40 %, BULK 40 % of submitters).
 *
 * Measured: time to answer a submission (client side, fetch → body read),
 * accepted / refused / all; share refused with 429, each with Retry-After and
 * code QUEUE_FULL; refusals by class and scope; the Sluice child's peak VmRSS
 * (/proc/<pid>/status every 200 ms); and that every accepted job is in the
 * jobs table, queued or finished, and no refused one is.
 */
import { readFileSync } from 'node:fs';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { createTenant, submitBody, type JobSpec } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, median, percentile, round, sleep, type Check } from './lib/stats.ts';

export const description = '200 submitters at 5x the pace: submission latency (accepted/refused), 429 share and Retry-After, shedding by class, peak RSS, nothing lost';

type Cls = 'INTERACTIVE' | 'STANDARD' | 'BULK';

interface Answer {
  submitter: number;
  cls: Cls;
  jobs: number;
  keys: string[];
  sentMs: number;
  ms: number;
  status: number;
  accepted: boolean;
  code: string | null;
  scope: string | null;
  retryAfter: string | null;
  ids: number;
  error?: string;
}

function rssMb(pid: number): number | null {
  try {
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

const pct = (v: number[]) => (v.length ? { n: v.length, p50: round(median(v), 1), p99: round(percentile(v, 99), 1), max: round(Math.max(...v), 1) } : { n: 0, p50: null, p99: null, max: null });

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const durationS = flags.number('duration', 30);
  const submitters = flags.number('submitters', 200);
  const ratePerMinute = flags.number('rate', 600);
  const pace = flags.number('pace', 0.9);
  const overload = flags.number('overload', 5);
  const tenantsN = flags.number('tenants', 10);
  const tenantBound = flags.number('tenant-bound', 60);
  const smallTenantBound = flags.number('small-tenant-bound', 20);
  const globalBound = flags.number('global-bound', 300);
  const latencyMs = flags.number('latency', 600);
  const concurrency = flags.number('concurrency', 20);
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const pacedPerS = (ratePerMinute * pace) / 60;
  const offeredPerS = pacedPerS * overload;
  // Every 5th submission carries 3 jobs: 7 jobs per 5 submissions on average.
  const jobsPerSubmission = 7 / 5;
  const intervalMs = (submitters * jobsPerSubmission * 1000) / offeredPerS;

  const db = await freshDatabase(pg.adminUrl, 'overload');
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  try {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute, concurrentCalls: concurrency, latencyMs, latencyP95Ms: latencyMs * 3, seed: 1, credits: 100_000_000, maxCredits: 100_000_000 });
    const env = {
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: String(ratePerMinute),
      APIVERVE_CONCURRENT_CALLS: String(concurrency),
      PACE_FRACTION: String(pace),
      GLOBAL_QUEUE_BOUND: String(globalBound),
      ...extraEnv,
    };
    sluice = await startSluiceFor(env, mode);
    const url = sluice.url!;
    const pid = sluice.pid;
    progress(`[overload] Sluice (${sluice.mode}, pid ${pid}) at ${url}; paced ${round(pacedPerS, 2)}/s, offered ~${round(offeredPerS, 1)} jobs/s by ${submitters} submitters (every ${round(intervalMs / 1000, 2)} s each)`);

    const keys: string[] = [];
    for (let t = 0; t < tenantsN; t++) {
      const r = await createTenant(url, ADMIN_TOKEN, `overload-${t}`, { weight: 1, concurrencyCap: 50, monthlyQuota: 1_000_000_000, queueBound: t === 0 ? smallTenantBound : tenantBound });
      keys.push(r.apiKey);
    }

    // RSS sampler.
    const rss: number[] = [];
    let sampling = true;
    const rssBase = rssMb(pid);
    const rssLoop = (async () => {
      while (sampling) {
        const v = rssMb(pid);
        if (v !== null) rss.push(v);
        await sleep(200);
      }
    })();

    const answers: Answer[] = [];
    const cpu = cpuMeter();
    sim.resetStats();
    const t0 = Date.now();
    const endAt = t0 + durationS * 1000;
    const classOf = (s: number): Cls => (s % 5 === 0 ? 'INTERACTIVE' : s % 5 <= 2 ? 'STANDARD' : 'BULK');
    let seq = 0;
    const loops = Array.from({ length: submitters }, async (_, s) => {
      const cls = classOf(s);
      const tenant = s % tenantsN;
      let next = t0 + Math.random() * intervalMs;
      let n = 0;
      for (;;) {
        if (next >= endAt) return;
        const wait = next - Date.now();
        if (wait > 0) await sleep(wait);
        next += intervalMs * (0.8 + Math.random() * 0.4);
        const count = n++ % 5 === 4 ? 3 : 1;
        const jobs: JobSpec[] = Array.from({ length: count }, () => {
          const k = `o${s}-${seq++}`;
          return { api: 'dnslookup', params: { domain: `${k}.example.org` }, priority: cls, idempotencyKey: k };
        });
        const body = submitBody(jobs);
        const sent = performance.now();
        const a: Answer = { submitter: s, cls, jobs: count, keys: jobs.map((j) => j.idempotencyKey!), sentMs: Date.now() - t0, ms: 0, status: 0, accepted: false, code: null, scope: null, retryAfter: null, ids: 0 };
        try {
          const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${keys[tenant]}` }, body });
          const json = (await res.json()) as { data?: { submitJobs?: { jobs: Array<{ id: string }> } } | null; errors?: Array<{ extensions?: { code?: string; scope?: string } }> };
          a.ms = performance.now() - sent;
          a.status = res.status;
          a.retryAfter = res.headers.get('retry-after');
          const ids = json.data?.submitJobs?.jobs;
          if (ids && !json.errors?.length) {
            a.accepted = true;
            a.ids = ids.length;
          } else {
            a.code = json.errors?.[0]?.extensions?.code ?? null;
            a.scope = json.errors?.[0]?.extensions?.scope ?? null;
          }
        } catch (err) {
          a.ms = performance.now() - sent;
          a.error = err instanceof Error ? err.message : String(err);
        }
        answers.push(a);
      }
    });
    const ticker = setInterval(() => {
      const acc = answers.filter((a) => a.accepted).length;
      progress(`[overload] t=${((Date.now() - t0) / 1000).toFixed(0)}s answers ${answers.length} accepted ${acc} refused ${answers.length - acc} rss ${rss.length ? round(rss[rss.length - 1]!, 0) : '?'} MB`);
    }, 5000);
    await Promise.all(loops);
    clearInterval(ticker);
    const wallS = (Date.now() - t0) / 1000;
    const machineBusy = cpu.end();
    sampling = false;
    await rssLoop;
    const simStats = sim.stats();
    const [depthRow] = await sql`select count(*) filter (where state in ('QUEUED','WAITING_QUOTA'))::int as queued, count(*) filter (where state = 'RUNNING')::int as running from jobs`;
    progress(`[overload] stopping Sluice`);
    const stopped = await sluice.stop();
    sluice = null;

    // ---- check: every accepted job is in the table, queued or finished; no refused one is ----
    const rows = await sql`select idempotency_key as k, state from jobs`;
    const stateOf = new Map(rows.map((r) => [r.k as string, r.state as string]));
    const acceptedKeys = answers.filter((a) => a.accepted).flatMap((a) => a.keys);
    const refusedKeys = answers.filter((a) => !a.accepted).flatMap((a) => a.keys);
    const byState: Record<string, number> = {};
    let missing = 0;
    for (const k of acceptedKeys) {
      const st = stateOf.get(k);
      if (!st) missing++;
      else byState[st] = (byState[st] ?? 0) + 1;
    }
    const expected = new Set(['QUEUED', 'WAITING_QUOTA', 'RUNNING', 'SUCCEEDED', 'FAILED']);
    const unexpected = Object.entries(byState).filter(([s]) => !expected.has(s)).reduce((n, [, v]) => n + v, 0);
    const refusedButStored = refusedKeys.filter((k) => stateOf.has(k)).length;
    const idsMismatch = answers.filter((a) => a.accepted && a.ids !== a.jobs).length;

    // ---- figures ----
    const acc = answers.filter((a) => a.accepted);
    const ref = answers.filter((a) => !a.accepted && !a.error);
    const errs = answers.filter((a) => a.error);
    const r429 = ref.filter((a) => a.status === 429);
    const r429ok = r429.filter((a) => a.code === 'QUEUE_FULL' && a.retryAfter !== null && Number(a.retryAfter) >= 0 && a.retryAfter.trim() !== '');
    const classes: Cls[] = ['INTERACTIVE', 'STANDARD', 'BULK'];
    const byClass = Object.fromEntries(
      classes.map((c) => {
        const all = answers.filter((a) => a.cls === c);
        const refused = all.filter((a) => !a.accepted);
        const firstRefusal = refused.length ? Math.min(...refused.map((a) => a.sentMs)) : null;
        return [c, { submissions: all.length, refused: refused.length, refusedShare: all.length ? round(refused.length / all.length, 3) : null, firstRefusalS: firstRefusal === null ? null : round(firstRefusal / 1000, 2), latencyMs: pct(all.map((a) => a.ms)) }];
      }),
    );
    const byScope: Record<string, number> = {};
    for (const a of ref) byScope[`${a.scope ?? '?'}`] = (byScope[`${a.scope ?? '?'}`] ?? 0) + 1;
    const byCode: Record<string, number> = {};
    for (const a of ref) byCode[`${a.status} ${a.code ?? '?'}`] = (byCode[`${a.status} ${a.code ?? '?'}`] ?? 0) + 1;
    const retryAfters = r429.map((a) => Number(a.retryAfter)).filter((x) => Number.isFinite(x));
    const perSecond = Array.from({ length: Math.ceil(wallS) }, (_, s) => {
      const inS = answers.filter((a) => Math.floor(a.sentMs / 1000) === s);
      const ms = inS.map((a) => a.ms);
      return [s, inS.length, inS.filter((a) => !a.accepted).length, ms.length ? round(median(ms), 0) : null, ms.length ? round(percentile(ms, 99), 0) : null];
    });
    const all = answers.map((a) => a.ms);
    const peakRss = rss.length ? Math.max(...rss) : null;
    const keyStats = simStats.keys[sim.apiKey]!;
    const shedOrder = (['BULK', 'STANDARD', 'INTERACTIVE'] as Cls[]).map((c) => byClass[c]!.refusedShare ?? 0);

    const targets: Record<string, Check> = {
      p99AllMs: check(percentile(all, 99), '< 200 ms (every submission)', percentile(all, 99) < 200),
      p99AcceptedMs: check(acc.length ? percentile(acc.map((a) => a.ms), 99) : null, '< 200 ms', acc.length ? percentile(acc.map((a) => a.ms), 99) < 200 : null),
      p99RefusedMs: check(ref.length ? percentile(ref.map((a) => a.ms), 99) : null, '< 200 ms', ref.length ? percentile(ref.map((a) => a.ms), 99) < 200 : null),
      peakRssMb: check(peakRss, '< 512 MB (Sluice process VmRSS)', peakRss === null ? null : peakRss < 512),
      refusalsHappened: check(r429.length, '> 0 (the system filled and said no)', r429.length > 0),
      every429HasRetryAfterAndQueueFull: check(r429.length ? r429ok.length / r429.length : null, '== 1', r429.length ? r429ok.length === r429.length : null),
      everyRefusalIs429: check(ref.length ? r429.length / ref.length : null, '== 1 (no other error)', ref.length === r429.length && errs.length === 0, errs.length ? `${errs.length} transport errors: ${errs[0]!.error}` : undefined),
      bulkShedFirst: check(shedOrder[0]!, 'refused share BULK >= STANDARD >= INTERACTIVE', shedOrder[0]! >= shedOrder[1]! && shedOrder[1]! >= shedOrder[2]!),
      acceptedJobsMissing: check(missing, '== 0', missing === 0),
      acceptedJobsInUnexpectedState: check(unexpected, '== 0 (queued, running or finished)', unexpected === 0),
      refusedJobsStored: check(refusedButStored, '== 0 (a refused submission leaves nothing behind)', refusedButStored === 0),
    };
    const summary = {
      submissions: answers.length,
      jobsOffered: answers.reduce((n, a) => n + a.jobs, 0),
      offeredJobsPerS: round(answers.reduce((n, a) => n + a.jobs, 0) / durationS, 1),
      pacedDrainPerS: round(pacedPerS, 2),
      accepted: acc.length,
      refused: ref.length,
      transportErrors: errs.length,
      refusedShare: round(ref.length / Math.max(1, answers.length), 3),
      refused429Share: round(r429.length / Math.max(1, answers.length), 3),
      latencyMs: { all: pct(all), accepted: pct(acc.map((a) => a.ms)), refused: pct(ref.map((a) => a.ms)) },
      refusalsByClass: Object.fromEntries(classes.map((c) => [c, { refused: byClass[c]!.refused, of: byClass[c]!.submissions, share: byClass[c]!.refusedShare, firstRefusalS: byClass[c]!.firstRefusalS }])),
      refusalsByScope: byScope,
      peakRssMb: peakRss === null ? null : round(peakRss, 1),
      lostCheck: { acceptedJobs: acceptedKeys.length, missing, byState, unexpected, refusedButStored, acceptedAnswersWithWrongIdCount: idsMismatch },
    };
    return {
      summary,
      targets,
      setup: {
        durationS,
        submitters,
        submitterIntervalS: round(intervalMs / 1000, 3),
        jobsPerSubmission: 'every 5th submission of a submitter carries 3 jobs, the rest 1',
        classesBySubmitter: 'submitter % 5: 0 INTERACTIVE, 1-2 STANDARD, 3-4 BULK',
        tenants: tenantsN,
        tenantQueueBound: tenantBound,
        tenant0QueueBound: smallTenantBound,
        globalQueueBound: globalBound,
        classShares: extraEnv.CLASS_SHARES ?? 'default BULK=0.7,STANDARD=0.9,INTERACTIVE=1',
        plan: { ratePerMinute, pace, pacedPerS: round(pacedPerS, 2), concurrency, simulatorLatencyMedianMs: latencyMs },
        api: 'dnslookup (1 credit), unique domain per job',
        client: 'plain fetch from the bench process (undici), one in flight per submitter, 127.0.0.1 only; latency = fetch sent → JSON body read',
        sluice: { mode, extraEnv },
      },
      detail: {
        refusalCodes: byCode,
        retryAfterSeconds: retryAfters.length ? { min: Math.min(...retryAfters), p50: median(retryAfters), max: Math.max(...retryAfters) } : null,
        byClass,
        perSecond,
        perSecondFormat: '[second, submissions sent, refused, p50 ms, p99 ms of those sent in that second]',
        atEnd: { queued: depthRow!.queued, running: depthRow!.running },
        upstream: { calls: keyStats.calls, httpRequests: keyStats.httpRequests, rateLimited429: simStats.totals.rateLimited },
        rss: { baselineMb: rssBase === null ? null : round(rssBase, 1), samples: rss.length, atStopMb: stopped?.rssMb === undefined ? null : round(stopped.rssMb, 1) },
      },
      noise: { machineCpuBusy: machineBusy, sluiceProcessCpu: stopped, wallS: round(wallS, 1) },
    };
  } finally {
    if (sluice) await sluice.stop().catch(() => null);
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sim) await sim.stop();
    await db.drop();
  }
}
