/**
 * `npm run bench -- noisy-neighbor`: one tenant's traffic must not slow
 * another's (I12 at the front door). A Sluice API process (SLUICE_ROLE=api by
 * default, so queues hold still; `--role all` adds the dispatcher) on a fresh
 * database; two PRO tenants at their tier's request budget.
 *
 * - quiet: submits 10 jobs/s (`submitJob`) and reads `me` 5 times a second over
 *   HTTP, open loop (a request is sent on time whether or not the last one
 *   answered); its latency p50/p99 alone, then while the noisy tenant runs.
 * - noisy: holds 2,000 waiting jobs; 20 HTTP clients send the costliest allowed
 *   read in a loop, without waiting out Retry-After (the worst neighbour);
 *   holds 20 `tenantUsage` subscriptions over graphql-ws and tries 20 over
 *   HTTP SSE (counted as held or refused).
 * - SQL statements per costliest read (SLUICE_COUNT_SQL in the child, three
 *   reads in a row, nothing else running), and the budget's own round trip
 *   (the charge statement, timed from the bench process against the same
 *   database).
 */
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import postgres from 'postgres';
import type { FlagReader } from './lib/args.ts';
import { createTenant, gql } from './lib/gql.ts';
import { progress } from './lib/log.ts';
import { cpuMeter } from './lib/machine.ts';
import { freshDatabase, type BenchPostgres } from './lib/pg.ts';
import { ADMIN_TOKEN, parseEnvFlag, startSluiceFor } from './lib/sluice.ts';
import { check, percentile, round, sleep, type Check } from './lib/stats.ts';
import { chargeBudget } from '../src/tenants/budget-store.ts';

export const description = "a quiet tenant's latency alone and beside a tenant sending the costliest reads from 20 clients with 20+20 subscriptions; 429s; SQL per costliest read";

export const COSTLIEST_READ =
  '{ jobs(first: 500) { totalCount edges { node { id state waitReason estimatedStartAt } } } me { estimatedDrainSeconds queues { priority depth waitReason } } }';
const QUIET_READ = '{ me { usage { creditsUsed creditsRemaining } queues { priority depth waitReason } } }';
const SUBMIT = 'mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }';
const USAGE_SUB = 'subscription { tenantUsage { usage { creditsUsed } queues { priority depth } } }';

interface Sample {
  kind: 'submit' | 'read';
  ms: number;
  status: number;
}

async function post(url: string, key: string, query: string, variables: Record<string, unknown> = {}): Promise<{ status: number; retryAfter: string | null; code: string | null }> {
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify({ query, variables }) });
  const body = (await res.json()) as { errors?: Array<{ extensions?: { code?: string } }> };
  return { status: res.status, retryAfter: res.headers.get('retry-after'), code: body.errors?.[0]?.extensions?.code ?? null };
}

/** The quiet tenant for `seconds`: 10 submissions and 5 reads a second, open loop. */
async function quietPhase(url: string, key: string, seconds: number): Promise<Sample[]> {
  const samples: Sample[] = [];
  const pending: Promise<void>[] = [];
  const send = (kind: Sample['kind']) => {
    const t0 = performance.now();
    const p = (kind === 'submit' ? post(url, key, SUBMIT, { i: { api: 'emailvalidator', params: { email: 'q@example.com' } } }) : post(url, key, QUIET_READ))
      .then((r) => void samples.push({ kind, ms: performance.now() - t0, status: r.status }))
      .catch(() => void samples.push({ kind, ms: performance.now() - t0, status: 0 }));
    pending.push(p);
  };
  const start = performance.now();
  for (let tick = 0; performance.now() - start < seconds * 1000; tick++) {
    send('submit');
    if (tick % 2 === 0) send('read');
    const next = start + (tick + 1) * 100;
    await sleep(Math.max(0, next - performance.now()));
  }
  await Promise.all(pending);
  return samples;
}

function latency(samples: Sample[]) {
  const ok = samples.filter((s) => s.status === 200).map((s) => s.ms);
  const of = (k: Sample['kind']) => samples.filter((s) => s.kind === k && s.status === 200).map((s) => s.ms);
  return {
    requests: samples.length,
    notOk: samples.filter((s) => s.status !== 200).length,
    p50Ms: round(percentile(ok, 50), 1),
    p99Ms: round(percentile(ok, 99), 1),
    submitP99Ms: round(percentile(of('submit'), 99), 1),
    readP99Ms: round(percentile(of('read'), 99), 1),
  };
}

export async function run(pg: BenchPostgres, flags: FlagReader) {
  const seconds = flags.number('seconds', 15);
  const clients = flags.number('clients', 20);
  const subscriptions = flags.number('subscriptions', 20);
  const backlog = flags.number('backlog', 2000);
  const role = flags.string('role', 'api');
  const mode = flags.bool('inproc') ? ('inproc' as const) : ('child' as const);
  const extraEnv = parseEnvFlag(flags.optionalString('env'));
  flags.done();

  const db = await freshDatabase(pg.adminUrl, 'noisy');
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  let sluice: Awaited<ReturnType<typeof startSluiceFor>> | null = null;
  const wsClients: Client[] = [];
  const sse: AbortController[] = [];
  try {
    sluice = await startSluiceFor({ DATABASE_URL: db.url, SLUICE_ROLE: role, SLUICE_COUNT_SQL: '1', ...extraEnv }, mode);
    const url = sluice.url!;
    const limits = { weight: 2, concurrencyCap: 8, monthlyQuota: 1_000_000_000, queueBound: 1_000_000 };
    const quiet = await createTenant(url, ADMIN_TOKEN, 'quiet', limits);
    const noisy = await createTenant(url, ADMIN_TOKEN, 'noisy', limits);
    const budget = (await gql<{ tenants: Array<{ id: string; requestBurst: number; requestRate: number }> }>(url, ADMIN_TOKEN, '{ tenants { id requestBurst requestRate } }')).tenants.find((t) => t.id === noisy.id)!;
    progress(`noisy tenant: ${backlog} waiting jobs`);
    const jobs = Array.from({ length: backlog }, (_, i) => ({ api: 'emailvalidator', params: { email: `n${i}@example.com` }, priority: (['INTERACTIVE', 'STANDARD', 'BULK'] as const)[i % 3] }));
    for (let i = 0; i < jobs.length; i += 1000) await gql(url, noisy.apiKey, 'mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs: jobs.slice(i, i + 1000) } });

    // SQL statements per costliest read: three in a row with nothing else running (the bucket holds 2,000 points).
    const reads = 3;
    const s0 = await sluice.statements();
    let requested = 0;
    for (let i = 0; i < reads; i++) {
      const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${noisy.apiKey}` }, body: JSON.stringify({ query: COSTLIEST_READ }) });
      const body = (await res.json()) as { extensions?: { cost?: { requestedQueryCost: number } }; errors?: unknown };
      if (res.status !== 200) throw new Error(`costliest read answered ${res.status}: ${JSON.stringify(body).slice(0, 300)}`);
      requested = body.extensions?.cost?.requestedQueryCost ?? 0;
    }
    await sleep(200); // the refunds (sent after each answer) land
    const s1 = await sluice.statements();
    const statementsPerRead = s0 !== null && s1 !== null ? round((s1 - s0) / reads, 1) : null;
    progress(`costliest read: ${statementsPerRead} statements, ${requested} points requested`);

    // The budget's own round trip: the charge statement, from here, on the same database (a throwaway tenant row).
    const [probe] = await sql`select id from tenants where name = 'quiet'`;
    const rtt: number[] = [];
    for (let i = 0; i < 200; i++) {
      const t0 = performance.now();
      await chargeBudget(sql, probe!.id as string, { burst: 1e9, rate: 1e9 }, 0);
      rtt.push(performance.now() - t0);
    }

    progress(`quiet alone for ${seconds} s`);
    const cpuAlone = cpuMeter();
    const alone = latency(await quietPhase(url, quiet.apiKey, seconds));
    const busyAlone = cpuAlone.end();
    progress(`quiet alone: p50 ${alone.p50Ms} ms, p99 ${alone.p99Ms} ms`);

    // The noise: subscriptions first, then the read loops.
    let wsHeld = 0;
    let wsRefused = 0;
    for (let i = 0; i < subscriptions; i++) {
      const c = createClient({ url: url.replace(/^http/, 'ws'), webSocketImpl: WebSocket, connectionParams: { authorization: `Bearer ${noisy.apiKey}` }, retryAttempts: 0, lazy: true });
      wsClients.push(c);
      await new Promise<void>((resolve) => {
        let first = true;
        c.subscribe({ query: USAGE_SUB }, {
          next: () => {
            if (first) (first = false), wsHeld++, resolve();
          },
          error: () => {
            if (first) (first = false), wsRefused++, resolve();
          },
          complete: () => {
            if (first) (first = false), wsRefused++, resolve();
          },
        });
        setTimeout(() => first && ((first = false), wsRefused++, resolve()), 5_000);
      });
    }
    let sseHeld = 0;
    const sseRefusals: Record<string, number> = {};
    for (let i = 0; i < subscriptions; i++) {
      const ac = new AbortController();
      sse.push(ac);
      try {
        const res = await fetch(url, {
          method: 'POST',
          signal: ac.signal,
          headers: { 'content-type': 'application/json', accept: 'text/event-stream', authorization: `Bearer ${noisy.apiKey}` },
          body: JSON.stringify({ query: USAGE_SUB }),
        });
        if (res.status === 200 && (res.headers.get('content-type') ?? '').includes('text/event-stream')) {
          sseHeld++;
          void (async () => {
            try {
              for await (const _ of res.body as unknown as AsyncIterable<Uint8Array>) { /* keep reading */ }
            } catch { /* aborted at the end */ }
          })();
        } else {
          const key = String(res.status);
          sseRefusals[key] = (sseRefusals[key] ?? 0) + 1;
          await res.text().catch(() => '');
        }
      } catch {
        sseRefusals.error = (sseRefusals.error ?? 0) + 1;
      }
    }
    progress(`noisy subscriptions: graphql-ws held ${wsHeld}, refused ${wsRefused}; SSE held ${sseHeld}, refused ${JSON.stringify(sseRefusals)}`);

    const noisyStats = { ok: 0, throttled: 0, throttledWithRetryAfter: 0, other: 0, errors: 0 };
    let stop = false;
    const loops = Array.from({ length: clients }, async () => {
      while (!stop) {
        try {
          const r = await post(url, noisy.apiKey, COSTLIEST_READ);
          if (r.status === 200) noisyStats.ok++;
          else if (r.status === 429 && r.code === 'THROTTLED') {
            noisyStats.throttled++;
            if (r.retryAfter && /^\d+$/.test(r.retryAfter)) noisyStats.throttledWithRetryAfter++;
          } else noisyStats.other++;
        } catch {
          noisyStats.errors++;
        }
      }
    });
    await sleep(1_000); // the noise is under way
    progress(`quiet beside the noise for ${seconds} s`);
    const cpuNoisy = cpuMeter();
    const t0 = performance.now();
    const during = latency(await quietPhase(url, quiet.apiKey, seconds));
    const noisySeconds = (performance.now() - t0) / 1000;
    const busyNoisy = cpuNoisy.end();
    const snapshot = { ...noisyStats };
    stop = true;
    await Promise.all(loops);
    progress(`quiet beside the noise: p50 ${during.p50Ms} ms, p99 ${during.p99Ms} ms; noisy ${JSON.stringify(snapshot)}`);

    const bound = Math.max(200, 2 * alone.p99Ms);
    const targets: Record<string, Check> = {
      quietP99DuringNoise: check(during.p99Ms, `quiet p99 beside the noise <= max(200 ms, 2 x its p99 alone) = ${round(bound, 1)} ms`, during.p99Ms <= bound),
      noisyThrottled: check(
        snapshot.throttled,
        'the noisy tenant is answered 429 THROTTLED with Retry-After once over its budget',
        snapshot.throttled > 0 && snapshot.throttledWithRetryAfter === snapshot.throttled,
      ),
      statementsPerCostliestRead: check(statementsPerRead, 'the costliest allowed read runs <= 20 SQL statements (budget charge and refund included)', statementsPerRead !== null && statementsPerRead <= 20),
    };
    return {
      summary: {
        quietAlone: alone,
        quietDuringNoise: during,
        noisy: {
          ...snapshot,
          okPerSecond: round(snapshot.ok / noisySeconds, 1),
          servedPointsPerSecond: round((snapshot.ok * requested) / noisySeconds, 1),
          budget: { burst: budget.requestBurst, restoreRate: budget.requestRate },
          graphqlWs: { held: wsHeld, refused: wsRefused },
          sse: { held: sseHeld, refused: sseRefusals },
        },
        costliestRead: { statements: statementsPerRead, requestedPoints: requested },
        budgetRoundTripMs: { p50: round(percentile(rtt, 50), 2), p99: round(percentile(rtt, 99), 2) },
        cpuBusyShare: { alone: busyAlone, duringNoise: busyNoisy },
      },
      targets,
      setup: {
        mode,
        role,
        seconds,
        clients,
        subscriptions,
        backlog,
        quiet: 'submitJob 10/s + me 5/s over HTTP, open loop',
        noisy: `${clients} HTTP clients looping the costliest read (Retry-After ignored), ${subscriptions} tenantUsage over graphql-ws, ${subscriptions} over SSE`,
      },
    };
  } finally {
    for (const ac of sse) ac.abort();
    await Promise.all(wsClients.map((c) => c.dispose())).catch(() => {});
    await sql.end({ timeout: 2 }).catch(() => {});
    if (sluice) await sluice.stop().catch(() => null);
    await db.drop();
  }
}
