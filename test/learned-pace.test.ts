/**
 * The learned pace over real HTTP against the simulator: Sluice is configured at twice the key's
 * real window. The provider's answers state the real window, so the shared rate comes down to
 * it × PACE_FRACTION and the 429s stop; when the real window grows past the configuration the rate
 * climbs back step by step and never above the configured rate. `system { windows }` and
 * /metrics show both rates. A new window starts slowly, so the stated window is learned before a
 * burst at the configured rate trips the provider. A provider that states no window at all is
 * found by its 429s (multiplicative decrease, additive increase on any other answer), and a
 * retry-after beyond RETRY_AFTER_MAX_SECONDS ends in a single probe call at the floor rate.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

/** Sluice told 2,400/min against the simulator, single calls, samples and steps sped up for the test. */
function pacedEnv(sim: Simulator): Record<string, string> {
  return {
    APIVERVE_API_KEY: sim.apiKey,
    APIVERVE_BASE_URL: sim.url,
    APIVERVE_RATE_PER_MINUTE: '2400',
    APIVERVE_CONCURRENT_CALLS: '50',
    BATCH_MAX: '1',
    INITIAL_LATENCY_MS: '20',
    PACE_SAMPLE_MS: '200',
    PACE_STEP_MS: '500',
  };
}

const WINDOWS = `{ system { windows { name ratePerMinute configuredRatePerMinute observedLimitPerMinute paceReason pacedAt burst } } }`;

describe('a pace learned from the provider', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;
  let tenant: { id: string; apiKey: string };

  const primary = async () => {
    const r = await t.gql(WINDOWS);
    return r.body.data.system.windows.find((w: any) => w.name === 'primary');
  };
  const rateLimited = () => sim.stats().keys[sim.apiKey]!.rateLimited;
  const succeeded = async () => (await sql`select count(*)::int as n from jobs where state = 'SUCCEEDED'`)[0]!.n as number;

  before(async () => {
    // The key really allows 1,200/min (burst 60, cooldown 2 s); Sluice is told 2,400/min.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 1200, cooldownSeconds: 2, latencyMs: 20, latencyP95Ms: 20, seed: 7, concurrentCalls: 50 });
    t = await startTestApp(pacedEnv(sim));
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    tenant = await t.createTenant('importer', 'ENTERPRISE');
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  const submit = async (n: number, tag: string) => {
    for (let i = 0; i < n; i += 500) {
      const jobs = Array.from({ length: Math.min(500, n - i) }, (_, k) => ({ api: 'dnslookup', params: { domain: `${tag}${i + k}.example` } }));
      const r = await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`, { i: { jobs } }, tenant.apiKey);
      assert.ok(r.body.data, JSON.stringify(r.body.errors));
    }
  };

  test('configured at twice the real window: a slow start finds it before a burst trips the provider, and the 429s never come', async () => {
    const start = await primary();
    assert.equal(start.configuredRatePerMinute, 2160, 'configured: 2,400 × 0.9');
    assert.equal(start.paceReason, 'START', 'a new window starts slowly');
    assert.ok(Math.abs(start.ratePerMinute - 540) < 1e-6, `at PACE_START (0.25) of the configured rate (${start.ratePerMinute})`);
    assert.ok(start.burst <= 27 + 1e-6, `with its burst scaled down (${start.burst})`);
    const r0 = rateLimited();
    await submit(1500, 'a');

    const lowered = await eventually(async () => {
      const w = await primary();
      return w.paceReason !== 'START' && w.ratePerMinute <= 1080 + 1e-6 ? w : null;
    }, 30_000, 50);
    assert.equal(lowered.configuredRatePerMinute, 2160, 'the configuration is unchanged');
    assert.equal(lowered.observedLimitPerMinute, 1200, "the provider's stated window");
    assert.ok(['LIMIT', 'CLIMB'].includes(lowered.paceReason), `the start ended at the stated window (got ${lowered.paceReason})`);
    assert.ok(lowered.burst <= 60, `the burst scales with the rate (${lowered.burst})`);
    assert.equal(rateLimited() - r0, 0, 'the start learned the window before any 429');

    // Past any pause the first calls caused, the next 300 calls get no 429.
    await eventually(async () => {
      const w = await t.gql(`{ system { windows { name pausedUntil } } }`);
      return w.body.data.system.windows.every((x: any) => x.pausedUntil === null) ? true : null;
    }, 30_000, 50);
    const before429 = rateLimited();
    const done = await succeeded();
    await eventually(async () => ((await succeeded()) >= done + 300 ? true : null), 60_000, 100);
    assert.equal(rateLimited() - before429, 0, 'no 429 once the pace is learned');
    const w = await primary();
    assert.ok(w.ratePerMinute <= 1080 + 1e-6, `the rate stays at the real window × 0.9 (${w.ratePerMinute})`);

    const metrics = await (await fetch(t.url.replace(/\/graphql$/, '/metrics'))).text();
    assert.match(metrics, /sluice_window_configured_rate_per_minute\{window="primary"\} 2160/);
    const learned = /sluice_window_rate_per_minute\{window="primary"\} ([\d.]+)/.exec(metrics);
    assert.ok(learned && Number(learned[1]) <= 1080 + 1e-6, `the learned rate in /metrics (${learned?.[1]})`);
  });

  test('the real window raised past the configuration: the rate climbs back step by step, never above it', async () => {
    const from = (await primary()).ratePerMinute as number;
    // The first test's backlog is still draining: its answers carry the new window from now on.
    assert.ok((await sql`select count(*)::int as n from jobs where state = 'QUEUED'`)[0]!.n > 600, 'a backlog to climb on');
    sim.setConditions({ ratePerMinute: 6000 });
    const seen: number[] = [];
    const back = await eventually(async () => {
      const w = await primary();
      seen.push(w.ratePerMinute);
      return w.ratePerMinute >= 2160 - 1e-6 ? w : null;
    }, 60_000, 25);
    assert.equal(back.paceReason, 'CLIMB');
    assert.equal(back.observedLimitPerMinute, 6000);
    assert.ok(seen.every((r) => r <= 2160 + 1e-6), `never above the configured rate (max ${Math.max(...seen)})`);
    // Additive increase: one step (PACE_STEP 0.05 × 2,160 = 108/min) per 500 ms at most, so the climb shows in between.
    const between = new Set(seen.filter((r) => r > from + 1e-6 && r < 2160 - 1e-6));
    assert.ok(between.size >= 2, `the climb goes by steps (saw ${[...new Set(seen)].join(', ')})`);
    for (const r of between) {
      const steps = (r - from) / 108;
      assert.ok(Math.abs(steps - Math.round(steps)) < 1e-6, `each rate is a whole number of steps above ${from} (${r})`);
    }
    await new Promise((r) => setTimeout(r, 1000));
    assert.equal((await primary()).ratePerMinute, 2160, 'it stays at the configured rate');
  });
});

describe('a provider that never states its window', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;
  let tenant: { id: string; apiKey: string };
  const windowRow = async () => {
    const [w] = await sql`select rate_per_minute, burst, pace_reason, greatest(0, extract(epoch from (paused_until - now())))::float8 as paused_for, capped_ask_seconds from windows where name = 'primary'`;
    return { rate: w!.rate_per_minute as number, burst: w!.burst as number, reason: w!.pace_reason as string | null, pausedFor: w!.paused_for as number, asked: w!.capped_ask_seconds as number | null };
  };

  before(async () => {
    // 1,200/min with no x-rate-limit-* headers and a 429 that says only retry-after: 1; Sluice is told 2,400/min.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 1200, cooldownSeconds: 1, latencyMs: 20, latencyP95Ms: 20, seed: 11, concurrentCalls: 50, conditions: { rateLimitHeaders: false } });
    t = await startTestApp({ ...pacedEnv(sim), RETRY_AFTER_MAX_SECONDS: '2' });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    tenant = await t.createTenant('headless', 'ENTERPRISE');
    const jobs = Array.from({ length: 3000 }, (_, k) => ({ api: 'dnslookup', params: { domain: `h${k}.example` } }));
    for (let i = 0; i < jobs.length; i += 500) {
      const r = await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`, { i: { jobs: jobs.slice(i, i + 500) } }, tenant.apiKey);
      assert.ok(r.body.data, JSON.stringify(r.body.errors));
    }
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await sim.stop();
  });

  test('a 429 halves the pace, answers without headers climb it back, and once the window rises the rate reaches the configuration', async () => {
    // Each change of the window as polled, so a wait that runs out says where the pace stood.
    const trail: string[] = [];
    const traced = async () => {
      const w = await windowRow();
      const s = sim.stats().keys[sim.apiKey]!;
      const key = `${w.reason} ${w.rate.toFixed(0)}/min${w.pausedFor > 0 ? ' paused' : ''}`;
      const line = `${new Date().toISOString().slice(11, 23)} ${key}; provider calls ${s.calls}, 429s ${s.rateLimited}`;
      if (trail.length === 0 || !trail.at(-1)!.slice(13).startsWith(`${key};`)) trail.push(line);
      else trail[trail.length - 1] = `${trail.at(-1)!.split(' … ')[0]} … ${line}`;
      return w;
    };
    const halved = await eventually(async () => {
      const w = await traced();
      return w.reason === 'RATE_LIMITED' ? w : null;
    }, 30_000, 20).catch((e: Error) => assert.fail(`${e.message}; the window as polled:\n${trail.slice(-40).join('\n')}`));
    assert.ok(halved.rate < 2160, `lowered by the 429 (${halved.rate})`);
    assert.ok(sim.stats().keys[sim.apiKey]!.rateLimited > 0, 'the provider did answer 429');
    // No header ever confirms the lower rate: the answers that are not 429s climb it again.
    const climbed = await eventually(async () => {
      const w = await windowRow();
      return w.reason === 'CLIMB' && w.rate > halved.rate ? w : null;
    }, 30_000, 20);
    assert.ok(climbed.rate > halved.rate);
    sim.setConditions({ ratePerMinute: 60_000 });
    await eventually(async () => ((await windowRow()).rate >= 2160 - 1e-6 ? true : null), 60_000, 50);
  });

  test('a retry-after of 999999999 pauses for RETRY_AFTER_MAX_SECONDS at most, then one probe call at the floor decides, then a slow start', async () => {
    sim.setConditions({ ratePerMinute: 600, rateLimitRetryAfterSeconds: 999_999_999 });
    let longest = 0;
    const probe = await eventually(async () => {
      const w = await windowRow();
      longest = Math.max(longest, w.pausedFor);
      return w.reason === 'PROBE' ? w : null;
    }, 30_000, 10);
    assert.equal(probe.asked, 999_999_999, 'the ask is kept for the alert');
    assert.ok(probe.pausedFor <= 2 + 0.5, `paused for the cap, not for decades (${probe.pausedFor} s)`);
    assert.equal(probe.burst, 1, 'a bucket of one: a single call when the pause ends');
    assert.ok(Math.abs(probe.rate - 108) < 1e-6, `at the floor, PACE_MIN × 2,160 (${probe.rate})`);
    // The probe answers (the provider's bucket refilled during the pause): the window starts slowly.
    await eventually(async () => {
      const w = await windowRow();
      longest = Math.max(longest, w.pausedFor);
      return w.reason === 'START' ? true : null;
    }, 30_000, 10);
    assert.ok(longest <= 2 + 0.5, `no pause longer than the cap was ever set (${longest} s)`);
  });
});
