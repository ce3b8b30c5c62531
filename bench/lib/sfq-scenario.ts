/**
 * The staggered 8-tenant shape of `fairness`'s `sfq` phase: lag against start-time fair
 * queueing's bound (src/scheduler/sfq-lag.ts), from an idle start, batching on.
 *
 * Plan 4,000/min paced at 0.9 (60/s), calls of ~100 ms (simulator median), concurrency 500 (never
 * binds). Weights 1, 1, 2, 2, 3, 4, 6, 8, caps 500 (never bind), every job a distinct dnslookup
 * (batches; `--env BATCH_DISABLED_APIS=dnslookup` for single calls):
 *   t=0   A1 (w1), C2 (w2), G6 (w6): long backlogs; P4 (w4) submits 6 jobs every 3 s throughout
 *   t=5s  B1 (w1) long backlog; E3 (w3) a finite backlog of 150
 *   t=10s D2 (w2), H8 (w8) long backlogs
 * A tenant is backlogged from when its submission's jobs became visible to the scheduler (the
 * answer to the submission, or the first of them to start if that came first: on a loaded machine
 * the answer can trail the commit by seconds) to the lease that took its last waiting job; a job's service instant is its
 * `startedAt`, when its turn was decided (a turn's jobs share it). Pairs backlogged together are measured over
 * every sub-interval; the bound is 1/w_i + 1/w_j + P/W (see sfq-lag.ts), batching or not: in a
 * paced window a batch turn is held to the fair limit like any other.
 */
import { writeFileSync } from 'node:fs';
import postgres from 'postgres';
import type { Simulator } from '../../src/simulator/index.ts';
import { sfqLag, type BackloggedTenant, type ServedJobs, type SfqLagReport } from '../../src/scheduler/sfq-lag.ts';
import { createTenant, gqlRaw, submitBody, type JobSpec } from './gql.ts';
import { progress } from './log.ts';
import { cpuMeter } from './machine.ts';
import { freshDatabase, type BenchPostgres } from './pg.ts';
import { ADMIN_TOKEN, startPacedProvider, startSluiceFor } from './sluice.ts';
import { check, round, sleep, type Check } from './stats.ts';

interface Plan {
  tag: string;
  weight: number;
  atMs: number;
  jobs: number;
  /** Submit `jobs` every this many ms (from atMs) instead of once. */
  everyMs?: number;
}

const PLANS: Plan[] = [
  // Long backlogs: several times what the tenant's share of 60/s serves in the run.
  { tag: 'A1', weight: 1, atMs: 0, jobs: 400 },
  { tag: 'C2', weight: 2, atMs: 0, jobs: 600 },
  { tag: 'G6', weight: 6, atMs: 0, jobs: 1500 },
  { tag: 'P4', weight: 4, atMs: 0, jobs: 6, everyMs: 3000 },
  { tag: 'B1', weight: 1, atMs: 5000, jobs: 400 },
  { tag: 'E3', weight: 3, atMs: 5000, jobs: 150 },
  { tag: 'D2', weight: 2, atMs: 10_000, jobs: 600 },
  { tag: 'H8', weight: 8, atMs: 10_000, jobs: 1500 },
];

export interface SfqOptions {
  durationS: number;
  ratePerMinute: number;
  paceFraction: number;
  latencyMs: number;
  sluiceMode: 'child' | 'inproc';
  extraEnv: Record<string, string>;
  seed: number;
  /** Grid of the p99 over sub-intervals, ms. */
  gridMs: number;
  /** Write the raw measure (backlogs and served jobs, by tag) here as JSON. */
  dumpFile?: string;
}

function summarise(r: SfqLagReport, tagOf: (id: string) => string) {
  const pair = (p: SfqLagReport['pairs'][number]) => ({
    pair: `${tagOf(p.a)}/${tagOf(p.b)}`,
    lag: round(p.lag, 3),
    bound: round(p.bound, 3),
    leaseMost: p.leaseMost,
    fromS: round(p.from / 1000, 2),
    toS: round(p.to / 1000, 2),
  });
  return {
    worst: r.worst && pair(r.worst),
    withinBound: r.withinBound,
    pairsOverBound: r.pairs.filter((p) => p.lag > p.bound + 1e-9).map(pair),
    p99LagOverBound: r.p99LagOverBound === null ? null : round(r.p99LagOverBound, 3),
    steadyPairs: r.pairs.filter((p) => p.to - p.from >= 10_000).map(pair),
  };
}

export async function runSfq(pg: BenchPostgres, o: SfqOptions): Promise<{ result: Record<string, unknown>; targets: Record<string, Check> }> {
  const db = await freshDatabase(pg.adminUrl, 'sfq');
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  try {
    const rig = await startPacedProvider({ databaseUrl: db.url, ratePerMinute: o.ratePerMinute, paceFraction: o.paceFraction, latencyMs: o.latencyMs, latencyP95Ms: o.latencyMs * 3, seed: o.seed, extraEnv: o.extraEnv });
    sim = rig.sim;
    const env = rig.env;
    sluice = await startSluiceFor(env, o.sluiceMode);
    const url = sluice.url!;
    const tenants = new Map<string, { id: string; key: string; plan: Plan }>();
    for (const p of PLANS) {
      const t = await createTenant(url, ADMIN_TOKEN, `sfq-${p.tag}`, { weight: p.weight, concurrencyCap: 500, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 });
      tenants.set(p.tag, { id: t.id, key: t.apiKey, plan: p });
    }
    const tagOf = (id: string) => [...tenants.values()].find((t) => t.id === id)?.plan.tag ?? id;
    progress(`[sfq] Sluice (${sluice.mode}) at ${url}; ${o.ratePerMinute}/min paced ${o.paceFraction}, latency ${o.latencyMs} ms, ${o.durationS} s`);
    // Every submission: when it was answered (its jobs visible) and its idempotency-key prefix.
    const subs: Array<{ tag: string; prefix: string; ackMs: number }> = [];
    const endMs = o.durationS * 1000;
    const cpu = cpuMeter();
    sim.resetStats();
    const t0 = Date.now();
    let seq = 0;
    const submitter = async (p: Plan) => {
      const t = tenants.get(p.tag)!;
      for (let at = p.atMs; at < endMs; at += p.everyMs ?? Number.POSITIVE_INFINITY) {
        const wait = t0 + at - Date.now();
        if (wait > 0) await sleep(wait);
        const prefix = `${p.tag}.${seq++}`;
        const jobs: JobSpec[] = Array.from({ length: p.jobs }, (_, i) => ({
          api: 'dnslookup',
          params: { domain: `${prefix}-${i}.example.org` },
          priority: 'STANDARD',
          idempotencyKey: `${prefix}-${i}`,
        }));
        for (let i = 0; i < jobs.length; i += 10_000) await gqlRaw(url, t.key, submitBody(jobs.slice(i, i + 10_000)));
        subs.push({ tag: p.tag, prefix, ackMs: Date.now() - t0 });
      }
    };
    const submitting = Promise.all(PLANS.map(submitter));
    await sleep(endMs);
    await submitting;
    const machineBusy = cpu.end();
    await sluice.stop();
    sluice = null;
    const stats = sim.stats().keys[sim.apiKey]!;
    // Jobs by submission: service instants, and whether each submission was all taken.
    const rows = await sql`
      select split_part(idempotency_key, '-', 1) as prefix, tenant_id::text as tenant,
        extract(epoch from started_at) * 1000 - ${t0}::float8 as started_ms
      from jobs`;
    const served = new Map<string, ServedJobs>();
    const lastStart = new Map<string, number>();
    const firstStart = new Map<string, number>();
    const waiting = new Map<string, number>();
    for (const r of rows) {
      const prefix = r.prefix as string;
      if (r.started_ms === null) {
        waiting.set(prefix, (waiting.get(prefix) ?? 0) + 1);
        continue;
      }
      const at = Number(r.started_ms);
      const k = `${at}/${r.tenant}`;
      const cur = served.get(k);
      if (cur) cur.n++;
      else served.set(k, { at, tenantId: r.tenant as string, n: 1 });
      lastStart.set(prefix, Math.max(lastStart.get(prefix) ?? Number.NEGATIVE_INFINITY, at));
      firstStart.set(prefix, Math.min(firstStart.get(prefix) ?? Number.POSITIVE_INFINITY, at));
    }
    const measuredEnd = Math.max(...[...served.values()].map((e) => e.at));
    const backlogOf = (tag: string): Array<[number, number]> => {
      const ivs = subs
        .filter((s) => s.tag === tag)
        .map((s): [number, number] => [
          Math.min(s.ackMs, firstStart.get(s.prefix) ?? s.ackMs),
          (waiting.get(s.prefix) ?? 0) > 0 ? measuredEnd : (lastStart.get(s.prefix) ?? s.ackMs),
        ])
        .filter(([f, t]) => t > f)
        .sort((a, b) => a[0] - b[0]);
      const out: Array<[number, number]> = [];
      for (const iv of ivs) {
        const last = out[out.length - 1];
        if (last && iv[0] <= last[1]) last[1] = Math.max(last[1], iv[1]);
        else out.push([...iv]);
      }
      return out;
    };
    const batching = !(o.extraEnv.BATCH_DISABLED_APIS ?? '').split(',').includes('dnslookup');
    const backlogged: BackloggedTenant[] = [...tenants.values()].map((t) => ({ tenantId: t.id, weight: t.plan.weight, backlogged: backlogOf(t.plan.tag) }));
    const events = [...served.values()];
    const issueForm = sfqLag(backlogged, events, { gridStep: o.gridMs, minShareSpan: 10_000 });
    if (o.dumpFile) {
      const dump = { tenants: backlogged.map((b) => ({ ...b, tag: tagOf(b.tenantId) })), served: events.map((e) => ({ ...e, tag: tagOf(e.tenantId) })) };
      writeFileSync(o.dumpFile, JSON.stringify(dump));
    }
    // Utilisation: jobs started per second from 2 s (the start burst is the bucket) to the last
    // lease, against the paced rate.
    const paced = (o.ratePerMinute * o.paceFraction) / 60;
    const fromMs = 2000;
    const startedInWindow = events.filter((e) => e.at >= fromMs && e.at < measuredEnd).reduce((n, e) => n + e.n, 0);
    const utilization = startedInWindow / (paced * ((measuredEnd - fromMs) / 1000));
    const shareError = Object.fromEntries(Object.entries(issueForm.shareError).map(([id, e]) => [tagOf(id), round(e, 4)]));
    const worstShare = Object.values(shareError).reduce((m, e) => Math.max(m, Math.abs(e)), 0);
    const instants = new Map<number, number>();
    for (const e of events) instants.set(e.at, (instants.get(e.at) ?? 0) + e.n);
    const sizes = [...instants.values()].sort((a, b) => a - b);
    const result = {
      shape: PLANS,
      batching,
      pacedPerS: paced,
      measuredS: round(measuredEnd / 1000, 2),
      utilization: round(utilization, 4),
      rateLimited429: stats.rateLimited,
      upstreamCalls: stats.calls,
      upstreamHttpRequests: stats.httpRequests,
      // Service instants: one per turn (a job's startedAt is its turn's).
      turns: { count: sizes.length, jobsMedian: sizes[Math.floor(sizes.length / 2)] ?? null, jobsMax: sizes.at(-1) ?? null, firstTurnJobs: instants.get(Math.min(...instants.keys())) ?? null },
      backlogS: Object.fromEntries([...tenants.values()].map((t) => [t.plan.tag, backlogOf(t.plan.tag).map(([f, to]) => [round(f / 1000, 2), round(to / 1000, 2)])])),
      lagIssueForm: { formula: '1/w_i + 1/w_j + P/W', ...summarise(issueForm, tagOf) },
      shareErrorOverBacklog: shareError,
      lagByTenant: Object.fromEntries(Object.entries(issueForm.byTenant).map(([id, v]) => [tagOf(id), { lag: round(v.lag, 3), bound: round(v.bound, 3) }])),
      machineBusy,
    };
    const targets: Record<string, Check> = {
      lagWithinBound: check(
        issueForm.worst ? round(issueForm.worst.lag / issueForm.worst.bound, 3) : null,
        'worst lag / bound <= 1 for every pair and interval (bound 1/w_i + 1/w_j + P/W)',
        issueForm.withinBound,
      ),
      shareError: check(round(worstShare, 4), '<= 0.05 (tenants backlogged >= 10 s)', worstShare <= 0.05),
      utilization: check(round(utilization, 4), '>= 0.97', utilization >= 0.97),
      rateLimited429: check(stats.rateLimited, '== 0', stats.rateLimited === 0),
    };
    return { result, targets };
  } finally {
    if (sluice) await sluice.stop().catch(() => null);
    await sim?.stop().catch(() => {});
    await sql.end();
    await db.drop();
  }
}
