/**
 * `npm run bench -- reserved-share`: one tenant with `reservedShare` 0.3 among 50 equal tenants
 * (weight 1 each, caps 500: they never bind), a 4,000/min plan paced at 0.9 (60/s), 100 ms calls,
 * every job a distinct dnslookup (batching on; `--env BATCH_DISABLED_APIS=dnslookup` for single
 * calls). Every tenant's backlog is submitted before the clock starts; the reserved tenant's is
 * finite (450 jobs: ~25 s at 0.3 of 60/s), the others' last the whole run (`--duration`, 50 s).
 *
 * Two phases of one run, read from each job's `startedAt`:
 *   backlogged  the leases from the first to the one before the lease that took the reserved
 *               tenant's last job (it still had jobs waiting after each): its fraction of the jobs
 *               dispatched (target >= the reservation; by weight alone it would get 1/51), the
 *               same from 2 s (after the start burst), and the total rate against the pace;
 *   idle        from 1 s after that to the end: the others' total rate against the pace (the
 *               reservation is lent, nothing held back: utilisation >= 0.97).
 */
import postgres from 'postgres';
import type { Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gql, gqlRaw, submitBody, type JobSpec } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startPacedProvider, startSluiceFor } from './lib/sluice.ts';
import { check, round, sleep, type Check } from './lib/stats.ts';

export const description = 'one tenant reserving 0.3 among 50 equal tenants, paced 60/s: its share of dispatches while backlogged (>= 0.3), the others\' rate while it is idle (>= 0.97 of the pace)';

export async function run(pg: BenchPostgres, flags: FlagReader): Promise<{ summary: unknown; targets: Record<string, Check>; [k: string]: unknown }> {
  const o = {
    durationS: flags.number('duration', 50),
    ratePerMinute: flags.number('rate', 4000),
    paceFraction: flags.number('pace', 0.9),
    latencyMs: flags.number('latency', 100),
    others: flags.number('tenants', 50),
    share: flags.number('share', 0.3),
    reservedJobs: flags.number('reserved-jobs', 450),
    otherJobs: flags.number('other-jobs', 150),
    extraEnv: parseEnvFlag(flags.optionalString('env')),
    mode: flags.bool('inproc') ? ('inproc' as const) : ('child' as const),
  };
  const db = await freshDatabase(pg.adminUrl, 'reserved');
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  try {
    const rig = await startPacedProvider({ databaseUrl: db.url, ratePerMinute: o.ratePerMinute, paceFraction: o.paceFraction, latencyMs: o.latencyMs, latencyP95Ms: o.latencyMs * 3, seed: 30,
      // The subject is the share, not the pace: the window opens at its configured rate (a slow
      // start's ramp would count against the reserved tenant's jobs per second of the pace).
      extraEnv: { PACE_START: '1', ...o.extraEnv } });
    sim = rig.sim;
    const env = rig.env;
    // The backlogs go in through an API-only process; the dispatcher starts once they are all in,
    // so every tenant is backlogged from the first lease (the question is the share, not arrivals).
    sluice = await startSluiceFor({ ...env, SLUICE_ROLE: 'api' }, o.mode);
    let url = sluice.url!;
    const limits = { weight: 1, concurrencyCap: 500, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 };
    const reserved = await createTenant(url, ADMIN_TOKEN, 'reserved', limits);
    await gql(url, ADMIN_TOKEN, 'mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id reservedShare } }', { i: { id: reserved.id, reservedShare: o.share } });
    const others: Array<{ id: string; apiKey: string }> = [];
    for (let i = 0; i < o.others; i++) others.push(await createTenant(url, ADMIN_TOKEN, `equal-${i}`, limits));
    const submit = async (t: { id: string; apiKey: string }, n: number) => {
      const jobs: JobSpec[] = Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${t.id.slice(0, 8)}-${i}.example.org` }, priority: 'STANDARD' }));
      await gqlRaw(url, t.apiKey, submitBody(jobs));
    };
    await submit(reserved, o.reservedJobs);
    for (const t of others) await submit(t, o.otherJobs);
    await sluice.stop();
    sluice = await startSluiceFor(env, o.mode);
    url = sluice.url!;
    progress(`[reserved-share] Sluice (${sluice.mode}); ${o.others} equal tenants + one reserving ${o.share}; ${o.ratePerMinute}/min paced ${o.paceFraction}; ${o.durationS} s`);
    sim.resetStats();
    const t0 = Date.now();
    await sleep(o.durationS * 1000);
    await sluice.stop();
    sluice = null;
    const stats = sim.stats().keys[sim.apiKey]!;
    const rows = await sql`
      select tenant_id::text as tenant, extract(epoch from started_at) * 1000 - ${t0}::float8 as at, count(*)::int as n
      from jobs where started_at is not null group by 1, 2`;
    const events = rows.map((r) => ({ tenant: r.tenant as string, at: Number(r.at), n: r.n as number }));
    const first = Math.min(...events.map((e) => e.at));
    const last = Math.max(...events.map((e) => e.at));
    const reservedEvents = events.filter((e) => e.tenant === reserved.id);
    const reservedDone = reservedEvents.reduce((n, e) => n + e.n, 0) === o.reservedJobs;
    const reservedLast = Math.max(...reservedEvents.map((e) => e.at));
    const paced = (o.ratePerMinute * o.paceFraction) / 60;
    const sum = (xs: typeof events) => xs.reduce((n, e) => n + e.n, 0);
    // Backlogged: the leases before the one that took the reserved tenant's last job (after each
    // of them it still had jobs waiting; the last one also served others after its backlog ran out).
    const during = events.filter((e) => e.at < reservedLast);
    const share = sum(during.filter((e) => e.tenant === reserved.id)) / sum(during);
    // The start burst (the bucket's tokens) is dispatched at once; the rate is judged from 2 s.
    const steady = during.filter((e) => e.at >= first + 2000);
    const steadyShare = sum(steady.filter((e) => e.tenant === reserved.id)) / sum(steady);
    const duringRate = sum(steady) / ((reservedLast - first - 2000) / 1000);
    const idleFrom = reservedLast + 1000;
    const idle = events.filter((e) => e.at >= idleFrom && e.at <= last);
    const idleS = (last - idleFrom) / 1000;
    const idleUtilization = idleS > 0 ? sum(idle) / (paced * idleS) : null;
    const othersLeft = (await sql`select count(*)::int as n from jobs where started_at is null and tenant_id <> ${reserved.id}`)[0]!.n as number;
    // The form: its jobs per second while backlogged against the paced rate.
    const ofPace = sum(during.filter((e) => e.tenant === reserved.id)) / (paced * ((reservedLast - first) / 1000));
    const summary = {
      tenants: o.others + 1,
      reservedShare: o.share,
      byWeightAlone: round(1 / (o.others + 1), 4),
      pacedPerS: paced,
      backlogged: {
        fromS: round(first / 1000, 2),
        toS: round(reservedLast / 1000, 2),
        jobs: sum(during),
        reservedFraction: round(share, 4),
        reservedOfPace: round(ofPace, 4),
        reservedFractionFrom2s: round(steadyShare, 4),
        utilizationFrom2s: round(duringRate / paced, 4),
      },
      idle: { fromS: round(idleFrom / 1000, 2), toS: round(last / 1000, 2), jobs: sum(idle), othersUtilization: idleUtilization === null ? null : round(idleUtilization, 4), othersStillWaiting: othersLeft },
      reservedDrained: reservedDone,
      rateLimited429: stats.rateLimited,
      upstreamCalls: stats.calls,
    };
    const targets: Record<string, Check> = {
      reservedOfPace: check(round(ofPace, 4), `>= ${o.share} of the pace while the reserved tenant is backlogged (its jobs per second / the paced rate)`, reservedDone ? ofPace >= o.share : null),
      reservedFraction: check(round(share, 4), `>= ${o.share} of the dispatches while the reserved tenant is backlogged`, reservedDone ? share >= o.share - 1e-9 : null),
      idleUtilization: check(idleUtilization === null ? null : round(idleUtilization, 4), '>= 0.97 of the pace while the reserved tenant is idle (the others borrow its share)', idleUtilization === null || othersLeft === 0 ? null : idleUtilization >= 0.97),
      rateLimited429: check(stats.rateLimited, '== 0', stats.rateLimited === 0),
    };
    return { summary, targets };
  } finally {
    if (sluice) await sluice.stop().catch(() => null);
    await sim?.stop().catch(() => {});
    await sql.end();
    await db.drop();
  }
}
