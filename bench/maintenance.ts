/**
 * `npm run bench -- maintenance`: what pg-boss's maintenance (`supervise`)
 * costs per pass with many tenant queues, unpaged (every queue, what
 * `boss.supervise()` does) against Sluice's paged pass (`BossMaintenance`,
 * one page of --page queues).
 *
 * A fresh database with --queues (30,000: 10,000 tenants x 3 classes) queues
 * made by pg-boss's own create_queue() with the tenant queue policy, and
 * --jobs finished jobs spread over --active-share (0.1) of them (so deletion
 * has rows to walk; a paged pass skips queues without rows). For
 * each mode: wall time per pass, Postgres transactions per pass (the
 * database's xact_commit), `pgboss.queue` rows rewritten per pass, and the
 * CPU seconds of pg-boss's backends (/proc). The first full pass also claims
 * every queue's daily deletion walk; the steady state is the passes after.
 */
import postgres from 'postgres';
import { BossMaintenance, TENANT_QUEUE_RETENTION_SECONDS, startBoss } from '../src/queue/boss.ts';
import type { FlagReader } from './lib/args.ts';
import { progress } from './lib/log.ts';
import { cpuDelta, procCpuSeconds } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { check, median, round, sleep, type Check } from './lib/stats.ts';

export const description = "pg-boss maintenance per pass with 30,000 queues: unpaged supervise() against Sluice's paged pass";

interface PassCost {
  ms: number;
  transactions: number;
  queueRowsUpdated: number;
  pgbossBackendCpuS: number;
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const queues = flags.number('queues', 30_000);
  const jobs = flags.number('jobs', 30_000);
  // Share of the queues that hold jobs: with 10,000 tenants registered, most queues hold none.
  const activeShare = flags.number('active-share', 0.1);
  const pageSize = flags.number('page', 1000);
  const intervalS = flags.number('interval', 15);
  const pagedPasses = flags.number('steady-passes', 5);
  // Unpaged passes to time (2: the first, with every queue's deletion walk, and a steady one; 0
  // skips them: at 300,000 queues the first alone runs for about ten minutes).
  const unpagedPasses = flags.number('unpaged-passes', 2);
  flags.done();

  const db = await freshDatabase(pg.adminUrl, 'maintenance');
  const sql = postgres(db.url, { max: 1, onnotice: () => {} });
  const boss = await startBoss(db.url, { supervise: false, max: 4 });
  try {
    const activeQueues = Math.max(1, Math.round(queues * activeShare));
    progress(`creating ${queues} queues and ${jobs} finished jobs in ${activeQueues} of them`);
    const options = { retryLimit: 3, retryDelay: 2, retryBackoff: true, expireInSeconds: 90, retentionSeconds: TENANT_QUEUE_RETENTION_SECONDS, deleteAfterSeconds: 86_400, policy: 'standard' };
    await sql`select pgboss.create_queue('t.' || lpad(i::text, 6, '0'), ${sql.json(options)}::jsonb) from generate_series(1, ${queues}::int) as i`;
    await sql`
      insert into pgboss.job (name, data, state, completed_on, keep_until)
      select 't.' || lpad((1 + i % ${activeQueues}::int)::text, 6, '0'), '{}'::jsonb, 'completed', now() - interval '2 days', now() + interval '1 day'
      from generate_series(1, ${jobs}::int) as i`;
    await sql`vacuum analyze pgboss.queue`;
    await sql`vacuum analyze pgboss.job`;

    // Stats are flushed by each backend at most once a second when it goes idle: wait them out.
    const counters = async () => {
      await sleep(1200);
      const [d] = await sql`select xact_commit::bigint as x from pg_stat_database where datname = current_database()`;
      const [t] = await sql`select n_tup_upd::bigint as u from pg_stat_user_tables where schemaname = 'pgboss' and relname = 'queue'`;
      const pids = (await sql`select pid from pg_stat_activity where datname = current_database() and application_name = 'sluice-pgboss'`).map((r) => r.pid as number);
      return { xact: Number(d!.x), upd: Number(t!.u), cpu: procCpuSeconds(pids) };
    };
    const measure = async (pass: () => Promise<unknown>): Promise<PassCost> => {
      const a = await counters();
      const t0 = performance.now();
      await pass();
      const ms = performance.now() - t0;
      const b = await counters();
      // Our own counter reads (3 per call, autocommit) are in the delta too: take them out.
      return { ms: round(ms, 1), transactions: b.xact - a.xact - 3, queueRowsUpdated: b.upd - a.upd, pgbossBackendCpuS: cpuDelta(a.cpu, b.cpu) };
    };

    let fullFirst: PassCost | undefined;
    let fullSteady: PassCost | undefined;
    if (unpagedPasses > 0) {
      progress(`unpaged: boss.supervise() over every queue, ${unpagedPasses === 1 ? 'once' : 'twice'}`);
      fullFirst = await measure(() => boss.supervise());
      if (unpagedPasses > 1) fullSteady = await measure(() => boss.supervise());
      progress(`unpaged: first ${fullFirst.ms} ms${fullSteady ? `, steady ${fullSteady.ms} ms` : ''}`);
    }

    // Fresh claims for the paged run: forget what the unpaged passes stamped.
    await sql`update pgboss.queue set monitor_on = null, monitor_claim_on = null, maintain_on = null`;
    const maintenance = new BossMaintenance(boss, sql, intervalS * 1000, () => {}, pageSize);
    const cyclePasses = Math.ceil(queues / pageSize);
    // The first cycle does what the first unpaged pass did (every queue's deletion walk), spread over passes.
    const firstCycleMs: number[] = [];
    const firstCycle = await measure(async () => {
      for (let i = 0; i < cyclePasses; i++) {
        const t0 = performance.now();
        await maintenance.superviseNextPage();
        firstCycleMs.push(performance.now() - t0);
      }
    });
    progress(`paged (${pageSize}): first cycle ${cyclePasses} passes in ${firstCycle.ms} ms`);
    const paged: PassCost[] = [];
    for (let i = 0; i < pagedPasses; i++) paged.push(await measure(() => maintenance.superviseNextPage()));

    const summarize = (xs: PassCost[]) => ({
      medianMs: round(median(xs.map((x) => x.ms)), 1),
      medianTransactions: median(xs.map((x) => x.transactions)),
      medianQueueRowsUpdated: median(xs.map((x) => x.queueRowsUpdated)),
      medianPgbossBackendCpuS: round(median(xs.map((x) => x.pgbossBackendCpuS)), 3),
    });
    const pagedSummary = summarize(paged);
    progress(`paged (${pageSize}): steady median ${pagedSummary.medianMs} ms per pass`);
    const firstCycleMaxMs = round(Math.max(...firstCycleMs), 1);
    const cycleS = Math.ceil(queues / pageSize) * intervalS;
    const shareOfInterval = (ms: number) => round(ms / (intervalS * 1000), 3);
    const targets: Record<string, Check> = {
      pagedPassFitsInterval: check(shareOfInterval(firstCycleMaxMs), `the longest paged pass (first cycle, deletion walks included) takes < 50% of the ${intervalS} s interval`, firstCycleMaxMs < intervalS * 500),
      ...(fullSteady
        ? { pagedCheaperThanFull: check(round(pagedSummary.medianMs / fullSteady.ms, 3), 'a paged pass costs less than a steady unpaged pass', pagedSummary.medianMs < fullSteady.ms) }
        : {}),
    };
    return {
      summary: {
        queues,
        finishedJobs: jobs,
        queuesWithJobs: Math.max(1, Math.round(queues * activeShare)),
        unpaged: unpagedPasses > 0
          ? { firstPass: fullFirst, steadyPass: fullSteady ?? null, steadyShareOfInterval: fullSteady ? shareOfInterval(fullSteady.ms) : null }
          : 'not run (--unpaged-passes 0)',
        paged: {
          pageSize,
          firstCycle: { passes: cyclePasses, total: firstCycle, maxPassMs: firstCycleMaxMs, medianPassMs: round(median(firstCycleMs), 1) },
          steady: { passes: paged.length, ...pagedSummary, shareOfInterval: shareOfInterval(pagedSummary.medianMs) },
          cycleSeconds: cycleS,
        },
      },
      targets,
      setup: {
        queuesBy: "pg-boss's own create_queue() with the tenant queue policy; finished jobs inserted 2 days old with a 1-day deletion, so the first walk of each queue deletes them",
        counters: 'transactions from pg_stat_database.xact_commit, queue rows from pg_stat_user_tables.n_tup_upd (both after a 1.2 s wait for the stats flush), CPU of the sluice-pgboss backends from /proc',
        cycle: `every queue is supervised once per ceil(queues / page) passes, one pass every ${intervalS} s`,
      },
    };
  } finally {
    await boss.stop({ graceful: false, close: true }).catch(() => {});
    await sql.end({ timeout: 2 }).catch(() => {});
    await db.drop();
  }
}
