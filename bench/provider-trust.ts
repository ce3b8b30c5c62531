/**
 * `npm run bench -- provider-trust`: the provider's signals as hints. Three phases, each with a
 * fresh database, a fresh standalone simulator (its own process) and a fresh Sluice child,
 * configured for 1,200/min (PACE_FRACTION 0.9: 18 calls/s paced):
 *
 * 1. `headerless`: a provider that never states its window (no `x-rate-limit-*` headers; a 429
 *    carries only `retry-after: 1`, no cooldown) enforcing 600/min for `--low` s, then 6,000/min
 *    for `--high` s. Served while low against the real limit (target ≥ 60 %); after the rise, how
 *    long until Sluice serves ≥ 85 % of its configured paced rate (target ≤ 60 s). The learned rate
 *    and the served rate over time go to `--svg FILE` (docs/provider-trust.svg).
 * 2. `capped-ask`: the same provider answering every rate-limit 429 with `retry-after: 999999999`,
 *    RETRY_AFTER_MAX_SECONDS `--cap` (10): the longest pause seen (target ≤ the cap), the calls in
 *    the 2 s after each pause (the probe), and that dispatch goes on.
 * 3. `slow-start`: the simulator as documented (headers on every answer, the 50 s cooldown) at
 *    600/min: over the first minute from the first call, no cooldown tripped (no 429) and ≥ 85 %
 *    of the real paced rate (600 × 0.9 = 9/s) served.
 */
import { writeFileSync } from 'node:fs';
import postgres from 'postgres';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gql, SUBMIT_JOBS } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, startSluiceFor, type SluiceHandle } from './lib/sluice.ts';
import { check, round, sleep } from './lib/stats.ts';
import { simulatorKeyStats, startStandaloneSimulator, type StandaloneSimulator } from './lib/standalone-simulator.ts';
import type { ConditionsPatch } from '../src/simulator/options.ts';

export const description =
  'the pace against a provider without rate-limit headers (600/min then 6,000/min; configured 1,200/min), a retry-after of 999999999 under RETRY_AFTER_MAX_SECONDS, and the first minute against the real simulator at half the configured window';

const API_KEY = 'apv_bench_provider_trust';
const CONFIGURED = 1200;
const FRACTION = 0.9;
const CONFIGURED_PACED_PER_S = (CONFIGURED * FRACTION) / 60;

interface Sample {
  /** Seconds since the phase's clock started. */
  t: number;
  succeeded: number;
  calls: number;
  r429: number;
  ratePerMinute: number | null;
  reason: string | null;
  /** Seconds left of the window's pause, 0 when not paused. */
  pausedForS: number;
}

interface Rig {
  sim: StandaloneSimulator;
  sluice: SluiceHandle;
  sql: postgres.Sql;
  url: string;
  apiKey: string;
  close(): Promise<void>;
}

async function rig(pg: BenchPostgres, label: string, sim: { ratePerMinute: number; cooldownS: number; conditions: ConditionsPatch }, env: Record<string, string> = {}): Promise<Rig> {
  const db = await freshDatabase(pg.adminUrl, `trust${label.replace(/-/g, '')}`);
  const s = await startStandaloneSimulator({ apiKey: API_KEY, ratePerMinute: sim.ratePerMinute, cooldownS: sim.cooldownS, latencyMs: 100 });
  await s.patch(sim.conditions);
  const sluice = await startSluiceFor(
    {
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: API_KEY,
      APIVERVE_BASE_URL: s.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: String(CONFIGURED),
      PACE_FRACTION: String(FRACTION),
      INITIAL_LATENCY_MS: '100',
      BATCH_MAX: '1',
      ...env,
    },
    'child',
  );
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  const tenant = await createTenant(sluice.url!, ADMIN_TOKEN, 'importer', { weight: 1, concurrencyCap: 1000, monthlyQuota: 10_000_000, queueBound: 100_000 });
  return {
    sim: s,
    sluice,
    sql,
    url: sluice.url!,
    apiKey: tenant.apiKey,
    close: async () => {
      await sql.end();
      await sluice.stop();
      await s.stop();
      await db.drop();
    },
  };
}

/** A backlog of `total` distinct jobs (1,000 per submission). */
async function fill(r: Rig, total: number, tag: string): Promise<void> {
  for (let i = 0; i < total; i += 1000) {
    const jobs = Array.from({ length: Math.min(1000, total - i) }, (_, k) => ({ api: 'dnslookup', params: { domain: `${tag}${i + k}.example` } }));
    await gql(r.url, r.apiKey, SUBMIT_JOBS, { i: { jobs } });
  }
}

async function sampleOnce(r: Rig, t0: number): Promise<Sample> {
  const [[done], stats, [w]] = await Promise.all([
    r.sql`select count(*)::int as n from jobs where state = 'SUCCEEDED'`,
    simulatorKeyStats(r.sim.adminUrl, API_KEY),
    r.sql`select rate_per_minute, pace_reason, greatest(0, extract(epoch from (paused_until - now())))::float8 as paused_for from windows where name = 'primary'`,
  ]);
  return {
    t: round((Date.now() - t0) / 1000, 2),
    succeeded: done!.n as number,
    calls: stats.calls,
    r429: stats.rateLimited,
    ratePerMinute: w!.rate_per_minute === null ? null : round(w!.rate_per_minute as number, 1),
    reason: w!.pace_reason as string | null,
    pausedForS: round((w!.paused_for as number | null) ?? 0, 2),
  };
}

/** Samples every `everyMs` until `untilS` on the phase's clock. */
async function sampleUntil(r: Rig, t0: number, untilS: number, everyMs: number, into: Sample[], label: string): Promise<void> {
  let next = Date.now();
  while (Date.now() - t0 < untilS * 1000) {
    next += everyMs;
    await sleep(Math.max(0, next - Date.now()));
    const s = await sampleOnce(r, t0);
    into.push(s);
    if (into.length % Math.round(10_000 / everyMs) === 0) progress(`[provider-trust] ${label} t=${Math.round(s.t)}s succeeded ${s.succeeded} calls ${s.calls} 429s ${s.r429} rate ${s.ratePerMinute} ${s.reason ?? ''}${s.pausedForS > 0 ? ` paused ${s.pausedForS}s` : ''}`);
  }
}

/** The sample nearest to `t` seconds (at or after it). */
function at(samples: readonly Sample[], t: number): Sample {
  return samples.find((s) => s.t >= t) ?? samples[samples.length - 1]!;
}

/** Succeeded per second between two instants of the phase's clock. */
function servedPerS(samples: readonly Sample[], from: number, to: number): number {
  const a = at(samples, from);
  const b = at(samples, to);
  return b.t > a.t ? (b.succeeded - a.succeeded) / (b.t - a.t) : 0;
}

async function headerless(pg: BenchPostgres, lowS: number, highS: number, svg: string | null) {
  const r = await rig(pg, 'headerless', { ratePerMinute: 600, cooldownS: 1, conditions: { rateLimitHeaders: false } });
  try {
    const t0 = Date.now();
    await fill(r, Math.ceil(10 * lowS + CONFIGURED_PACED_PER_S * highS * 1.3) + 500, 'hl');
    progress(`[provider-trust] headerless: backlog queued; 600/min without headers for ${lowS} s`);
    const samples: Sample[] = [];
    await sampleUntil(r, t0, lowS, 1000, samples, 'headerless');
    const rise = (Date.now() - t0) / 1000;
    await r.sim.patch({ ratePerMinute: 6000 });
    progress(`[provider-trust] headerless: the real window rises to 6,000/min at t=${round(rise, 1)} s`);
    await sampleUntil(r, t0, rise + highS, 1000, samples, 'headerless');
    const low = servedPerS(samples, 0, rise);
    // After the rise: the first second from which the served rate over the next 5 s is ≥ 85 % of the configured paced rate.
    let reachedAfterS: number | null = null;
    for (const s of samples) {
      if (s.t < rise || s.t + 5 > rise + highS) continue;
      if (servedPerS(samples, s.t, s.t + 5) >= 0.85 * CONFIGURED_PACED_PER_S) {
        reachedAfterS = round(s.t - rise, 1);
        break;
      }
    }
    const lastTen = servedPerS(samples, rise + highS - 10, rise + highS);
    if (svg) writeFileSync(svg, plot(samples, rise));
    return {
      servedWhileLowPerS: round(low, 2),
      shareOfRealLimitWhileLow: round(low / 10, 3),
      reachedConfiguredShareAfterRiseS: reachedAfterS,
      servedLast10sPerS: round(lastTen, 2),
      shareOfConfiguredPacedLast10s: round(lastTen / CONFIGURED_PACED_PER_S, 3),
      rateLimited429: samples[samples.length - 1]!.r429,
      riseAtS: round(rise, 1),
      timeline: samples.map((s) => [s.t, s.succeeded, s.r429, s.ratePerMinute, s.reason]),
    };
  } finally {
    await r.close();
  }
}

async function cappedAsk(pg: BenchPostgres, cap: number, durationS: number) {
  const r = await rig(pg, 'capped-ask', { ratePerMinute: 600, cooldownS: 1, conditions: { rateLimitHeaders: false, rateLimitRetryAfterSeconds: 999_999_999 } }, { RETRY_AFTER_MAX_SECONDS: String(cap) });
  try {
    const t0 = Date.now();
    await fill(r, 2000, 'ca');
    const samples: Sample[] = [];
    await sampleUntil(r, t0, durationS, 250, samples, 'capped-ask');
    const [asked] = await r.sql`select capped_ask_seconds from windows where name = 'primary'`;
    // Each pause's end: the calls in the 2 s after it (the probe).
    const probes: number[] = [];
    for (let i = 1; i < samples.length; i++) {
      if (samples[i - 1]!.pausedForS > 0 && samples[i]!.pausedForS === 0) {
        const end = samples[i]!;
        const later = at(samples, end.t + 2);
        if (later.t - end.t >= 1.75) probes.push(later.calls - end.calls);
      }
    }
    const pauses = samples.filter((s, i) => s.pausedForS > 0 && (i === 0 || samples[i - 1]!.pausedForS === 0)).length;
    const firstPauseEnd = samples.findIndex((s, i) => i > 0 && samples[i - 1]!.pausedForS > 0 && s.pausedForS === 0);
    const succeededAfterFirstPause = firstPauseEnd < 0 ? 0 : samples[samples.length - 1]!.succeeded - samples[firstPauseEnd]!.succeeded;
    return {
      capS: cap,
      askedSeconds: (asked?.capped_ask_seconds as number | null) ?? null,
      longestPauseSeenS: round(Math.max(0, ...samples.map((s) => s.pausedForS)), 2),
      pauses,
      callsIn2sAfterEachPause: probes,
      succeededAfterFirstPause,
      rateLimited429: samples[samples.length - 1]!.r429,
      calls: samples[samples.length - 1]!.calls,
      timeline: samples.map((s) => [s.t, s.succeeded, s.calls, s.r429, s.ratePerMinute, s.reason, s.pausedForS]),
    };
  } finally {
    await r.close();
  }
}

async function slowStart(pg: BenchPostgres) {
  const r = await rig(pg, 'slow-start', { ratePerMinute: 600, cooldownS: 50, conditions: {} });
  try {
    const filling = fill(r, 1500, 'ss');
    // The minute counts from the first call the provider saw.
    let t0 = 0;
    while (!t0) {
      const s = await simulatorKeyStats(r.sim.adminUrl, API_KEY);
      if (s.calls > 0) t0 = Date.now();
      else await sleep(20);
    }
    await filling;
    const samples: Sample[] = [];
    await sampleUntil(r, t0, 60, 1000, samples, 'slow-start');
    const last = samples[samples.length - 1]!;
    const stats = await simulatorKeyStats(r.sim.adminUrl, API_KEY);
    const realPacedPerS = (600 * FRACTION) / 60;
    const served = last.succeeded / last.t;
    return {
      firstMinuteServedPerS: round(served, 2),
      shareOfRealPacedFirstMinute: round(served / realPacedPerS, 3),
      rateLimited429: stats.rateLimited,
      callsInCooldown: stats.callsInCooldown,
      timeline: samples.map((s) => [s.t, s.succeeded, s.r429, s.ratePerMinute, s.reason]),
    };
  } finally {
    await r.close();
  }
}

/** The headerless phase as an SVG: the learned rate and the served rate (calls/min), the real and configured limits. */
function plot(samples: readonly Sample[], rise: number): string {
  const W = 720;
  const H = 320;
  const pad = { l: 56, r: 16, t: 28, b: 40 };
  const tMax = samples[samples.length - 1]!.t;
  const yMax = 1400;
  const x = (t: number) => pad.l + ((W - pad.l - pad.r) * t) / tMax;
  const y = (v: number) => pad.t + (H - pad.t - pad.b) * (1 - Math.min(v, yMax) / yMax);
  const served = samples.slice(1).map((s, i) => {
    const a = samples[Math.max(0, i - 2)]!;
    return [s.t, s.t > a.t ? ((s.succeeded - a.succeeded) / (s.t - a.t)) * 60 : 0] as const;
  });
  const path = (pts: ReadonlyArray<readonly [number, number]>) => pts.map(([t, v], i) => `${i ? 'L' : 'M'}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
  const rate = samples.filter((s) => s.ratePerMinute !== null).map((s) => [s.t, s.ratePerMinute!] as const);
  const real = [[0, 600], [rise, 600], [rise, yMax], [tMax, yMax]] as const;
  const grid = [0, 300, 600, 900, 1200].map((v) => `<line x1="${pad.l}" x2="${W - pad.r}" y1="${y(v)}" y2="${y(v)}" stroke="#ddd"/><text x="${pad.l - 6}" y="${y(v) + 4}" text-anchor="end">${v}</text>`).join('');
  const ticks = Array.from({ length: Math.floor(tMax / 20) + 1 }, (_, i) => i * 20).map((t) => `<text x="${x(t)}" y="${H - pad.b + 16}" text-anchor="middle">${t}</text>`).join('');
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="#fff"/>
<text x="${pad.l}" y="16" font-size="13">Provider without rate-limit headers: 600/min, then 6,000/min at ${Math.round(rise)} s (Sluice configured 1,200/min)</text>
${grid}${ticks}
<text x="${(W + pad.l) / 2}" y="${H - 6}" text-anchor="middle">seconds</text>
<text x="14" y="${(H - pad.b + pad.t) / 2}" transform="rotate(-90 14 ${(H - pad.b + pad.t) / 2})" text-anchor="middle">calls per minute</text>
<path d="${path(real)}" fill="none" stroke="#999" stroke-dasharray="4 3"/>
<line x1="${pad.l}" x2="${W - pad.r}" y1="${y(CONFIGURED * FRACTION)}" y2="${y(CONFIGURED * FRACTION)}" stroke="#c60" stroke-dasharray="2 3"/>
<path d="${path(served)}" fill="none" stroke="#2a7" stroke-width="1.5"/>
<path d="${path(rate)}" fill="none" stroke="#36c" stroke-width="2"/>
<g transform="translate(${W - pad.r - 250},${pad.t + 8})">
<line x2="18" stroke="#36c" stroke-width="2"/><text x="24" y="4">learned rate (windows.rate_per_minute)</text>
<line y1="16" y2="16" x2="18" stroke="#2a7" stroke-width="1.5"/><text x="24" y="20">served (jobs succeeded, 3 s mean)</text>
<line y1="32" y2="32" x2="18" stroke="#999" stroke-dasharray="4 3"/><text x="24" y="36">the provider's real limit</text>
<line y1="48" y2="48" x2="18" stroke="#c60" stroke-dasharray="2 3"/><text x="24" y="52">configured paced rate (1,200 × 0.9)</text>
</g>
</svg>
`;
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const lowS = flags.number('low', 60);
  const highS = flags.number('high', 60);
  const cap = flags.number('cap', 10);
  const askS = flags.number('ask-duration', 40);
  const svg = flags.optionalString('svg') ?? null;
  const phases = new Set((flags.optionalString('phases') ?? 'headerless,capped-ask,slow-start').split(','));
  flags.done();
  const hl = phases.has('headerless') ? await headerless(pg, lowS, highS, svg) : null;
  const ca = phases.has('capped-ask') ? await cappedAsk(pg, cap, askS) : null;
  const ss = phases.has('slow-start') ? await slowStart(pg) : null;
  const summary = {
    headerless: hl && { shareOfRealLimitWhileLow: hl.shareOfRealLimitWhileLow, reachedConfiguredShareAfterRiseS: hl.reachedConfiguredShareAfterRiseS, shareOfConfiguredPacedLast10s: hl.shareOfConfiguredPacedLast10s, rateLimited429: hl.rateLimited429 },
    cappedAsk: ca && { askedSeconds: ca.askedSeconds, capS: ca.capS, longestPauseSeenS: ca.longestPauseSeenS, callsIn2sAfterEachPause: ca.callsIn2sAfterEachPause, succeededAfterFirstPause: ca.succeededAfterFirstPause },
    slowStart: ss && { shareOfRealPacedFirstMinute: ss.shareOfRealPacedFirstMinute, rateLimited429: ss.rateLimited429, callsInCooldown: ss.callsInCooldown },
  };
  const targets: Record<string, ReturnType<typeof check>> = {};
  if (hl) {
    targets.servedWhileLow = check(hl.shareOfRealLimitWhileLow, '>= 0.60 of the real limit (600/min) served while it is low, without headers', hl.shareOfRealLimitWhileLow >= 0.6);
    targets.afterRise = check(hl.reachedConfiguredShareAfterRiseS, '>= 0.85 of the configured paced rate (18/s) within 60 s after the rise', hl.reachedConfiguredShareAfterRiseS !== null && hl.reachedConfiguredShareAfterRiseS <= 60);
  }
  if (ca) {
    targets.cappedPause = check(ca.longestPauseSeenS, `a retry-after of 999999999 pauses at most RETRY_AFTER_MAX_SECONDS (${cap} s)`, ca.askedSeconds === 999_999_999 && ca.longestPauseSeenS <= cap + 0.5);
    targets.probe = check(Math.max(0, ...ca.callsIn2sAfterEachPause), 'after each capped pause, one probe call (at most 2 in the next 2 s), and dispatch goes on', ca.callsIn2sAfterEachPause.length > 0 && Math.max(...ca.callsIn2sAfterEachPause) <= 2 && ca.succeededAfterFirstPause > 0);
  }
  if (ss) {
    targets.noCooldown = check(ss.rateLimited429, 'no cooldown tripped in the first minute (0 429s)', ss.rateLimited429 === 0 && ss.callsInCooldown === 0);
    targets.firstMinute = check(ss.shareOfRealPacedFirstMinute, '>= 0.85 of the real paced rate (9/s) over the first minute', ss.shareOfRealPacedFirstMinute >= 0.85);
  }
  return {
    summary,
    targets,
    setup: {
      sluice: `configured ${CONFIGURED}/min, PACE_FRACTION ${FRACTION}, single calls (BATCH_MAX=1), learned pace and slow start at their defaults`,
      headerless: `standalone simulator at 600/min (burst 30) for ${lowS} s, then 6,000/min for ${highS} s; no x-rate-limit-* headers; cooldown 1 s (a 429 says retry-after: 1); latency 100 ms`,
      cappedAsk: `the same provider at 600/min asking retry-after: 999999999 on every rate-limit 429; RETRY_AFTER_MAX_SECONDS ${cap}; ${askS} s`,
      slowStart: 'standalone simulator at 600/min with headers, 50 s cooldown, latency 100 ms; the first minute from the first call',
    },
    runs: { headerless: hl, cappedAsk: ca, slowStart: ss },
  };
}
