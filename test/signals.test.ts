/**
 * The right reaction to each provider signal, against the simulator over real
 * HTTP: credits running out mid-run, one API failing, one key deactivated, and
 * an age promise broken and kept again. Alerts reach a real webhook.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { assertQuiescent } from './helpers/invariants.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;

/** A webhook receiver that records what it is sent. */
async function webhook(): Promise<{ url: string; received: any[]; close(): Promise<void> }> {
  const received: any[] = [];
  const server: Server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      received.push(JSON.parse(body));
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`, received, close: () => new Promise((r) => server.close(() => r())) };
}

async function countStates(sql: postgres.Sql): Promise<Record<string, number>> {
  const rows = await sql`select state, count(*)::int as n from jobs group by state`;
  return Object.fromEntries(rows.map((r) => [r.state, r.n]));
}

describe('credits run out mid-run', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;
  let hook: Awaited<ReturnType<typeof webhook>>;

  before(async () => {
    hook = await webhook();
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, credits: 40, latencyMs: 30, latencyP95Ms: 30, seed: 11 });
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '6000',
      ALERT_WEBHOOK_URL: hook.url,
      CLASS_AGE_PROMISE_SECONDS: 'STANDARD=2',
      SWEEP_INTERVAL_MS: '200',
      INITIAL_LATENCY_MS: '30',
      LEASE_MAX: '2',
      // At most 8 calls in flight: one lease call fills the pool's room (across turns of LEASE_MAX),
      // so the pool, not LEASE_MAX x loops, bounds the calls that can meet the empty account.
      POOL_MAX: '8',
      // Single calls: this checks that only calls in flight meet the empty account. A batch's items
      // beyond the credits get per-item 402s by design (test/batching.test.ts covers that).
      BATCH_MAX: '1',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
    await hook.close();
  });

  test('dispatch stops at the signal, a human is paged, nothing is lost, and resuming finishes the work', async () => {
    const tenant = await t.createTenant('spender', 'ENTERPRISE');
    const jobs = Array.from({ length: 100 }, (_, i) => ({ api: 'dnslookup', params: { domain: `c${i}.example` } }));
    await t.gql(SUBMIT_MANY, { i: { jobs } }, tenant.apiKey);

    const stopped = await eventually(async () => {
      const r = await t.gql(`{ system { account { dispatchStoppedUntil stopReason creditsRemaining } alerts { key severity message } } }`);
      const s = r.body.data.system;
      return s.account.dispatchStoppedUntil && s.alerts.some((a: any) => a.key === 'CREDITS_EXHAUSTED') ? s : null;
    }, 20_000, 100);
    assert.equal(stopped.account.stopReason, 'CREDITS_EXHAUSTED');
    assert.equal(stopped.alerts.find((a: any) => a.key === 'CREDITS_EXHAUSTED').severity, 'page');

    // Nothing leaves after the signal: the provider's count stands still.
    const key = () => sim.stats().keys[sim.apiKey]!;
    const refusedAtStop = key().creditsExhausted;
    const callsAtStop = key().calls;
    assert.ok(refusedAtStop >= 1);
    assert.ok(refusedAtStop <= 8, `only calls already in flight met the empty account (${refusedAtStop})`);
    await new Promise((r) => setTimeout(r, 1_000));
    assert.equal(key().calls, callsAtStop, 'no upstream call after the signal');

    // Nothing lost: every job succeeded or waits.
    const states = await countStates(sql);
    assert.equal((states.SUCCEEDED ?? 0) + (states.QUEUED ?? 0), 100, JSON.stringify(states));
    assert.equal(states.SUCCEEDED, 40, 'exactly the credits there were');
    const me = await t.gql(`{ me { queues { priority waitReason } } }`, {}, tenant.apiKey);
    assert.equal(me.body.data.me.queues.find((q: any) => q.priority === 'STANDARD').waitReason, 'CREDITS_EXHAUSTED');

    // A human was paged through the webhook; the waiting work also breaks its age promise.
    await eventually(async () => hook.received.some((m) => m.event === 'raised' && m.alert.key === 'CREDITS_EXHAUSTED'), 10_000);
    await eventually(async () => hook.received.some((m) => m.event === 'raised' && m.alert.key === 'AGE_PROMISE:STANDARD'), 10_000);

    // Credits bought; an admin resumes; the rest finishes and the alerts clear.
    sim.setCredits(1_000);
    const resumed = await t.gql(`mutation { resumeDispatch { account { dispatchStoppedUntil } } }`);
    assert.equal(resumed.body.data.resumeDispatch.account.dispatchStoppedUntil, null);
    await eventually(async () => (await countStates(sql)).SUCCEEDED === 100, 30_000, 200);
    await eventually(async () => {
      const r = await t.gql(`{ system { alerts { key } } }`);
      return r.body.data.system.alerts.length === 0;
    }, 10_000, 200);
    assert.ok(hook.received.some((m) => m.event === 'cleared' && m.alert.key === 'CREDITS_EXHAUSTED'));
    assert.ok(hook.received.some((m) => m.event === 'cleared' && m.alert.key === 'AGE_PROMISE:STANDARD'));
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from reservations where settled_at is null`;
      return r!.n === 0;
    });
    await assertQuiescent(sql);
    const [ledger] = await sql`select sum(billed)::int as billed from tenant_ledger`;
    assert.equal(ledger!.billed, 100, 'refused calls were refunded; each job billed once');

    // The same story in the metrics.
    const text = await (await fetch(t.url.replace('/graphql', '/metrics'))).text();
    const value = (line: RegExp) => Number(text.split('\n').find((l) => line.test(l))?.split(' ').pop() ?? NaN);
    assert.ok(value(/^sluice_provider_429_total\{kind="credits"\}/) >= 1, 'credit 429s are counted');
    assert.equal(value(/^sluice_outcomes_total\{kind="billed"\}/), 100);
    assert.equal(value(/^sluice_credits_billed_total /), 100);
    assert.ok(value(/^sluice_alerts_raised_total\{alert="CREDITS_EXHAUSTED"\}/) >= 1);
    assert.ok(value(/^sluice_dispatches_total\{window="primary",class="STANDARD"\}/) >= 100);
    assert.match(text, /^sluice_queue_depth\{class="STANDARD"\} 0$/m);
    assert.doesNotMatch(text, /tenant=/, 'no tenant labels unless asked for');
  });
});

describe('one API fails, one key is deactivated', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 600, burst: 10, subKeys: ['apv_sbk_live'], latencyMs: 20, latencyP95Ms: 20, seed: 13 });
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_SUB_KEYS: 'apv_sbk_live',
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '600',
      // Below the simulator's bucket of 10: Sluice takes a token at the lease and the provider at the
      // call's arrival, so a call that reaches it late (a loaded machine's first connection) eats into
      // the bucket's refill; with no headroom that one token trips the 50 s cooldown, as it did here
      // now and then before this was 5 (README: PACER_BURST).
      PACER_BURST: '5',
      SWEEP_INTERVAL_MS: '200',
      INITIAL_LATENCY_MS: '20',
      BREAKER_MIN_CALLS: '4',
      BREAKER_WINDOW: '8',
      BREAKER_HALF_OPEN_SECONDS: '2',
      JOB_RETRY_LIMIT: '20',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  test("an API answering 500 to everything opens its breaker; the other APIs keep >= 95% of their throughput", async () => {
    const a = await t.createTenant('rates', 'PRO');
    const b = await t.createTenant('dns', 'PRO');
    const rateJobs = (n: number, tag: string) => Array.from({ length: n }, (_, i) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: ['EUR', 'GBP', 'JPY'][i % 3] }, idempotencyKey: `${tag}-${i}` }));
    const dnsJobs = (n: number, tag: string) => Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}${i}.example` } }));
    const succeeded = async () => {
      const [r] = await sql`select count(*)::int as n from jobs where api = 'exchangerate' and state = 'SUCCEEDED'`;
      return r!.n;
    };
    // Both tenants busy: exchangerate gets its fair half of the 9/s pace.
    const measure = async (seconds: number) => {
      const from = await succeeded();
      await new Promise((r) => setTimeout(r, seconds * 1000));
      return ((await succeeded()) - from) / seconds;
    };
    await t.gql(SUBMIT_MANY, { i: { jobs: rateJobs(200, 'a') } }, a.apiKey);
    await t.gql(SUBMIT_MANY, { i: { jobs: dnsJobs(200, 'a') } }, b.apiKey);
    await new Promise((r) => setTimeout(r, 1_500)); // past the initial burst
    const before = await measure(4);
    sim.setConditions({ apis: { dnslookup: { outage: 500 } } });
    await eventually(async () => {
      const r = await t.gql(`{ system { breakers { api state } } }`);
      return r.body.data.system.breakers.some((x: any) => x.api === 'dnslookup' && x.state === 'OPEN');
    }, 30_000, 100).catch(async (err) => {
      // It has failed now and then on a clean clone, not yet explained: the error itself says what the
      // published breakers, the jobs, the queues, the window and the simulator's primary key were
      // doing (CI keeps the failure summary; output printed beside it may be cut).
      const key = sim.stats().keys[sim.apiKey];
      const facts = {
        breakers: await sql`select api, state, opened_at, retry_at, round(extract(epoch from now() - updated_at)::numeric, 1) as age_s from breakers`,
        jobs: await sql`select api, state, count(*)::int as n, max(attempts) as attempts from jobs group by 1, 2 order by 1, 2`,
        queues: await sql`select q.tenant_id, q.class, q.ready_at, q.depth, q.running, t.in_flight, t.cap from sched_queues q join sched_tenants t using (tenant_id)`,
        windows: await sql`select name, in_flight, pool_size, tokens, paused_until, pause_reason from windows`,
        simulator: key && { httpRequests: key.httpRequests, responses: key.responses, rateLimited: key.rateLimited, callsInCooldown: key.callsInCooldown, batchItems: key.batchItems, timeline: key.timeline, inFlight: key.inFlight },
      };
      throw new Error(`${(err as Error).message}: ${JSON.stringify(facts)}`);
    }); // a liveness bound, not a timing: 5-8 s on a quiet machine, past 10 s once under a loaded one
    const during = await measure(4);
    if (during < 0.95 * before) {
      console.error(await sql`select api, state, count(*), max(attempts) from jobs group by 1,2`);
      console.error(await sql`select q.*, t.in_flight, t.cap from sched_queues q join sched_tenants t using (tenant_id) where q.ready_at is not null`);
      console.error(await sql`select name, in_flight, pool_size, tokens, paused_until from windows`);
    }
    assert.ok(during >= 0.95 * before, `exchangerate completed ${during.toFixed(2)}/s with dnslookup failing, vs ${before.toFixed(2)}/s before`);
    const [failedRates] = await sql`select count(*)::int as n from jobs where api = 'exchangerate' and state = 'FAILED'`;
    assert.equal(failedRates!.n, 0);
    const me = await t.gql(`{ me { queues { priority waitReason } } }`, {}, b.apiKey);
    assert.ok(['BREAKER_OPEN', 'RATE'].includes(me.body.data.me.queues.find((q: any) => q.priority === 'STANDARD').waitReason));
    // The API recovers: a half-open probe closes the breaker and dns jobs run again.
    sim.setConditions({ apis: { dnslookup: null } });
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where api = 'dnslookup' and state = 'SUCCEEDED'`;
      return r!.n > 0;
    }, 20_000, 200);
    const r = await t.gql(`{ system { breakers { api state } } }`);
    await eventually(async () => {
      const x = await t.gql(`{ system { breakers { api state } } }`);
      return x.body.data.system.breakers.find((b: any) => b.api === 'dnslookup')?.state === 'CLOSED';
    }, 10_000, 100);
    assert.ok(r.body.data.system.breakers.length >= 1);
  });

  test('a deactivated sub-key stops only its window, with an alert; fixing it and resuming runs the rest', async () => {
    const c = await t.createTenant('mixed', 'ENTERPRISE');
    sim.deactivateKey('apv_sbk_live');
    const interactive = Array.from({ length: 5 }, (_, i) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: 'EUR' }, priority: 'INTERACTIVE', idempotencyKey: `i${i}` }));
    const standard = Array.from({ length: 5 }, (_, i) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: 'GBP' }, priority: 'STANDARD', idempotencyKey: `s${i}` }));
    await t.gql(SUBMIT_MANY, { i: { jobs: [...interactive, ...standard] } }, c.apiKey);
    const stopped = await eventually(async () => {
      const r = await t.gql(`{ system { windows { name pausedUntil pauseReason } alerts { key } } }`);
      const w = r.body.data.system.windows.find((x: any) => x.name === 'sub1');
      return w.pauseReason === 'KEY_UNUSABLE' && r.body.data.system.alerts.some((a: any) => a.key === 'KEY_UNUSABLE:sub1') ? r.body.data.system : null;
    }, 15_000, 100);
    assert.equal(stopped.windows.find((x: any) => x.name === 'primary').pauseReason === 'KEY_UNUSABLE', false, 'the primary window carries on');
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where tenant_id = ${c.id} and priority = 'STANDARD' and state = 'SUCCEEDED'`;
      return r!.n === 5;
    }, 20_000, 100);
    const [waiting] = await sql`select count(*)::int as n from jobs where tenant_id = ${c.id} and priority = 'INTERACTIVE' and state = 'QUEUED'`;
    assert.equal(waiting!.n, 5, 'INTERACTIVE jobs wait, none lost or failed');
    const me = await t.gql(`{ me { queues { priority waitReason } } }`, {}, c.apiKey);
    assert.equal(me.body.data.me.queues.find((q: any) => q.priority === 'INTERACTIVE').waitReason, 'KEY_UNUSABLE');

    sim.activateKey('apv_sbk_live');
    await t.gql(`mutation { resumeDispatch(window: "sub1") { windows { name pauseReason } } }`);
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where tenant_id = ${c.id} and state = 'SUCCEEDED'`;
      return r!.n === 10;
    }, 20_000, 100);
  });
});
