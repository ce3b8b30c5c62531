/**
 * The rig of the outage tests: a private embedded Postgres the test may kill
 * (SIGKILL, as a crash would) and restart on the same port and data, a
 * provider simulator with a counting proxy in front of it (the provider's own
 * record, per job input), and the Sluice processes started on them. Plus the
 * judge those tests share: one call per job, billed as the provider billed.
 */
import { after, before } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type postgres from 'postgres';
import { ensureDatabase } from '../../src/db/client.ts';
import { startEmbeddedPostgres, type EmbeddedDatabase } from '../../src/db/embedded.ts';
import { startSimulator, type Simulator, type SimulatorOptions } from '../../src/simulator/index.ts';
import { startCallCounter, type CallCounter } from './call-counter.ts';
import type { NodeProcess } from './processes.ts';

export interface OutageRig {
  dir: string;
  dataDir: string;
  port: number;
  pg: EmbeddedDatabase | null;
  sim: Simulator;
  counter: CallCounter;
  nodes: NodeProcess[];
  databaseUrl: string;
}

/** Registers the rig's before/after hooks in the enclosing describe. */
export function useOutageRig(simulatorOptions: SimulatorOptions): { rig: OutageRig; killPostgres: () => () => Promise<void> } {
  const rig = {} as OutageRig;
  before(async () => {
    rig.dir = mkdtempSync(path.join(tmpdir(), 'sluice-outage-'));
    chmodSync(rig.dir, 0o755); // as root, Postgres runs as `postgres` and must enter the folder
    rig.dataDir = path.join(rig.dir, 'pg');
    rig.pg = await startEmbeddedPostgres(rig.dataDir); // its port, kept for the restart
    rig.port = rig.pg.port;
    await ensureDatabase(rig.pg.url, 'sluice');
    rig.databaseUrl = rig.pg.urlFor('sluice');
    rig.sim = await startSimulator(simulatorOptions);
    rig.counter = await startCallCounter(rig.sim.url);
    rig.nodes = [];
  });
  after(async () => {
    if (process.env.TEST_DEBUG) for (const n of rig.nodes) console.error(n.logs.slice(-80).join('\n'));
    await Promise.all(rig.nodes.map((n) => n.stop('SIGKILL')));
    await rig.counter.stop();
    await rig.sim.stop();
    await rig.pg?.stop();
    rmSync(rig.dir, { recursive: true, force: true });
  });
  /** Kills the postmaster (SIGKILL); returns a function that starts it again on the same port and data. */
  const killPostgres = () => {
    const pid = Number(readFileSync(path.join(rig.dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    process.kill(pid, 'SIGKILL');
    rig.pg = null;
    return async () => {
      rig.pg = await startEmbeddedPostgres(rig.dataDir, () => {}, { port: rig.port });
    };
  };
  return { rig, killPostgres };
}

/**
 * Judged against the provider's own record (every job is a `dnslookup` of a
 * unique domain, 1 credit per 200). Per job: the provider saw exactly one
 * call for its input, the job succeeded, and its reservations billed what the
 * provider billed for it. Per tenant: as many calls as jobs, and its ledger
 * equals what the provider billed for its jobs. In total: no call without a
 * job, and the ledger equals the simulator's bill. A job called twice is
 * described with its attempts, so a failure says how it happened.
 */
export async function assertOneCallPerJob(sql: postgres.Sql, counter: CallCounter, sim: Simulator, expectedJobs?: number): Promise<void> {
  const jobs = await sql`
    select j.id, j.tenant_id, j.params->>'domain' as domain, j.state,
      coalesce((select sum(r.billed) from reservations r where r.job_id = j.id), 0)::int as billed,
      (select coalesce(string_agg(format('#%s %s billed %s sent %s settled %s', r.attempt, r.outcome, r.billed,
          to_char((select s.sent_at from lease_sends s where s.lease_id = r.lease_id and r.id <> all(coalesce(s.riders, '{}'))), 'HH24:MI:SS.MS'), to_char(r.settled_at, 'HH24:MI:SS.MS')), '; ' order by r.created_at), '')
        from reservations r where r.job_id = j.id) as attempts
    from jobs j`;
  if (expectedJobs !== undefined) assert.equal(jobs.length, expectedJobs);
  const byTarget = counter.byTarget();
  const ok = new Map<string, number>();
  for (const c of counter.calls) if (c.status === 200) ok.set(c.target, (ok.get(c.target) ?? 0) + 1);
  const wrong: string[] = [];
  const perTenant = new Map<string, { jobs: number; calls: number; providerBilled: number }>();
  for (const j of jobs) {
    const target = `/v1/dnslookup?domain=${j.domain}`;
    const calls = byTarget.get(target) ?? 0;
    const providerBilled = ok.get(target) ?? 0;
    const t = perTenant.get(j.tenant_id) ?? { jobs: 0, calls: 0, providerBilled: 0 };
    t.jobs++;
    t.calls += calls;
    t.providerBilled += providerBilled;
    perTenant.set(j.tenant_id, t);
    if (calls !== 1 || j.billed !== providerBilled || j.state !== 'SUCCEEDED') wrong.push(`${j.domain}: ${calls} calls, billed ${j.billed} for the provider's ${providerBilled}, ${j.state}; attempts: ${j.attempts}`);
  }
  assert.deepEqual(wrong, [], `every job: one call, billed what the provider billed (${wrong.length} of ${jobs.length} wrong)`);
  const ledgers = await sql`select tenant_id, coalesce(sum(billed), 0)::int as billed from tenant_ledger group by tenant_id`;
  for (const l of ledgers) {
    const t = perTenant.get(l.tenant_id) ?? { jobs: 0, calls: 0, providerBilled: 0 };
    assert.equal(t.calls, t.jobs, `tenant ${l.tenant_id}: the provider saw one call per job`);
    assert.equal(l.billed, t.providerBilled, `tenant ${l.tenant_id}: its ledger equals what the provider billed for its jobs`);
  }
  assert.equal(counter.calls.length, jobs.length, 'the provider saw one call per job, and none without a job');
  const total = ledgers.reduce((s, l) => s + (l.billed as number), 0);
  assert.equal(total, sim.stats().totals.creditsBilled, "the tenants' ledger equals the provider's bill");
}
