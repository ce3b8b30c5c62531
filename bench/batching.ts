/**
 * `npm run bench -- batching`: --jobs N (4,000; the figure is
 * 20,000) across 20 tenants, 20 % of them duplicates (same api + params within
 * a tenant), on an unlimited window (APIVERVE_PLAN=MEGA: no per-minute limit,
 * 50 concurrent calls) with 0.6 s simulator latency. Twice, each on a fresh
 * database and Sluice process: batching on (default BATCH_MAX) and off
 * (BATCH_MAX=1).
 *
 * Dedup happens within one lease of one tenant's queue (dispatch/batching.ts
 * dedupKey = api + stable params, grouped per lease), so each duplicate is
 * generated in the same tenant, right after its original, inside blocks of
 * --block (100) jobs that are submitted in order in one submitJobs; every
 * unique input is unique across the whole tenant (domain names carry the tenant
 * and index), so "unique inputs" = distinct (tenant, api, params) = N × 0.8.
 *
 * Reported: credits (simulator creditsBilled; the ledger's billed sum),
 * upstream HTTP requests and items (calls), time to drain (first submission
 * sent → last job finished, Postgres finished_at).
 */
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gqlRaw, submitBody, type JobSpec } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, mapLimit, round, sleep, type Check } from './lib/stats.ts';

export const description = 'N jobs, 20 tenants, 20% duplicates, MEGA window, 0.6 s latency: credits, upstream calls and drain time, batching on vs off';

const COST = 1; // dnslookup

interface Plan {
  tenants: number;
  perTenant: JobSpec[][];
  unique: number;
  duplicates: number;
}

function plan(jobs: number, tenants: number, dupShare: number, block: number): Plan {
  const perTenant: JobSpec[][] = [];
  let unique = 0;
  let duplicates = 0;
  for (let t = 0; t < tenants; t++) {
    const n = Math.floor(jobs / tenants) + (t < jobs % tenants ? 1 : 0);
    const list: JobSpec[] = [];
    let u = 0;
    for (let b = 0; b < n; b += block) {
      const size = Math.min(block, n - b);
      const dups = Math.round(size * dupShare);
      const origs = size - dups;
      // originals, each followed by its duplicate while duplicates remain (a pair is never split across blocks)
      for (let i = 0; i < origs; i++) {
        const job: JobSpec = { api: 'dnslookup', params: { domain: `t${t}-h${u++}.example.org` }, priority: 'STANDARD' };
        list.push(job);
        unique++;
        if (i < dups) {
          list.push({ ...job, params: { ...job.params } });
          duplicates++;
        }
      }
    }
    perTenant.push(list);
  }
  return { tenants, perTenant, unique, duplicates };
}

async function once(pg: BenchPostgres, label: string, p: Plan, o: { latencyMs: number; batchMax: string | null; maxS: number; mode: 'child' | 'inproc'; extraEnv: Record<string, string>; block: number }) {
  const db = await freshDatabase(pg.adminUrl, `batching${label}`);
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  try {
    sim = await startSimulator({ plan: 'MEGA', ratePerMinute: null, latencyMs: o.latencyMs, latencyP95Ms: o.latencyMs * 3, seed: 1, credits: 100_000_000, maxCredits: 100_000_000 });
    const env: Record<string, string> = {
      DATABASE_URL: db.url,
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'MEGA',
      ...(o.batchMax !== null ? { BATCH_MAX: o.batchMax } : {}),
      ...o.extraEnv,
    };
    sluice = await startSluiceFor(env, o.mode);
    const url = sluice.url!;
    progress(`[${label}] Sluice (${sluice.mode}, pid ${sluice.pid}) BATCH_MAX=${o.batchMax ?? 'default'}; simulator MEGA, latency ${o.latencyMs} ms`);
    const keys: string[] = [];
    for (let t = 0; t < p.tenants; t++) keys.push((await createTenant(url, ADMIN_TOKEN, `batch-${t}`, { weight: 1, concurrencyCap: 500, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 })).apiKey);
    // One submitJobs per block of a tenant, a tenant's blocks in order; tenants in parallel.
    const bodies = p.perTenant.map((list) => {
      const out: string[] = [];
      for (let i = 0; i < list.length; i += o.block) out.push(submitBody(list.slice(i, i + o.block)));
      return out;
    });
    const total = p.perTenant.reduce((n, l) => n + l.length, 0);
    const cpu = cpuMeter();
    sim.resetStats();
    const t0 = Date.now();
    let submitError: unknown = null;
    const submitting = mapLimit(bodies, p.tenants, async (list, t) => {
      for (const b of list) await gqlRaw(url, keys[t]!, b);
    }).catch((e) => (submitError = e));
    let stop = 'drained';
    let lastLog = 0;
    for (;;) {
      await sleep(300);
      if (submitError) throw submitError;
      const [r] = await sql`select count(*) filter (where finished_at is not null)::int as done, count(*)::int as n from jobs`;
      if (Date.now() - lastLog > 5000) {
        lastLog = Date.now();
        progress(`[${label}] t=${((Date.now() - t0) / 1000).toFixed(0)}s finished ${r!.done}/${total} (stored ${r!.n})`);
      }
      if (r!.done >= total) break;
      if (Date.now() - t0 > o.maxS * 1000) {
        stop = 'maxS safety stop';
        break;
      }
    }
    await submitting;
    const machineBusy = cpu.end();
    const stats = sim.stats();
    const stopped = await sluice.stop();
    sluice = null;
    const [fin] = await sql`select extract(epoch from max(finished_at)) * 1000 as last, count(*) filter (where state = 'SUCCEEDED')::int as ok, count(*) filter (where state <> 'SUCCEEDED')::int as bad from jobs`;
    const [led] = await sql`select coalesce(sum(billed),0)::bigint as billed, (select coalesce(sum(reserved),0) from sched_tenants)::bigint as reserved, coalesce(sum(refunded),0)::bigint as refunded from tenant_ledger`;
    const [res] = await sql`select count(*)::int as n, coalesce(sum(billed),0)::bigint as billed, count(*) filter (where billed > 0)::int as billed_rows from reservations`;
    const outcomes = await sql`select coalesce(outcome, 'open') as o, count(*)::int as n from reservations group by 1 order by 2 desc`;
    // Billed duplicates: within a tenant, an input (params) billed more than once.
    const [dupBilled] = await sql`
      select coalesce(sum(n - 1), 0)::int as extra from (
        select j.tenant_id, j.params::text as p, count(*)::int as n
        from reservations r join jobs j on j.id = r.job_id where r.billed > 0 group by 1, 2 having count(*) > 1) x`;
    const k = stats.keys[sim.apiKey]!;
    return {
      label,
      batchMax: o.batchMax ?? 'default (200)',
      stopReason: stop,
      jobs: total,
      succeeded: fin!.ok as number,
      notSucceeded: fin!.bad as number,
      drainS: fin!.last === null ? null : round((Number(fin!.last) - t0) / 1000, 2),
      creditsBilledBySimulator: k.creditsBilled,
      billedCallsBySimulator: k.billedCalls,
      ledger: { billed: Number(led!.billed), reserved: Number(led!.reserved), refunded: Number(led!.refunded) },
      reservations: { rows: res!.n as number, billed: Number(res!.billed), billedRows: res!.billed_rows as number, outcomes: Object.fromEntries(outcomes.map((r) => [r.o as string, r.n as number])) },
      billedDuplicateInputs: dupBilled!.extra as number,
      upstream: { httpRequests: k.httpRequests, items: k.calls, itemsPerRequest: round(k.calls / Math.max(1, k.httpRequests), 2), responses: k.responses, batchItems: k.batchItems, maxConcurrency: k.maxConcurrency, rateLimited: k.rateLimited, concurrencyLimited: k.concurrencyLimited },
      noise: { machineCpuBusy: machineBusy, sluiceProcessCpu: stopped },
    };
  } finally {
    if (sluice) await sluice.stop().catch(() => null);
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sim) await sim.stop();
    await db.drop();
  }
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const jobs = flags.number('jobs', 4000);
  const tenants = flags.number('tenants', 20);
  const dupShare = flags.number('dup-share', 0.2);
  const block = flags.number('block', 100);
  const latencyMs = flags.number('latency', 600);
  const maxS = flags.number('max', 600);
  const phases = flags.string('phases', 'on,off').split(',').map((s) => s.trim());
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();
  const p = plan(jobs, tenants, dupShare, block);
  const base = { latencyMs, maxS, mode, extraEnv, block };
  const runs: Record<string, Awaited<ReturnType<typeof once>>> = {};
  if (phases.includes('on')) runs.on = await once(pg, 'on', p, { ...base, batchMax: null });
  if (phases.includes('off')) runs.off = await once(pg, 'off', p, { ...base, batchMax: '1' });
  const target = p.unique * COST;
  const on = runs.on;
  const off = runs.off;
  const targets: Record<string, Check> = {};
  if (on) {
    targets.creditsSpentOn = check(on.creditsBilledBySimulator, `== unique inputs × cost = ${p.unique} × ${COST} = ${target} (simulator creditsBilled, batching on)`, on.creditsBilledBySimulator === target);
    targets.ledgerBilledOn = check(on.ledger.billed, `== ${target} (tenant_ledger billed, batching on)`, on.ledger.billed === target);
    targets.billedDuplicatesOn = check(on.billedDuplicateInputs, '== 0 (no input billed twice within a tenant)', on.billedDuplicateInputs === 0);
    targets.allSucceededOn = check(on.notSucceeded, '== 0 (every job succeeded)', on.notSucceeded === 0 && on.stopReason === 'drained');
  }
  if (off) {
    targets.creditsSpentOff = check(off.creditsBilledBySimulator, `reported: without batching every job is billed (${p.unique + p.duplicates})`, null);
    targets.allSucceededOff = check(off.notSucceeded, '== 0', off.notSucceeded === 0 && off.stopReason === 'drained');
  }
  const summary = {
    jobs,
    tenants,
    uniqueInputs: p.unique,
    duplicates: p.duplicates,
    expectedCreditsBatched: target,
    on: on && { creditsSimulator: on.creditsBilledBySimulator, ledgerBilled: on.ledger.billed, httpRequests: on.upstream.httpRequests, items: on.upstream.items, drainS: on.drainS },
    off: off && { creditsSimulator: off.creditsBilledBySimulator, ledgerBilled: off.ledger.billed, httpRequests: off.upstream.httpRequests, items: off.upstream.items, drainS: off.drainS },
    ratios: on && off ? { credits: round(on.creditsBilledBySimulator / Math.max(1, off.creditsBilledBySimulator), 3), httpRequests: round(on.upstream.httpRequests / Math.max(1, off.upstream.httpRequests), 4), drain: on.drainS && off.drainS ? round(on.drainS / off.drainS, 3) : null, note: 'on ÷ off' } : null,
  };
  return {
    summary,
    targets,
    setup: {
      note: `${jobs} jobs by default (--jobs 20000 for the issue's full figure; unbatched that takes ~240 s at 0.6 s × 50 concurrent calls)`,
      dupShare,
      duplicates: 'each duplicate right after its original, same tenant, inside one block of --block jobs sent as one submitJobs; originals unique across the tenant (dnslookup domain t<tenant>-h<i>)',
      block,
      api: 'dnslookup, 1 credit',
      plan: 'APIVERVE_PLAN=MEGA (no per-minute limit, 50 concurrent calls), simulator MEGA',
      latencyMedianMs: latencyMs,
      tenantCap: 500,
      sluice: { mode, extraEnv },
    },
    runs,
  };
}
