/**
 * Provider output is untrusted input, end to end: a real Sluice, a real
 * Postgres and the simulator over real HTTP answering 200s that are
 * unstorable (U+0000, lone surrogates) or malformed (HTML, truncated JSON,
 * over MAX_RESULT_BYTES). Each job ends in its documented state with its
 * documented bill (judged against the simulator's own count), nothing stays
 * reserved or held, and another tenant's jobs keep running. Then settlement
 * units the database itself refuses (class 22 and 23, forced by a trigger and
 * a constraint in the test database) are isolated: the rest of their group
 * lands.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import postgres from 'postgres';
import { RESULT_NOT_STORED } from '../src/dispatch/settler.ts';
import { startSimulator, type BadAnswerKind, type Simulator } from '../src/simulator/index.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { assertJobsAccountedFor, assertLedgerBalances, assertQuiescent } from './helpers/invariants.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`;
const FX = { currency1: 'USD', currency2: 'EUR' };

interface JobRow {
  id: string;
  tenant_id: string;
  api: string;
  state: string;
  error_code: string | null;
  credits_billed: number | null;
  attempts: number | null;
  data: unknown;
  domain: string | null;
}

async function submit(t: TestApp, apiKey: string, jobs: { api: string; params: Record<string, unknown> }[]): Promise<string[]> {
  const r = await t.gql(SUBMIT_MANY, { i: { jobs } }, apiKey);
  if (!r.body.data) throw new Error(`submitJobs failed: ${JSON.stringify(r.body.errors)}`);
  return r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id);
}

/** The jobs, once every one of them has ended. */
async function finished(sql: postgres.Sql, ids: string[], timeoutMs = 20_000): Promise<JobRow[]> {
  return eventually(async () => {
    const rows = await sql<JobRow[]>`
      select j.id, j.tenant_id, j.api, j.state, j.error_code, coalesce(j.credits_billed, 0) as credits_billed, j.attempts, j.result as data, j.params->>'domain' as domain
      from jobs j where j.id = any(${ids}::uuid[]) order by j.created_at, j.id`;
    return rows.length === ids.length && rows.every((r) => r.state === 'SUCCEEDED' || r.state === 'FAILED') ? rows : null;
  }, timeoutMs);
}

/** Nothing reserved, no slot held, once the dispatcher has settled everything it leased. */
async function quiescent(sql: postgres.Sql): Promise<void> {
  await eventually(async () => {
    const [r] = await sql`select (select count(*) from reservations where settled_at is null)::int as n`;
    return r!.n === 0;
  }, 10_000, 50);
  await assertQuiescent(sql);
  await assertLedgerBalances(sql);
  await assertJobsAccountedFor(sql);
}

describe('bad answers from the upstream, single calls and batches', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;
  let victim: { id: string; apiKey: string };
  let bystander: { id: string; apiKey: string };

  before(async () => {
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 5, latencyP95Ms: 5, seed: 7 });
    t = await startTestApp({
      APIVERVE_API_KEY: sim.apiKey,
      APIVERVE_BASE_URL: sim.url,
      APIVERVE_RATE_PER_MINUTE: '6000',
      INITIAL_LATENCY_MS: '5',
      MAX_RESULT_BYTES: String(64 * 1024),
      // The bystander's calls one by one, so every batch item the simulator counts is the victim's.
      BATCH_DISABLED_APIS: 'exchangerate',
      // Batches are judged from the first call: the window opens at its configured rate.
      PACE_START: '1',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    victim = await t.createTenant('victim', 'PRO');
    bystander = await t.createTenant('bystander', 'PRO');
  });
  after(async () => {
    await sql?.end();
    await t?.stop();
    await sim?.stop();
  });

  /**
   * The victim's dnslookup jobs get `kind`, then the bystander's jobs are
   * submitted; returns the victim's and the bystander's jobs once ended, and
   * what the simulator billed meanwhile.
   */
  async function round(kind: BadAnswerKind, victimJobs: number, tag: string) {
    await quiescent(sql);
    sim.setConditions({ apis: { dnslookup: { badAnswer: { probability: 1, kind, hugeBytes: 200_000 } } } });
    sim.resetStats();
    const bad = await submit(t, victim.apiKey, Array.from({ length: victimJobs }, (_, i) => ({ api: 'dnslookup', params: { domain: `${tag}${i}.example.com` } })));
    // The bystander's jobs once the victim's are leased: a bystander ready at the victim's lease
    // would share the turn (the fair rotation gives the victim its quantum, then the bystander,
    // and the victim's last job goes in the next call), and how the victim's jobs were called
    // (one batch, below) would depend on which commit the lease saw first.
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where id = any(${bad}::uuid[]) and state = 'QUEUED'`;
      return r!.n === 0;
    }, 10_000, 20);
    const good = await submit(t, bystander.apiKey, Array.from({ length: 4 }, () => ({ api: 'exchangerate', params: FX })));
    const [badRows, goodRows] = [await finished(sql, bad), await finished(sql, good)];
    await quiescent(sql);
    const s = sim.stats();
    const batchItems = Object.values(s.keys[sim.apiKey]!.batchItems).reduce((n, k) => n + k, 0);
    return { badRows, goodRows, stats: s.totals, batchItems };
  }

  for (const batched of [false, true]) {
    for (const kind of ['nul', 'lone-surrogate', 'html', 'truncated-json', 'huge'] as const) {
      const storable = kind === 'nul' || kind === 'lone-surrogate';
      test(`${batched ? 'batch' : 'single'} ${kind}: ${storable ? 'SUCCEEDED with U+FFFD' : 'FAILED UPSTREAM_BAD_RESPONSE'}, billed as the provider billed, nothing held, the bystander served`, async () => {
        // One job at a time is a single call; several of one tenant's at once ride one batch call.
        const { badRows, goodRows, stats, batchItems } = await round(kind, batched ? 3 : 1, `${batched ? 'b' : 's'}-${kind}-`);
        for (const r of badRows) {
          assert.equal(r.attempts, 1, `${r.domain}: one attempt, never retried`);
          assert.equal(r.credits_billed, 1, `${r.domain}: billed like the 200 it was`);
          if (storable) {
            assert.equal(r.state, 'SUCCEEDED', r.domain ?? '');
            assert.equal(r.error_code, null);
            assert.ok(JSON.stringify(r.data).includes('\ufffd'), `${r.domain}: the bad character stored as U+FFFD`);
          } else {
            assert.deepEqual([r.state, r.error_code], ['FAILED', 'UPSTREAM_BAD_RESPONSE'], r.domain ?? '');
            assert.equal(r.data, null);
          }
        }
        assert.ok(goodRows.every((r) => r.state === 'SUCCEEDED' && r.credits_billed === 1), 'the bystander is served');
        // Ground truth: one upstream call per job, and Sluice billed exactly what the provider billed.
        const billedHere = [...badRows, ...goodRows].reduce((s, r) => s + (r.credits_billed ?? 0), 0);
        assert.equal(stats.creditsBilled, billedHere);
        assert.equal(stats.calls, badRows.length + goodRows.length);
        assert.ok(stats.badAnswers >= 1);
        // A batch call carried the victim's jobs (at least two of them: a lease may leave the last
        // one for its next call, when the window's tokens at that instant or the fair turn end
        // its take there), or none did.
        if (batched) assert.ok(batchItems >= 2 && batchItems <= badRows.length, `the victim's jobs rode a batch call (${batchItems} batch items)`);
        else assert.equal(batchItems, 0, 'the victim\'s job went as a single call');
      });
    }
  }

  test('the GraphQL answer of a job whose data held U+0000: the data, with U+FFFD', async () => {
    await quiescent(sql);
    sim.setConditions({ apis: { dnslookup: { badAnswer: { probability: 1, kind: 'nul' } } } });
    const [id] = await submit(t, victim.apiKey, [{ api: 'dnslookup', params: { domain: 'a.example.com' } }]);
    await finished(sql, [id!]);
    const r = await t.gql(`query($id: ID!) { job(id: $id) { state result error { code } creditsBilled } }`, { id }, victim.apiKey);
    assert.equal(r.body.data.job.state, 'SUCCEEDED');
    assert.ok(JSON.stringify(r.body.data.job.result).includes('\ufffd'));
    assert.equal(r.body.data.job.creditsBilled, 1);
    sim.setConditions({ apis: { dnslookup: null } });
  });
});

describe('settlement units the database refuses', () => {
  let sim: Simulator;
  let t: TestApp;
  let sql: postgres.Sql;
  const logs: Array<Record<string, unknown>> = [];

  before(async () => {
    // A long, constant latency: every call is sent within a few ms and answers within a few ms of the others.
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 300, latencyP95Ms: 300, seed: 8 });
    const sink = new Writable({
      write(chunk, _enc, cb) {
        for (const line of String(chunk).split('\n')) if (line.trim()) logs.push(JSON.parse(line) as Record<string, unknown>);
        cb();
      },
    });
    t = await startTestApp(
      {
        APIVERVE_API_KEY: sim.apiKey,
        APIVERVE_BASE_URL: sim.url,
        APIVERVE_RATE_PER_MINUTE: '6000',
        INITIAL_LATENCY_MS: '300',
        // Outcomes gather for a while before a flusher takes them: the refused unit shares a group.
        SETTLE_INTERVAL_MS: '150',
        // dnslookup one call per job (one settlement unit each); emailvalidator in batches (one unit of many attempts).
        BATCH_DISABLED_APIS: 'dnslookup',
      },
      {},
      { log: pino({ level: 'warn' }, sink) },
    );
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    // The faults, in the database itself: a check constraint (class 23) and a trigger raising a data
    // exception (class 22) on particular results, and one raising a plain error (P0001, neither).
    await sql.unsafe(`
      alter table jobs add constraint test_poison_23 check (result is null or result->>'domain' is distinct from 'poison23.example.com');
      create function test_poison() returns trigger language plpgsql as $$
      begin
        if new.result->>'domain' = 'poison22.example.com' or new.result->>'email' = 'poison22@example.com' then
          raise exception 'test: refused' using errcode = 'untranslatable_character';
        end if;
        if new.result->>'domain' = 'stuck.example.com' then
          raise exception 'test: not a data exception';
        end if;
        return new;
      end $$;
      create trigger test_poison before insert or update on jobs for each row execute function test_poison();`);
  });
  after(async () => {
    await sql?.end();
    await t?.stop();
    await sim?.stop();
  });

  test('a refused unit inside a group is isolated: the rest lands, it fails RESULT_NOT_STORED billed, nothing held, others served', async () => {
    // Caps of 32: all of a tenant's calls go out at once, so their settlements meet in one group.
    const a = await t.createTenant('a', 'ENTERPRISE');
    const b = await t.createTenant('b', 'ENTERPRISE');
    const e = await t.createTenant('e', 'ENTERPRISE');
    const dns = ['ok1', 'poison23', 'ok2', 'poison22', 'ok3', 'ok4'].map((d) => ({ api: 'dnslookup', params: { domain: `${d}.example.com` } }));
    const emails = ['x1', 'poison22', 'x2', 'x3'].map((e) => ({ api: 'emailvalidator', params: { email: `${e}@example.com` } }));
    // The emails alone in their tenant's queue: its head API batches, so they go as one batch call.
    const aIds = [...(await submit(t, a.apiKey, dns)), ...(await submit(t, e.apiKey, emails))];
    // Distinct inputs: identical ones may share a batch call and be sent once (folded within the tenant).
    const bIds = await submit(t, b.apiKey, ['EUR', 'GBP', 'JPY', 'CHF', 'CAD', 'AUD'].map((c) => ({ api: 'exchangerate', params: { currency1: 'USD', currency2: c } })));
    const rows = await finished(sql, [...aIds, ...bIds]);
    const params = await sql`select id, params from jobs where id = any(${aIds}::uuid[])`;
    const poisonIds = new Set(params.filter((p) => JSON.stringify(p.params).includes('poison')).map((p) => p.id as string));
    assert.equal(poisonIds.size, 3);
    for (const r of rows) {
      if (poisonIds.has(r.id)) {
        assert.deepEqual([r.state, r.error_code, r.data], ['FAILED', RESULT_NOT_STORED, null], r.id);
        assert.equal(r.credits_billed, r.api === 'emailvalidator' ? 5 : 1, 'billed as the provider billed');
      } else {
        assert.equal(r.state, 'SUCCEEDED', `${r.api} ${r.domain}: the rest of the group landed`);
      }
    }
    await quiescent(sql);
    const billedHere = rows.reduce((s, r) => s + (r.credits_billed ?? 0), 0);
    assert.equal(sim.stats().totals.creditsBilled, billedHere, 'Sluice billed what the provider billed');
    assert.equal(sim.stats().totals.calls, rows.length, 'one upstream call per job: a refused settlement never calls again');
    // It was a group: a refused settlement of several units was split, and a batch call's unit into its attempts.
    const steps = logs.filter((l) => l.msg === 'settlement failed');
    assert.ok(steps.some((l) => l.step === 'split' && (l.attempts as number) > 1), `a group was split: ${JSON.stringify(steps.map((l) => [l.step, l.attempts]))}`);
    assert.ok(steps.some((l) => l.step === 'split_attempts'), `the batch call's unit was split into its attempts: ${JSON.stringify(steps.map((l) => [l.step, l.attempts]))}`);
    assert.ok(steps.every((l) => l.error === 'data'));
    const failed = logs.filter((l) => typeof l.msg === 'string' && (l.msg as string).startsWith('settlement refused by the database'));
    assert.deepEqual(new Set(failed.map((l) => l.jobId)), poisonIds, 'each refused job is logged by id');
    // Still serving afterwards.
    const later = await submit(t, b.apiKey, [{ api: 'dnslookup', params: { domain: 'after.example.com' } }]);
    assert.equal((await finished(sql, later))[0]!.state, 'SUCCEEDED');
  });

  test('an error that is neither an outage nor a data exception is retried a few times, then settled as a failure', async () => {
    logs.length = 0;
    const c = await t.createTenant('c', 'PRO');
    const [id] = await submit(t, c.apiKey, [{ api: 'dnslookup', params: { domain: 'stuck.example.com' } }]);
    const [row] = await finished(sql, [id!], 30_000);
    assert.deepEqual([row!.state, row!.error_code, row!.credits_billed, row!.attempts], ['FAILED', RESULT_NOT_STORED, 1, 1]);
    await quiescent(sql);
    const tries = logs.filter((l) => l.msg === 'settlement failed');
    assert.ok(tries.every((l) => l.error === 'other'));
    assert.deepEqual(tries.map((l) => l.step).slice(-2), ['retry', 'fail_final']);
    assert.ok(tries.length >= 5 && tries.length <= 6, `bounded: ${tries.length} failures`);
  });
});
