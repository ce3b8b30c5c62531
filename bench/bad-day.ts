/**
 * `npm run bench -- bad-day`: the fairness scenario with a median latency of
 * 2.5 s (p95 7.5 s by default). The pool must grow (Little's law on the
 * measured p95) and utilization must hold; no 429s.
 */
import type { FlagReader } from './lib/args.ts';
import type { BenchPostgres } from './lib/pg.ts';
import { runScenario, judge, type ScenarioConfig } from './lib/scenario.ts';
import { scenarioFromFlags } from './fairness.ts';
import { round } from './lib/stats.ts';

export const description = 'the fairness scenario at median latency 2.5 s: pool growth, utilization, 429s';

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const s = scenarioFromFlags(flags, { latencyMs: 2500, durationS: 90, label: 'bad-day' });
  flags.done();
  const cfg: ScenarioConfig = { ...s.base, label: 'bad-day', mode: 'fair', tenants: s.tenants({ A: s.cap, B: s.cap, C: s.cap }), durationS: s.durationS };
  const r = await runScenario(pg, cfg);
  const targets = judge(r, { utilizationTarget: 0.98, judgeLate: false, judgeRatio: false });
  const pool = r.pool as { samples: Array<readonly [number, number | null, number | null, number | null]>; min: number; max: number };
  const up = r.upstream as { utilization: number | null; utilizationInclStart: number; rateLimited429: number; observedLatencyMs: { p50: number; p95: number; mean: number } | null; callsPerSecond: number[] };
  const pacedPerS = (cfg.ratePerMinute * cfg.paceFraction) / 60;
  const meanS = (up.observedLatencyMs?.mean ?? cfg.latencyMs) / 1000;
  const late = r.late as { completionS: number | null; idealS: number; idealOwnLatencyS: number | null };
  const ratio = (r.tenants as { ratio: unknown }).ratio;
  const summary = {
    utilization: up.utilization,
    utilizationInclStart: up.utilizationInclStart,
    rateLimited429: up.rateLimited429,
    poolSize: { first: pool.samples[0]?.[1] ?? null, min: pool.min, max: pool.max, last: pool.samples[pool.samples.length - 1]?.[1] ?? null },
    poolOverTime: pool.samples.filter((_, i) => i % 5 === 0 || i === pool.samples.length - 1).map((x) => [x[0], x[1]]),
    littlesLawNeed: {
      meanInFlightNeeded: round(pacedPerS * meanS, 1),
      formula: `paced ${round(pacedPerS, 2)}/s × mean observed latency ${round(meanS, 3)} s`,
      poolAtP95: round(pacedPerS * ((up.observedLatencyMs?.p95 ?? cfg.latencyP95Ms) / 1000), 1),
    },
    observedLatencyMs: up.observedLatencyMs,
    bCompletionS: late.completionS,
    bIdealS: late.idealS,
    bIdealOwnLatencyS: late.idealOwnLatencyS,
    aToC: ratio,
  };
  return { summary, targets, runs: { badDay: { ...r, targets } } };
}
