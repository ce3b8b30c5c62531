/**
 * A long Postgres outage under steady traffic, with the default attempt lease
 * (10 s), judged per job and per tenant against the provider's own record
 * (the counting proxy): four tenants submit 40 jobs a second; once about 100
 * calls of ~3 s (log-normal) are in flight, Postgres is killed (SIGKILL) and
 * kept down for 15 s, or for 40 s, then started again. Submissions during the
 * outage are refused (only accepted jobs count: the judge reads the jobs
 * table). Every job must be called exactly once and billed exactly what the
 * provider billed: no call aborted for a lease nobody could have taken, and
 * no lease expired before its living owner settled what it knew.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { eventually } from './helpers/app.ts';
import { crashTestEnv, gqlAt, startNode } from './helpers/processes.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';
import { assertOneCallPerJob, useOutageRig } from './helpers/outage-rig.ts';

const CREATE = `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`;
const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;

/** Four ENTERPRISE tenants (a cap of 32 each): together they can fill the window's 100 slots. */
const TENANTS = 4;
/** 40 jobs a second: one tenant's submission of 4 every 100 ms, in turn. */
const SUBMIT_EVERY_MS = 100;
const JOBS_PER_SUBMISSION = 4;

const debug = (msg: string) => {
  if (process.env.TEST_DEBUG) console.error(`[outage ${new Date().toISOString()}] ${msg}`);
};

/** Submits unique jobs in turn for each tenant until stopped; refusals (the outage) are only counted. */
function submitContinuously(url: string, keys: readonly string[], tag: string) {
  let tick = 0;
  let accepted = 0;
  let refused = 0;
  const pending = new Set<Promise<void>>();
  const timer = setInterval(() => {
    const t = tick % keys.length;
    const first = Math.floor(tick / keys.length) * JOBS_PER_SUBMISSION;
    tick++;
    const jobs = Array.from({ length: JOBS_PER_SUBMISSION }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}-t${t}-${first + i}.example` } }));
    const p = gqlAt(url, SUBMIT_MANY, { i: { jobs } }, keys[t])
      .then((r) => void (accepted += r.submitJobs.jobs.length))
      .catch(() => void refused++)
      .finally(() => pending.delete(p));
    pending.add(p);
  }, SUBMIT_EVERY_MS);
  return {
    stop: async () => {
      clearInterval(timer);
      await Promise.allSettled([...pending]);
      return { accepted, refused };
    },
  };
}

/**
 * Calls of ~3 s with a wide tail (p95 7 s; about one in ten takes over 6 s): a call still running ¾
 * of a lease after Postgres died is the one an outage used to cut short.
 */
const LATENCY = { latencyMs: 3_000, latencyP95Ms: 7_000 };

for (const downSeconds of [15, 40]) {
  describe(`Postgres down ${downSeconds} s with ~100 calls of ~3 s in flight (default lease)`, () => {
    const { rig, killPostgres } = useOutageRig({ plan: 'PRO', ratePerMinute: 6000, ...LATENCY, concurrentCalls: 100, seed: 34 });

    test('every job is called once and billed as the provider billed, per job and per tenant', async () => {
      const node = await startNode(
        'all',
        crashTestEnv({ apiKey: rig.sim.apiKey, url: rig.counter.url }, rig.databaseUrl, 6000, {
          BATCH_MAX: '1',
          // The default lease (ATTEMPT_LEASE_SECONDS = NODE_TIMEOUT_SECONDS = 10).
          NODE_TIMEOUT_SECONDS: '10',
          INITIAL_LATENCY_MS: '3000',
          // The tail must not reach the provider timeout: a call that times out is retried, outage or not.
          PROVIDER_TIMEOUT_MS: '30000',
        }),
      );
      rig.nodes.push(node);
      const keys: string[] = [];
      for (let t = 0; t < TENANTS; t++) keys.push((await gqlAt(node.url!, CREATE, { i: { name: `t${t}`, tier: 'ENTERPRISE' } })).createTenant.apiKey);
      const submitter = submitContinuously(node.url!, keys, `d${downSeconds}`);
      // Past the start-up burst (calls of every age in flight), with the window's 100 slots nearly full.
      await eventually(async () => rig.counter.calls.length >= 200 && rig.counter.inFlight() >= 90, 60_000, 10);
      const restart = killPostgres();
      const inFlightAtKill = rig.counter.inFlight();
      debug(`killed with ${inFlightAtKill} calls in flight, ${rig.counter.calls.length} calls so far`);
      await new Promise((r) => setTimeout(r, downSeconds * 1000));
      await restart();
      debug('restarted');
      const { accepted, refused } = await submitter.stop();
      debug(`submissions: ${accepted} jobs accepted, ${refused} refused`);

      const check = postgres(rig.databaseUrl, { max: 2, onnotice: () => {} });
      try {
        await eventually(async () => {
          const [r] = await check`select count(*)::int as n from jobs where state in ('QUEUED', 'RUNNING', 'WAITING_QUOTA')`;
          return r!.n === 0;
        }, 90_000, 200);
        debug(`drained: ${rig.counter.calls.length} calls`);
        assert.ok(inFlightAtKill >= 90, 'about 100 calls were in flight when Postgres died');
        assert.ok(refused > 0, 'submissions were refused during the outage');
        await assertOneCallPerJob(check, rig.counter, rig.sim);
        const [jobs] = await check`select count(*)::int as n from jobs`;
        assert.ok(jobs!.n >= accepted, 'every accepted job was stored');
        await assertJobsAccountedFor(check);
        await assertQuiescent(check);
        await assertLedgerBalances(check);
        assert.equal(node.child.exitCode, null, 'the process lived through it');
      } finally {
        await check.end();
      }
    });
  });
}
