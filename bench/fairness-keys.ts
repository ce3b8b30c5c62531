/**
 * `npm run bench -- fairness-keys`: fairness keys inside one tenant (scheduler/fair-keys.ts).
 *
 * One tenant (weight 1, cap 500: never binds), plan 4,000/min paced at 0.9 (60/s, as the
 * `fairness` bench's sfq phase), calls of ~100 ms (simulator median), every job a distinct
 * dnslookup (batching on, as configured by default). The tenant submits 900 jobs of a big key; once
 * that submission is answered and `--small-after` seconds (default 2) have passed, 20 jobs of a
 * small key. Reported: the time from the small key's submission (the request sent) to its 20th
 * job done (finished_at), and the same with no keys at all (the FIFO baseline: the 20 wait behind
 * the big backlog). Each phase on a fresh database and a fresh Sluice process, in one run.
 */
import postgres from 'postgres';
import type { Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gqlRaw, submitBody, type JobSpec } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startPacedProvider, startSluiceFor } from './lib/sluice.ts';
import { check, round, sleep, type Check } from './lib/stats.ts';

export const description = "a small key's 20 jobs behind a big key's 900 in one tenant, paced 60/s: time to the 20th done, with fairness keys and without (FIFO)";

interface Options {
  ratePerMinute: number;
  paceFraction: number;
  latencyMs: number;
  bigJobs: number;
  smallJobs: number;
  smallAfterMs: number;
  maxS: number;
  sluiceMode: 'child' | 'inproc';
  extraEnv: Record<string, string>;
}

async function phase(pg: BenchPostgres, o: Options, keys: boolean) {
  const label = keys ? 'keys' : 'fifo';
  const db = await freshDatabase(pg.adminUrl, `fkeys${label}`);
  let sim: Simulator | null = null;
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  try {
    const rig = await startPacedProvider({ databaseUrl: db.url, ratePerMinute: o.ratePerMinute, paceFraction: o.paceFraction, latencyMs: o.latencyMs, latencyP95Ms: o.latencyMs * 3, seed: 3, extraEnv: o.extraEnv });
    sim = rig.sim;
    const env = rig.env;
    sluice = await startSluiceFor(env, o.sluiceMode);
    const url = sluice.url!;
    const t = await createTenant(url, ADMIN_TOKEN, `platform-${label}`, { weight: 1, concurrencyCap: 500, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 });
    const jobs = (tag: string, n: number, key: string): JobSpec[] =>
      Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}-${i}.example.org` }, idempotencyKey: `${tag}-${i}`, ...(keys ? { fairnessKey: key } : {}) }));
    const cpu = cpuMeter();
    const t0 = Date.now();
    await gqlRaw(url, t.apiKey, submitBody(jobs('big', o.bigJobs, 'customer-big')));
    const bigAnsweredMs = Date.now() - t0;
    await sleep(o.smallAfterMs);
    const smallAt = Date.now();
    await gqlRaw(url, t.apiKey, submitBody(jobs('small', o.smallJobs, 'customer-small')));
    const smallAnsweredMs = Date.now() - smallAt;
    progress(`[fairness-keys/${label}] big answered at ${bigAnsweredMs} ms; small submitted at ${smallAt - t0} ms`);
    let done: { n: number; last: number | null; bigWaiting: number } = { n: 0, last: null, bigWaiting: 0 };
    while (Date.now() - smallAt < o.maxS * 1000) {
      const [r] = await sql`
        select count(*) filter (where idempotency_key like 'small-%' and finished_at is not null)::int as n,
          max(extract(epoch from finished_at) * 1000) filter (where idempotency_key like 'small-%')::float8 as last,
          count(*) filter (where idempotency_key like 'big-%' and started_at is null)::int as big_waiting
        from jobs`;
      done = { n: r!.n as number, last: r!.last === null ? null : Number(r!.last), bigWaiting: r!.big_waiting as number };
      if (done.n >= o.smallJobs) break;
      await sleep(100);
    }
    const machineBusy = cpu.end();
    const [started] = await sql`select count(*)::int as n, (extract(epoch from max(started_at) - min(started_at)))::float8 as span from jobs where started_at is not null`;
    const smallDoneS = done.n >= o.smallJobs && done.last !== null ? round((done.last - smallAt) / 1000, 2) : null;
    return {
      label,
      smallDoneS,
      smallDone: done.n,
      bigWaitingWhenSmallDone: done.bigWaiting,
      smallAfterS: round((smallAt - t0) / 1000, 2),
      bigAnsweredS: round(bigAnsweredMs / 1000, 2),
      smallAnsweredS: round(smallAnsweredMs / 1000, 2),
      startedPerS: started!.span ? round((started!.n as number) / Number(started!.span), 1) : null,
      machineBusy,
    };
  } finally {
    if (sluice) await sluice.stop().catch(() => null);
    await sim?.stop().catch(() => {});
    await sql.end();
    await db.drop();
  }
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const o: Options = {
    ratePerMinute: flags.number('rate', 4000),
    paceFraction: flags.number('pace', 0.9),
    latencyMs: flags.number('latency', 100),
    bigJobs: flags.number('big', 900),
    smallJobs: flags.number('small', 20),
    smallAfterMs: flags.number('small-after', 2) * 1000,
    maxS: flags.number('max', 60),
    sluiceMode: flags.bool('inproc') ? 'inproc' : 'child',
    extraEnv: parseEnvFlag(flags.optionalString('env')),
  };
  flags.done();
  progress(`[fairness-keys] ${o.ratePerMinute}/min paced ${o.paceFraction}, latency ${o.latencyMs} ms; ${o.bigJobs} big, then ${o.smallJobs} small`);
  const withKeys = await phase(pg, o, true);
  const fifo = await phase(pg, o, false);
  const targets: Record<string, Check> = {
    smallKeyWithin3s: check(withKeys.smallDoneS, "<= 3 s from the small key's submission to its 20th job done", withKeys.smallDoneS !== null && withKeys.smallDoneS <= 3),
    fifoBaselineSlower: check(fifo.smallDoneS, 'the same without keys (FIFO): the 20 wait behind the big backlog', fifo.smallDoneS === null || (withKeys.smallDoneS !== null && fifo.smallDoneS > withKeys.smallDoneS)),
  };
  return {
    summary: { smallKeyDoneS: withKeys.smallDoneS, fifoDoneS: fifo.smallDoneS, pacedPerS: (o.ratePerMinute * o.paceFraction) / 60 },
    options: o,
    keys: withKeys,
    fifo,
    targets,
  };
}
