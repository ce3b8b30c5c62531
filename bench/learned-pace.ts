/**
 * `npm run bench -- learned-pace`: a plan that is not what it says. Sluice is configured at twice
 * the key's real window (1,200/min against a real 600/min by default) and drains a backlog for
 * 60 s against a STANDALONE simulator (`npm run simulator`, its own process, SIMULATOR_* settings,
 * the provider's documented 50 s cooldown by default). Reported: completions/s over the last 40 s
 * against the real paced rate (real window × PACE_FRACTION), the 429s the provider answered, and
 * the learned rate over time; first with the learned pace (PACE_LEARN=true, the default), then the
 * old behaviour (PACE_LEARN=false) in the same run as the baseline. Each phase gets a fresh
 * database, a fresh simulator and a fresh Sluice child.
 *
 * Target: ≥ 85 % of the real paced rate over the last 40 s with at most a handful (5) of 429s.
 */
import postgres from 'postgres';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gql, SUBMIT_JOBS } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, round, sleep } from './lib/stats.ts';
import { simulatorKeyStats, startStandaloneSimulator } from './lib/standalone-simulator.ts';

export const description = 'configured at twice the real window, against a standalone simulator: completions/s over the last 40 s of 60 vs the real paced rate, 429s; learned pace vs configured pace';

const API_KEY = 'apv_bench_learned_pace';

interface Options {
  realPerMinute: number;
  configuredPerMinute: number;
  durationS: number;
  measureS: number;
  cooldownS: number;
  latencyMs: number;
  paceFraction: number;
  batch: boolean;
  env: Record<string, string>;
  mode: 'child' | 'inproc';
}

async function phase(pg: BenchPostgres, o: Options, learn: boolean) {
  const label = learn ? 'learned' : 'configured';
  const db = await freshDatabase(pg.adminUrl, `pace${label}`);
  const sim = await startStandaloneSimulator({ apiKey: API_KEY, ratePerMinute: o.realPerMinute, cooldownS: o.cooldownS, latencyMs: o.latencyMs });
  const sluice = await startSluiceFor(
    {
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: API_KEY,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: String(o.configuredPerMinute),
      PACE_FRACTION: String(o.paceFraction),
      PACE_LEARN: String(learn),
      INITIAL_LATENCY_MS: String(o.latencyMs),
      ...(o.batch ? {} : { BATCH_MAX: '1' }),
      ...o.env,
    },
    o.mode,
  );
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  try {
    const url = sluice.url!;
    const tenant = await createTenant(url, ADMIN_TOKEN, 'importer', { weight: 1, concurrencyCap: 1000, monthlyQuota: 10_000_000, queueBound: 100_000 });
    // More than the configured pace could drain in the run: a backlog throughout.
    const total = Math.ceil((o.configuredPerMinute * o.durationS) / 60) + 500;
    for (let i = 0; i < total; i += 1000) {
      const jobs = Array.from({ length: Math.min(1000, total - i) }, (_, k) => ({ api: 'dnslookup', params: { domain: `lp${i + k}.example` } }));
      await gql(url, tenant.apiKey, SUBMIT_JOBS, { i: { jobs } });
    }
    const t0 = Date.now();
    progress(`[learned-pace] ${label}: ${total} jobs queued; draining for ${o.durationS} s`);
    const timeline: Array<[number, number, number, number | null, string | null]> = [];
    let at = 0;
    while (at < o.durationS) {
      await sleep(Math.max(0, t0 + (at + 1) * 1000 - Date.now()));
      at = Math.round((Date.now() - t0) / 1000);
      const [[done], stats, [w]] = await Promise.all([
        sql`select count(*)::int as n from jobs where state = 'SUCCEEDED'`,
        simulatorKeyStats(sim.adminUrl, API_KEY),
        sql`select rate_per_minute, pace_reason, paused_until > now() as paused from windows where name = 'primary'`,
      ]);
      timeline.push([at, done!.n as number, stats.rateLimited, w!.rate_per_minute as number | null, w!.paused ? 'PAUSED' : (w!.pace_reason as string | null)]);
      if (at % 10 === 0) progress(`[learned-pace] ${label} t=${at}s succeeded ${done!.n} 429s ${stats.rateLimited} rate ${w!.rate_per_minute}`);
    }
    const end = Date.now();
    const from = new Date(end - o.measureS * 1000);
    const [[window], stats] = await Promise.all([
      sql`select count(*)::int as n from jobs where state = 'SUCCEEDED' and finished_at >= ${from} and finished_at <= ${new Date(end)}`,
      simulatorKeyStats(sim.adminUrl, API_KEY),
    ]);
    const perSecond = (window!.n as number) / o.measureS;
    const realPaced = (o.realPerMinute * o.paceFraction) / 60;
    return {
      completionsPerSecondLast: round(perSecond, 3),
      realPacedPerSecond: round(realPaced, 3),
      shareOfRealPaced: round(perSecond / realPaced, 3),
      rateLimited429: stats.rateLimited,
      upstreamCalls: stats.calls,
      billedCalls: stats.billedCalls,
      timeline: timeline.map(([s, done, r429, rate, reason]) => ({ s, succeeded: done, r429, ratePerMinute: rate === null ? null : round(rate, 1), reason })),
    };
  } finally {
    await sql.end();
    await sluice.stop();
    await sim.stop();
    await db.drop();
  }
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const o: Options = {
    realPerMinute: flags.number('real', 600),
    configuredPerMinute: flags.number('configured', 1200),
    durationS: flags.number('duration', 60),
    measureS: flags.number('measure', 40),
    cooldownS: flags.number('cooldown', 50),
    latencyMs: flags.number('latency', 100),
    paceFraction: flags.number('pace-fraction', 0.9),
    batch: flags.bool('batch'),
    env: parseEnvFlag(flags.optionalString('env')),
    mode: flags.bool('inproc') ? 'inproc' : 'child',
  };
  const skipBaseline = flags.bool('no-baseline');
  flags.done();
  const learned = await phase(pg, o, true);
  const configured = skipBaseline ? null : await phase(pg, o, false);
  const summary = {
    realPerMinute: o.realPerMinute,
    configuredPerMinute: o.configuredPerMinute,
    realPacedPerSecond: learned.realPacedPerSecond,
    learned: { completionsPerSecondLast40s: learned.completionsPerSecondLast, shareOfRealPaced: learned.shareOfRealPaced, rateLimited429: learned.rateLimited429 },
    configuredOnly: configured && { completionsPerSecondLast40s: configured.completionsPerSecondLast, shareOfRealPaced: configured.shareOfRealPaced, rateLimited429: configured.rateLimited429 },
  };
  const targets = {
    shareOfRealPaced: check(learned.shareOfRealPaced, '>= 0.85 of the real paced rate over the last 40 s', learned.shareOfRealPaced >= 0.85),
    rateLimited429: check(learned.rateLimited429, '<= 5 (a handful)', learned.rateLimited429 <= 5),
  };
  return {
    summary,
    targets,
    setup: {
      upstream: `standalone simulator (npm run simulator) PRO at ${o.realPerMinute}/min, burst 3 s, cooldown ${o.cooldownS} s, latency median ${o.latencyMs} ms; Sluice told ${o.configuredPerMinute}/min, PACE_FRACTION ${o.paceFraction}; ${o.batch ? 'batching on' : 'single calls (BATCH_MAX=1)'}`,
      durationS: o.durationS,
      measuredOverLastS: o.measureS,
    },
    runs: { learned, configured },
  };
}
