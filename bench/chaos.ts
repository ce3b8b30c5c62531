/**
 * `npm run bench -- chaos`: Sluice as a deployment (one api and three worker
 * processes on ONE Postgres) under faults on a schedule, judged against the
 * provider's own record.
 *
 * The bench starts its own embedded Postgres (it stops and starts it, so never
 * the shared server), a simulator over real HTTP with its call log on (median
 * latency ~0.9 s, p95 ~2.5 s: many calls in flight), and the four Sluice
 * processes. `--tenants` tenants submit throughout (submitJobs over HTTP, each
 * job with an idempotency key; a 5xx, 429, timeout or refused connection is
 * replayed with the same body, bounded). One fault every `--fault-gap`
 * seconds (`--faults`, round robin while time remains):
 *   worker-kill       SIGKILL the worker with the most calls in flight, restart it
 *   worker-term       SIGTERM a worker (graceful stop), restart it
 *   postgres-outage   Postgres stopped for `--outage` s, longer than the attempt lease
 *   api-kill          SIGKILL the api process, restart it on the same port
 *   bad-answer        200s whose body cannot be stored, for emailvalidator calls
 * Then quiescence (every job ended, nothing reserved, nothing in flight
 * upstream; bounded by `--drain-max`) and the judgement (bench/lib/chaos-judge.ts):
 * every job's param names its tag, so the simulator's call log gives calls and
 * credits per job and per tenant, compared with each job's state, attempts and
 * creditsBilled and each tenant's ledger (`me { usage }`) and usage history.
 */
import { mkdtempSync, chmodSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import postgres from 'postgres';
import { freePort, startEmbeddedPostgres, type EmbeddedDatabase } from '../src/db/embedded.ts';
import { BAD_ANSWER_KINDS, startSimulator, type BadAnswerKind, type CallRecord, type Simulator } from '../src/simulator/index.ts';
import type { FlagReader } from './lib/args.ts';
import {
  attribute,
  creditsPerTenant,
  faultOfJobs,
  idempotencyKeyFor,
  judgeJobs,
  longestGapSeconds,
  paramsFor,
  recoverySeconds,
  tagOfKey,
  tagOfParams,
  type JobRecord,
} from './lib/chaos-judge.ts';
import { createTenant, gql, submitBody, type JobSpec } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import type { BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor, type SluiceHandle } from './lib/sluice.ts';
import { check, mapLimit, round, sleep, type Check } from './lib/stats.ts';

export const description =
  'an api + 3 workers on one embedded Postgres under faults (SIGKILL/SIGTERM workers, Postgres down longer than the lease, api SIGKILL, unstorable answers): lost jobs, double billing, per-job and per-tenant credits vs the simulator, recovery per fault';

const FAULT_KINDS = ['worker-kill', 'worker-term', 'postgres-outage', 'api-kill', 'bad-answer'] as const;
type FaultKind = (typeof FAULT_KINDS)[number];

/** The API whose answers the bad-answer fault spoils; the other jobs use dnslookup. */
const BAD_ANSWER_API = 'emailvalidator';

interface FaultRecord {
  kind: FaultKind;
  /** Seconds from the start of submissions. */
  atS: number;
  endS: number;
  /** Seconds from the fault's end until every tenant had a job finish and a submission answered again; null = never. */
  recoverySeconds: number | null;
  recovered: boolean;
  detail: Record<string, unknown>;
  /** Faulty jobs with an upstream call around this fault (chaos-judge faultOfJobs). */
  caught: { lost: number; doubleBilled: number; perJobMismatches: number };
}

interface Options {
  durationS: number;
  faults: FaultKind[];
  firstFaultS: number;
  faultGapS: number;
  tenants: number;
  rate: number;
  batch: number;
  emailShare: number;
  latencyMs: number;
  latencyP95Ms: number;
  planRate: number;
  leaseS: number;
  outageS: number;
  badAnswerS: number;
  badKinds: BadAnswerKind[];
  badProbability: number;
  drainMaxS: number;
  stallBoundS: number;
  recoveryBoundS: number;
  replayMaxS: number;
  poolMax: number;
  seed: number;
  extraEnv: Record<string, string>;
}

function parseFaults(text: string): FaultKind[] {
  if (text === 'none') return [];
  const kinds = text.split(',').map((s) => s.trim()).filter(Boolean);
  for (const k of kinds) if (!(FAULT_KINDS as readonly string[]).includes(k)) throw new Error(`--faults: unknown fault "${k}" (one of ${FAULT_KINDS.join(', ')}, or none)`);
  return kinds as FaultKind[];
}

function parseBadKinds(text: string): BadAnswerKind[] {
  const kinds = text.split(',').map((s) => s.trim()).filter(Boolean);
  for (const k of kinds) if (!(BAD_ANSWER_KINDS as readonly string[]).includes(k)) throw new Error(`--bad-kinds: unknown kind "${k}" (one of ${BAD_ANSWER_KINDS.join(', ')})`);
  if (kinds.length === 0) throw new Error('--bad-kinds needs at least one kind');
  return kinds as BadAnswerKind[];
}

/** One POST /graphql, classified: answered, worth replaying (the answer may have been lost), or refused for good. */
type Posted = { kind: 'ok'; data: any } | { kind: 'retry'; why: string } | { kind: 'error'; why: string };

const RETRYABLE_CODES = new Set(['DATABASE_UNAVAILABLE', 'SERVICE_UNAVAILABLE', 'RATE_LIMITED', 'TOO_MANY_REQUESTS']);

async function postGraphQL(url: string, token: string, body: string, timeoutMs: number): Promise<Posted> {
  let res: Response;
  try {
    res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` }, body, signal: AbortSignal.timeout(timeoutMs) });
  } catch (err) {
    const e = err as { name?: string; cause?: { code?: string } };
    return { kind: 'retry', why: e.name === 'TimeoutError' ? 'timeout' : (e.cause?.code ?? e.name ?? 'fetch failed') };
  }
  const json = (await res.json().catch(() => null)) as { data?: unknown; errors?: Array<{ message: string; extensions?: { code?: string } }> } | null;
  const code = json?.errors?.[0]?.extensions?.code;
  if (res.status >= 500 || res.status === 429 || json === null) return { kind: 'retry', why: `http ${res.status}${code ? ` ${code}` : ''}` };
  if (json.errors?.length || !json.data) return code && RETRYABLE_CODES.has(code) ? { kind: 'retry', why: code } : { kind: 'error', why: code ?? json.errors?.[0]?.message ?? 'no data' };
  return { kind: 'ok', data: json.data };
}

export async function run(_pg: BenchPostgres, flags: FlagReader) {
  const o: Options = {
    durationS: flags.number('duration', 120),
    faults: parseFaults(flags.string('faults', FAULT_KINDS.join(','))),
    firstFaultS: flags.number('first-fault', 12),
    faultGapS: flags.number('fault-gap', 12),
    tenants: flags.number('tenants', 6),
    rate: flags.number('rate', 30),
    batch: flags.number('batch', 5),
    emailShare: flags.number('email-share', 0.1),
    latencyMs: flags.number('latency', 900),
    latencyP95Ms: flags.number('latency-p95', 2500),
    planRate: flags.number('plan-rate', 6000),
    leaseS: flags.number('lease', 5),
    outageS: flags.number('outage', 13),
    badAnswerS: flags.number('bad-answer-seconds', 10),
    badKinds: parseBadKinds(flags.string('bad-kinds', 'nul,lone-surrogate,html')),
    badProbability: flags.number('bad-probability', 0.5),
    drainMaxS: flags.number('drain-max', 45),
    stallBoundS: flags.number('stall-bound', 30),
    recoveryBoundS: flags.number('recovery-bound', 20),
    replayMaxS: flags.number('replay-max', 90),
    poolMax: flags.number('pool-max', 10),
    seed: flags.number('seed', 1),
    extraEnv: parseEnvFlag(flags.optionalString('env')),
  };
  flags.done();
  if (o.outageS <= o.leaseS) progress(`[chaos] note: --outage ${o.outageS} s is not longer than the attempt lease (${o.leaseS} s)`);

  // ---------------------------------------------------------------- the deployment
  const pgDir = mkdtempSync(path.join(tmpdir(), 'sluice-chaos-pg-'));
  chmodSync(pgDir, 0o755); // as root, Postgres runs as `postgres`, which must enter the folder
  const pgPort = await freePort();
  const pgLog = (m: string) => progress(`[chaos pg] ${m}`);
  // Postgres's own ERROR lines: normal contention must raise none (a busy lease is a result).
  const pgErrors: string[] = [];
  const serverLog = (text: string) => {
    for (const line of text.split('\n')) if (/\bERROR:/.test(line)) pgErrors.push(line.trim());
  };
  let pgServer: EmbeddedDatabase | null = null;
  let sim: Simulator | null = null;
  let api: SluiceHandle | null = null;
  const workers: Array<SluiceHandle | null> = [null, null, null];
  let sqlClient: postgres.Sql | null = null;
  try {
    pgServer = await startEmbeddedPostgres(path.join(pgDir, 'data'), pgLog, { port: pgPort, serverLog });
    const admin = postgres(pgServer.url, { max: 1, onnotice: () => {} });
    await admin.unsafe('create database sluice_chaos');
    await admin.end();
    const dbUrl = pgServer.urlFor('sluice_chaos');
    const sql = (sqlClient = postgres(dbUrl, { max: 2, onnotice: () => {}, connect_timeout: 3 }));
    const pgVersion = String((await sql`select current_setting('server_version') as v`)[0]!.v);
    sim = await startSimulator({
      plan: 'PRO',
      ratePerMinute: o.planRate,
      concurrentCalls: 500,
      latencyMs: o.latencyMs,
      latencyP95Ms: o.latencyP95Ms,
      seed: o.seed,
      credits: 1_000_000_000,
      maxCredits: 1_000_000_000,
      cooldownSeconds: 1,
      callLog: true,
    });
    const apiPort = await freePort();
    const env: Record<string, string> = {
      DATABASE_URL: dbUrl,
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_PLAN: 'PRO',
      APIVERVE_RATE_PER_MINUTE: String(o.planRate),
      APIVERVE_CONCURRENT_CALLS: '500',
      METRICS_PORT: '0',
      LOG_LEVEL: 'error',
      DB_POOL_MAX: String(o.poolMax),
      // The lease is short so the outage outlasts it; a silent node is presumed dead as soon.
      ATTEMPT_LEASE_SECONDS: String(o.leaseS),
      NODE_TIMEOUT_SECONDS: String(o.leaseS),
      SWEEP_INTERVAL_MS: '500',
      SHUTDOWN_GRACE_SECONDS: '10',
      ...o.extraEnv,
    };
    const apiUrl = `http://127.0.0.1:${apiPort}/graphql`;
    const startApi = () => startSluiceFor({ ...env, SLUICE_ROLE: 'api', PORT: String(apiPort) }, 'child');
    const startWorker = () => startSluiceFor({ ...env, SLUICE_ROLE: 'worker' }, 'child');
    /** A restart is retried (bounded): a node that starts while Postgres is still waking exits. */
    const restart = async (start: () => Promise<SluiceHandle>): Promise<SluiceHandle> => {
      for (let attempt = 1; ; attempt++) {
        try {
          return await start();
        } catch (err) {
          if (attempt >= 5) throw err;
          progress(`[chaos] restart failed (${(err as Error).message.split('\n')[0]}), again in 2 s`);
          await sleep(2_000);
        }
      }
    };
    api = await startApi();
    for (let i = 0; i < workers.length; i++) workers[i] = await startWorker();
    progress(`[chaos] api on ${apiUrl}, ${workers.length} workers, Postgres on ${pgPort}, simulator ${sim.url}`);

    const tenants = await mapLimit(Array.from({ length: o.tenants }, (_, i) => i), 3, (i) =>
      createTenant(apiUrl, ADMIN_TOKEN, `chaos-${i}`, { weight: 1, concurrencyCap: 100, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 }),
    );

    // ---------------------------------------------------------------- submitters
    const t0 = Date.now();
    const submitEndMs = t0 + o.durationS * 1000;
    const at = (ms: number) => round((ms - t0) / 1000, 1);
    const accepted = new Map<string, string>(); // job id -> tag
    const answers: number[][] = tenants.map(() => []); // per tenant: when a submission was answered (ms)
    const sub = { submissions: 0, answered: 0, replays: 0, answeredAfterReplay: 0, abandoned: 0, rejected: 0, retryReasons: {} as Record<string, number>, errors: {} as Record<string, number> };
    const bump = (m: Record<string, number>, k: string) => (m[k] = (m[k] ?? 0) + 1);

    async function submit(t: number, jobs: JobSpec[]) {
      const body = submitBody(jobs);
      const giveUpAt = Date.now() + o.replayMaxS * 1000;
      sub.submissions += 1;
      for (let attempt = 0; ; attempt++) {
        if (attempt > 0) sub.replays += 1;
        const r = await postGraphQL(apiUrl, tenants[t]!.apiKey, body, 15_000);
        if (r.kind === 'ok') {
          const ids = (r.data as { submitJobs: { jobs: Array<{ id: string }> } }).submitJobs.jobs.map((j) => j.id);
          ids.forEach((id, i) => accepted.set(id, jobs[i]!.idempotencyKey!));
          answers[t]!.push(Date.now());
          sub.answered += 1;
          if (attempt > 0) sub.answeredAfterReplay += 1;
          return;
        }
        if (r.kind === 'error') {
          sub.rejected += 1;
          bump(sub.errors, r.why);
          return;
        }
        bump(sub.retryReasons, r.why);
        if (Date.now() >= giveUpAt) {
          sub.abandoned += 1;
          return;
        }
        await sleep(Math.min(5_000, 250 * 2 ** attempt));
      }
    }

    const perTenantRate = o.rate / o.tenants;
    const submitters = tenants.map(async (_, t) => {
      const periodMs = (1000 * o.batch) / perTenantRate;
      let n = 0;
      let next = Date.now() + Math.random() * periodMs; // spread the tenants over the period
      await sleep(next - Date.now());
      while (Date.now() < submitEndMs) {
        const jobs: JobSpec[] = Array.from({ length: o.batch }, () => {
          const tag = `${t}-${n++}`;
          const a = Math.random() < o.emailShare ? BAD_ANSWER_API : 'dnslookup';
          return { api: a, params: paramsFor(a, tag), priority: 'STANDARD', idempotencyKey: idempotencyKeyFor(tag) };
        });
        await submit(t, jobs);
        next += periodMs;
        const wait = next - Date.now();
        if (wait > 0) await sleep(wait);
        else next = Date.now();
      }
    });

    // ---------------------------------------------------------------- faults
    const faults: FaultRecord[] = [];
    const inFlightByPid = async (): Promise<Map<number, number>> => {
      const rows = await sql`select n.pid, count(*)::int as n from reservations r join nodes n on n.id = r.node_id where r.settled_at is null group by n.pid`;
      return new Map(rows.map((r) => [r.pid as number, r.n as number]));
    };
    /** The worker with the most calls in flight (waits up to 5 s for one to have any). */
    const busiestWorker = async (): Promise<{ index: number; inFlight: number }> => {
      let best = { index: 0, inFlight: 0 };
      for (let tries = 0; tries < 10; tries++) {
        const m = await inFlightByPid().catch(() => new Map<number, number>());
        best = workers.map((w, index) => ({ index, inFlight: (w && m.get(w.pid)) ?? 0 })).sort((a, b) => b.inFlight - a.inFlight)[0]!;
        if (best.inFlight > 0) break;
        await sleep(500);
      }
      return best;
    };
    /** The simulator's badAnswer condition on one API, over its admin endpoint like any operator; null clears it. */
    const setBadAnswers = async (kind: BadAnswerKind | null): Promise<void> => {
      const res = await fetch(`${sim!.adminUrl}/conditions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ apis: { [BAD_ANSWER_API]: { badAnswer: kind === null ? null : { kind, probability: o.badProbability } } } }),
      });
      if (!res.ok) throw new Error(`the simulator refused the badAnswer condition: ${res.status} ${await res.text()}`);
    };

    async function inject(kind: FaultKind): Promise<{ endMs: number; detail: Record<string, unknown> }> {
      switch (kind) {
        case 'worker-kill': {
          const { index, inFlight } = await busiestWorker();
          underFault.add(`worker${index}`);
          const w = workers[index]!;
          await w.kill('SIGKILL');
          workers[index] = null;
          const killedAt = Date.now();
          workers[index] = await restart(startWorker);
          underFault.delete(`worker${index}`);
          return { endMs: Date.now(), detail: { worker: index, pid: w.pid, callsInFlight: inFlight, restartS: round((Date.now() - killedAt) / 1000, 1) } };
        }
        case 'worker-term': {
          const { index, inFlight } = await busiestWorker();
          underFault.add(`worker${index}`);
          const w = workers[index]!;
          const sent = Date.now();
          const exited = w.kill('SIGTERM');
          const forced = await Promise.race([exited.then(() => false), sleep(30_000).then(() => true)]);
          if (forced) await w.kill('SIGKILL');
          const stopS = round((Date.now() - sent) / 1000, 1);
          workers[index] = await restart(startWorker);
          underFault.delete(`worker${index}`);
          return { endMs: Date.now(), detail: { worker: index, pid: w.pid, callsInFlight: inFlight, gracefulStopS: stopS, forcedAfter30s: forced } };
        }
        case 'postgres-outage': {
          const open = await sql`select count(*)::int as n from reservations where settled_at is null`.then((r) => r[0]!.n as number).catch(() => null);
          const down = Date.now();
          await pgServer!.stop();
          pgServer = null;
          await sleep(o.outageS * 1000);
          pgServer = await startEmbeddedPostgres(path.join(pgDir, 'data'), pgLog, { port: pgPort, serverLog });
          return { endMs: Date.now(), detail: { downS: round((Date.now() - down) / 1000, 1), leaseS: o.leaseS, callsInFlightAtStop: open } };
        }
        case 'api-kill': {
          const pid = api!.pid;
          underFault.add('api');
          await api!.kill('SIGKILL');
          api = null;
          const killedAt = Date.now();
          api = await restart(startApi);
          underFault.delete('api');
          return { endMs: Date.now(), detail: { pid, restartS: round((Date.now() - killedAt) / 1000, 1) } };
        }
        case 'bad-answer': {
          // The window is shared by the kinds in turn: a nul in the data, a lone surrogate, an HTML page...
          const before = sim!.stats().totals;
          const badBefore = sim!.stats().keys[sim!.apiKey]?.badAnswers ?? 0;
          for (const kind of o.badKinds) {
            await setBadAnswers(kind);
            await sleep((o.badAnswerS * 1000) / o.badKinds.length);
          }
          await setBadAnswers(null);
          const after = sim!.stats();
          return {
            endMs: Date.now(),
            detail: { api: BAD_ANSWER_API, kinds: o.badKinds, probability: o.badProbability, seconds: o.badAnswerS, badAnswers: (after.keys[sim!.apiKey]?.badAnswers ?? 0) - badBefore, billedCallsMeanwhile: after.totals.billedCalls - before.billedCalls },
          };
        }
      }
    }

    // A supervisor, as a deployment has: a node that exits on its own (not by a fault) is counted and restarted.
    const unexpectedExits: Array<{ node: string; atS: number }> = [];
    const underFault = new Set<string>();
    let supervising = true;
    const supervisor = (async () => {
      while (supervising) {
        await sleep(1_000);
        const slots: Array<[string, SluiceHandle | null, () => Promise<void>]> = [
          ['api', api, async () => void (api = await restart(startApi))],
          ...workers.map((w, i): [string, SluiceHandle | null, () => Promise<void>] => [`worker${i}`, w, async () => void (workers[i] = await restart(startWorker))]),
        ];
        for (const [name, h, again] of slots) {
          if (!supervising || underFault.has(name) || !h?.exited()) continue;
          unexpectedExits.push({ node: name, atS: at(Date.now()) });
          progress(`[chaos] ${name} exited on its own at t=${at(Date.now())} s: restarting it`);
          await again().catch((err: Error) => progress(`[chaos] could not restart ${name}: ${err.message}`));
        }
      }
    })();

    const faultLoop = (async () => {
      await sleep(o.firstFaultS * 1000);
      // A fault needs room after it to be judged: one gap plus its own length.
      const room = (k: FaultKind) => o.faultGapS + (k === 'postgres-outage' ? o.outageS : k === 'bad-answer' ? o.badAnswerS : 10);
      for (let i = 0; o.faults.length > 0; i++) {
        const kind = o.faults[i % o.faults.length]!;
        if (Date.now() + room(kind) * 1000 > submitEndMs) break;
        const start = Date.now();
        progress(`[chaos] t=${at(start)} s: ${kind}`);
        const r = await inject(kind);
        faults.push({ kind, atS: at(start), endS: at(r.endMs), recoverySeconds: null, recovered: false, detail: r.detail, caught: { lost: 0, doubleBilled: 0, perJobMismatches: 0 } });
        await sleep(o.faultGapS * 1000);
      }
    })();

    const machine = cpuMeter();
    await Promise.all([faultLoop, ...submitters]);
    const submittedEndMs = Date.now();
    progress(`[chaos] submissions over at t=${at(submittedEndMs)} s: ${accepted.size} jobs accepted, ${sub.replays} replays; waiting for quiescence`);

    // ---------------------------------------------------------------- quiescence
    let drainedAt: number | null = null;
    while (Date.now() - submittedEndMs < o.drainMaxS * 1000) {
      const row = await sql`
        select (select count(*)::int from jobs where state not in ('SUCCEEDED', 'FAILED', 'CANCELLED')) as open,
               (select count(*)::int from reservations where settled_at is null) as reserved`
        .then((r) => r[0]!)
        .catch(() => null);
      if (row && row.open === 0 && row.reserved === 0 && sim.stats().account.inFlight === 0) {
        drainedAt = Date.now();
        break;
      }
      await sleep(1_000);
    }
    const busy = machine.end();
    supervising = false;
    await supervisor;
    progress(drainedAt ? `[chaos] quiescent ${round((drainedAt - submittedEndMs) / 1000, 1)} s after the last submission` : `[chaos] NOT quiescent after ${o.drainMaxS} s`);

    // ---------------------------------------------------------------- ground truth and Sluice's record
    const calls: CallRecord[] = [];
    for (let since = 0; ; ) {
      const page = sim.calls(since, 50_000);
      calls.push(...page.calls);
      if (page.calls.length === 0) break;
      since = page.next;
    }
    const { perTag, unattributed } = attribute(calls);
    const jobRows = await sql`
      select j.id, j.tenant_id, j.state, j.attempts, j.idempotency_key,
             (extract(epoch from j.finished_at) * 1000)::float8 as finished_ms,
             coalesce(j.credits_billed, 0)::int as credits_billed,
             (select count(*)::int from reservations x where x.job_id = j.id) as reservations,
             (select coalesce(sum(x.billed), 0)::int from reservations x where x.job_id = j.id) as reservations_billed,
             (select count(*)::int from reservations x where x.job_id = j.id and x.outcome = 'node_lost' and x.reconciled_at is null) as lost_with_worker
      from jobs j`;
    const jobs: JobRecord[] = jobRows.map((r) => ({
      id: r.id as string,
      tag: tagOfKey(r.idempotency_key as string | null),
      state: r.state as string,
      attempts: r.attempts as number,
      creditsBilled: r.credits_billed as number,
      lostWithWorker: r.lost_with_worker as number,
    }));
    const verdict = judgeJobs(accepted, jobs, perTag);
    const tenantIndex = new Map(tenants.map((t, i) => [t.id, i]));
    const finishes: number[][] = tenants.map(() => []);
    for (const r of jobRows) if (r.finished_ms !== null) finishes[tenantIndex.get(r.tenant_id as string)!]!.push(r.finished_ms as number);
    for (const f of finishes) f.sort((a, b) => a - b);
    const reservationMismatches = jobRows.filter((r) => (r.reservations_billed as number) !== (r.credits_billed as number)).length;

    // Per tenant: the ledger through GraphQL (me.usage) and SQL, usage history, against the provider.
    const provider = creditsPerTenant(perTag);
    const dayStart = new Date(t0);
    dayStart.setUTCHours(0, 0, 0, 0);
    const to = new Date(Date.now() + 86_400_000);
    const perTenant = await mapLimit(tenants, 3, async (t, i) => {
      const me = await gql<{ me: { usage: { creditsUsed: number; creditsReserved: number }; usageHistory: Array<{ creditsBilled: number; calls: number }> } }>(
        apiUrl,
        t.apiKey,
        'query($from: DateTime!, $to: DateTime!) { me { usage { creditsUsed creditsReserved } usageHistory(from: $from, to: $to, granularity: DAY) { creditsBilled calls } } }',
        { from: dayStart.toISOString(), to: to.toISOString() },
      );
      const historyCredits = me.me.usageHistory.reduce((a, r) => a + r.creditsBilled, 0);
      const tenantJobs = jobRows.filter((r) => r.tenant_id === t.id);
      return {
        tenant: i,
        jobs: tenantJobs.length,
        providerCredits: provider.get(i) ?? 0,
        ledgerCreditsUsed: me.me.usage.creditsUsed,
        creditsReserved: me.me.usage.creditsReserved,
        usageHistoryCredits: historyCredits,
        jobsCreditsBilled: tenantJobs.reduce((a, r) => a + (r.credits_billed as number), 0),
        longestSettleGapS: round(longestGapSeconds(finishes[i]!, finishes[i]![0] ?? t0, submittedEndMs), 1),
      };
    });
    const perTenantMismatches = perTenant.filter((p) => p.ledgerCreditsUsed !== p.providerCredits);
    const historyMismatches = perTenant.filter((p) => p.usageHistoryCredits !== p.ledgerCreditsUsed);
    const stalled = perTenant.filter((p) => p.longestSettleGapS > o.stallBoundS);

    for (const f of faults) {
      const rec = recoverySeconds(t0 + f.endS * 1000, finishes, answers);
      f.recoverySeconds = rec === null ? null : round(rec, 1);
      f.recovered = f.recoverySeconds !== null && f.recoverySeconds <= o.recoveryBoundS;
    }
    const notRecovered = faults.filter((f) => !f.recovered);

    // Which fault each faulty job belongs to: a call from 3 s before the fault to two leases after its end.
    const callTimes = new Map<string, number[]>();
    for (const c of calls) {
      const tag = tagOfParams(c.params);
      if (tag !== null) (callTimes.get(tag) ?? callTimes.set(tag, []).get(tag)!).push(c.atMs);
    }
    const spans = faults.map((f) => ({ startMs: t0 + f.atS * 1000, endMs: t0 + f.endS * 1000 }));
    const tagById = new Map(jobs.map((j) => [j.id, j.tag]));
    const outsideFaults = { lost: 0, doubleBilled: 0, perJobMismatches: 0 };
    const tally = (tags: Array<string | null>, field: keyof FaultRecord['caught']) => {
      const known = tags.filter((t): t is string => t !== null);
      for (const i of faultOfJobs(known, callTimes, spans, 3_000, 2 * o.leaseS * 1000).values()) {
        if (i >= 0) faults[i]!.caught[field] += 1;
        else outsideFaults[field] += 1;
      }
    };
    tally(verdict.lost.map((l) => tagById.get(l.id) ?? null), 'lost');
    tally(verdict.doubleBilled.map((d) => d.tag), 'doubleBilled');
    tally(verdict.perJobMismatches.map((m) => m.tag), 'perJobMismatches');

    // The jobs answered 200 by the spoiled API during a bad-answer window (some of them bad), and what became of them.
    const badWindows = faults.filter((f) => f.kind === 'bad-answer').map((f) => [t0 + f.atS * 1000, t0 + f.endS * 1000] as const);
    const badTags = new Set(calls.filter((c) => c.api === BAD_ANSWER_API && c.status === 200 && badWindows.some(([a, b]) => c.atMs >= a && c.atMs <= b)).map((c) => tagOfParams(c.params)));
    const badStates: Record<string, number> = {};
    for (const j of jobs) if (j.tag && badTags.has(j.tag)) bump(badStates, j.state);

    const states: Record<string, number> = {};
    for (const j of jobs) bump(states, j.state);
    const simStats = sim.stats();
    const maxRecovery = faults.reduce<number | null>((m, f) => (f.recoverySeconds === null ? m : Math.max(m ?? 0, f.recoverySeconds)), null);
    const doubleBilled = verdict.doubleBilled.length;
    // What Sluice and the provider each recorded for the first mis-billed jobs: enough to tell an
    // attempt billed by expiry that never reached the provider from one billed twice.
    const mismatchTags = new Set(verdict.perJobMismatches.slice(0, 10).map((m) => m.tag));
    const mismatchIds = jobs.filter((j) => j.tag !== null && mismatchTags.has(j.tag)).map((j) => j.id);
    const mismatchAttempts = mismatchIds.length === 0 ? [] : await sql`
      select j.idempotency_key as key, x.attempt, x.outcome, x.billed, x.credits,
             (extract(epoch from x.created_at) * 1000 - ${t0})::int as leased_ms,
             (extract(epoch from (select s.sent_at from lease_sends s where s.lease_id = x.lease_id and x.id <> all(coalesce(s.riders, '{}')))) * 1000 - ${t0})::int as sent_ms,
             (extract(epoch from x.settled_at) * 1000 - ${t0})::int as settled_ms,
             x.reconciled_at is not null as reconciled
      from reservations x join jobs j on j.id = x.job_id where x.job_id = any(${mismatchIds}::uuid[]) order by 1, 2`;
    const mismatchCalls = calls.filter((c) => { const t = tagOfParams(c.params); return t !== null && mismatchTags.has(t); })
      .map((c) => ({ tag: tagOfParams(c.params), atMs: Math.round(c.atMs - t0), status: c.status, credits: c.credits, batch: c.batch }));
    // A re-run after a lost worker belongs to a worker-kill fault (a SIGTERM settles what it knows).
    const killSpans = faults.map((f, i) => [f, i] as const).filter(([f]) => f.kind === 'worker-kill').map(([, i]) => i);
    const rerunFaults = faultOfJobs(verdict.rerunAfterWorkerLoss.map((d) => d.tag), callTimes, spans, 3_000, 2 * o.leaseS * 1000);
    const rerunsOutsideKills = [...rerunFaults.values()].filter((i) => !killSpans.includes(i)).length;

    const targets: Record<string, Check> = {
      lost: check(verdict.lost.length, '= 0 (every accepted job ends)', verdict.lost.length === 0),
      doubleBilled: check(doubleBilled, '= 0 (no job billed twice but for a worker lost mid-call, nor called more than its attempts)', doubleBilled === 0),
      rerunsOutsideWorkerKills: check(rerunsOutsideKills, '= 0 (a job is re-run after a lost worker only when a worker was killed)', rerunsOutsideKills === 0),
      perJobMismatches: check(verdict.perJobMismatches.length, "= 0 (each job's creditsBilled = what the provider billed for it)", verdict.perJobMismatches.length === 0),
      perTenantMismatches: check(perTenantMismatches.length, "= 0 (each tenant's ledger = what the provider billed for its jobs)", perTenantMismatches.length === 0),
      usageHistoryMismatches: check(historyMismatches.length, '= 0 (usage history = ledger)', historyMismatches.length === 0),
      unexpectedExits: check(unexpectedExits.length, '= 0 (no node exits unless a fault kills it)', unexpectedExits.length === 0),
      stalledTenants: check(stalled.length, `= 0 (no tenant without a finished job for > ${o.stallBoundS} s)`, stalled.length === 0),
      faultsNotRecovered: check(notRecovered.length, `= 0 (every tenant settles and is answered within ${o.recoveryBoundS} s of each fault's end)`, faults.length > 0 ? notRecovered.length === 0 : null),
      quiescentS: check(drainedAt === null ? null : (drainedAt - submittedEndMs) / 1000, `reached within ${o.drainMaxS} s`, drainedAt !== null),
      postgresErrors: check(pgErrors.length, "= 0 (no ERROR line in Postgres's log)", pgErrors.length === 0),
      unattributedCalls: check(unattributed + verdict.callsForUnknownJobs, 'reported (upstream calls naming no job)', null),
    };
    const sample = <T>(xs: T[]) => xs.slice(0, 10);
    // The headline figures, in the summary and at the top level of the JSON alike.
    const headline = {
      jobs: accepted.size,
      lost: verdict.lost.length,
      doubleBilled,
      rerunAfterWorkerLoss: verdict.rerunAfterWorkerLoss.length,
      perJobMismatches: verdict.perJobMismatches.length,
      perTenantMismatches: perTenantMismatches.length,
      stalledTenants: stalled.map((s) => s.tenant),
    };
    return {
      summary: {
        ...headline,
        faults: faults.map((f) => `${f.kind}@${f.atS}s: recovered ${f.recoverySeconds === null ? 'never' : `in ${f.recoverySeconds} s`}; caught ${f.caught.lost} lost, ${f.caught.doubleBilled} double-billed, ${f.caught.perJobMismatches} mis-billed jobs`),
        maxRecoverySeconds: maxRecovery,
        replays: sub.replays,
        quiescentAfterS: drainedAt === null ? null : round((drainedAt - submittedEndMs) / 1000, 1),
      },
      targets,
      faultsSurvived: faults,
      ...headline,
      details: {
        jobStates: states,
        faultyJobsOutsideEveryFault: outsideFaults,
        unexpectedExits,
        jobsInDatabase: jobs.length,
        storedButNeverAnswered: jobs.filter((j) => j.tag !== null && !accepted.has(j.id)).length,
        lostSample: sample(verdict.lost),
        doubleBilledSample: sample(verdict.doubleBilled),
        rerunAfterWorkerLossSample: sample(verdict.rerunAfterWorkerLoss),
        doubleBilledWhy: {
          billedTwice: verdict.doubleBilled.filter((d) => d.why.includes('billedTwice')).length,
          callsOverAttempts: verdict.doubleBilled.filter((d) => d.why.includes('callsOverAttempts')).length,
        },
        perJobMismatchSample: sample(verdict.perJobMismatches),
        perJobMismatchAttempts: mismatchAttempts,
        postgresErrorSample: pgErrors.slice(0, 10),
        perJobMismatchCalls: mismatchCalls,
        jobsWhoseReservationsDisagreeWithCreditsBilled: reservationMismatches,
        perTenant,
        submissions: sub,
        badAnswerWindows: { jobsAnswered200: badTags.size, finalStates: badStates, badAnswersGiven: simStats.keys[sim.apiKey]?.badAnswers ?? 0 },
        provider: { calls: simStats.totals.calls, billedCalls: simStats.totals.billedCalls, creditsBilled: simStats.totals.creditsBilled, rateLimited: simStats.totals.rateLimited, concurrencyLimited: simStats.totals.concurrencyLimited, responses: simStats.keys[sim.apiKey]?.responses ?? {} },
        sluice: { creditsBilled: jobs.reduce((a, j) => a + j.creditsBilled, 0), ledgerCreditsUsed: perTenant.reduce((a, p) => a + p.ledgerCreditsUsed, 0) },
        machineCpuBusy: busy,
      },
      postgresUnderTest: { source: 'embedded, private to this run (the bench stops and starts it; the `postgres` field above is the server the runner probed, unused)', version: pgVersion, port: pgPort },
      setup: {
        nodes: `1 api + ${workers.length} worker processes (bench/lib/sluice-child.ts; SIGTERM = graceful stop, as npm start), DB_POOL_MAX ${o.poolMax}, on one embedded Postgres the bench stops and starts (never the shared server; --pg is ignored)`,
        upstream: `simulator PRO plan at ${o.planRate}/min (paced at 0.9), 500 concurrent calls, latency median ${o.latencyMs} ms p95 ${o.latencyP95Ms} ms, call log on`,
        tenants: `${o.tenants} tenants (weight 1, cap 100) submitting ${o.rate} jobs/s in all, submitJobs of ${o.batch}, ${Math.round(o.emailShare * 100)} % ${BAD_ANSWER_API} (5 credits) else dnslookup (1 credit), each job tagged in its idempotency key and its param; a 5xx/429/timeout/refused connection replayed with the same body for up to ${o.replayMaxS} s`,
        faults: `${o.faults.join(', ') || 'none'}, first at ${o.firstFaultS} s, then ${o.faultGapS} s after each one ends; Postgres outage ${o.outageS} s vs ATTEMPT_LEASE_SECONDS ${o.leaseS}; bad answers for ${o.badAnswerS} s on ${BAD_ANSWER_API} (${o.badKinds.join(', ')} in turn, probability ${o.badProbability})`,
        judged: `recovery = from a fault's end until every tenant has a job finish and a submission answered (bound ${o.recoveryBoundS} s); stalled = a tenant with no job finishing for > ${o.stallBoundS} s while submitting`,
        durationS: o.durationS,
        extraEnv: o.extraEnv,
      },
    };
  } finally {
    for (const w of workers) await w?.stop().catch(() => null);
    await api?.stop().catch(() => null);
    await sqlClient?.end({ timeout: 2 }).catch(() => {});
    if (sim) await sim.stop();
    await pgServer?.stop().catch(() => {});
    rmSync(pgDir, { recursive: true, force: true });
  }
}
