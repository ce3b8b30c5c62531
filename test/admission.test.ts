/**
 * The front door says "not now" on purpose: bounds per tenant and overall,
 * the lowest class shed first, a spent quota refused, each with its status,
 * Retry-After and code. API role only, so queues hold still while we fill them.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { collect, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT_MANY = `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`;
const jobs = (n: number, priority = 'STANDARD') => Array.from({ length: n }, (_, i) => ({ api: 'dnslookup', params: { domain: `a${i}.example` }, priority }));

describe('admission', () => {
  let t: TestApp;

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', GLOBAL_QUEUE_BOUND: '100', CLASS_SHARES: 'BULK=0.5,STANDARD=0.8,INTERACTIVE=1' });
  });
  after(() => t.stop());

  test("a tenant's bound: refused whole with 429, Retry-After and QUEUE_FULL; over WebSocket the code and extensions", async () => {
    const a = await t.createTenant('bounded', 'FREE');
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: a.id, queueBound: 5 } });
    const ok = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(4) } }, a.apiKey);
    assert.equal(ok.body.data.submitJobs.jobs.length, 4);
    const refused = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(2) } }, a.apiKey);
    assert.equal(refused.status, 429);
    const err = refused.body.errors[0];
    assert.equal(err.extensions.code, 'QUEUE_FULL');
    assert.equal(err.extensions.scope, 'TENANT');
    assert.equal(err.extensions.priority, 'STANDARD', 'STANDARD may fill 80 % of the bound: 4 of 5; the share caused it');
    assert.equal(err.extensions.retryable, true);
    assert.ok(Number.isInteger(err.extensions.retryAfterSeconds) && err.extensions.retryAfterSeconds >= 1);
    assert.equal(refused.headers.get('retry-after'), String(err.extensions.retryAfterSeconds));
    assert.equal(err.extensions.http, undefined, 'transport details stay out of the body');
    const me = await t.gql(`{ me { queues { priority depth } } }`, {}, a.apiKey);
    assert.equal(me.body.data.me.queues.find((q: any) => q.priority === 'STANDARD').depth, 4, 'nothing of the refused submission was stored');
    // INTERACTIVE may fill the whole bound: one more fits exactly.
    assert.equal((await t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'INTERACTIVE') } }, a.apiKey)).body.data.submitJobs.jobs.length, 1);
    const whole = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'INTERACTIVE') } }, a.apiKey);
    assert.equal(whole.status, 429);
    assert.equal(whole.body.errors[0].extensions.priority, undefined, 'the whole bound caused it, not a class share');

    const events = await collect<any>(t.ws(a.apiKey), `mutation { submitJob(input: { api: "dnslookup", params: { domain: "ws.example" } }) { job { id } } }`, {}, () => true).catch((e) => e);
    const wsErr = events.errors?.[0] ?? events[0]?.errors?.[0];
    assert.equal(wsErr?.extensions?.code, 'QUEUE_FULL');
    assert.ok(wsErr.extensions.retryAfterSeconds >= 1);
  });

  test('as the global bound fills, BULK is refused first, then STANDARD, INTERACTIVE last', async () => {
    const b = await t.createTenant('filler', 'ENTERPRISE');
    const c = await t.createTenant('other', 'ENTERPRISE');
    const waiting = async () => (await t.gql(`{ system { classes { depth } } }`)).body.data.system.classes.reduce((s: number, x: any) => s + x.depth, 0);
    const start = await waiting();
    // BULK may fill 50 of 100.
    await t.gql(SUBMIT_MANY, { i: { jobs: jobs(50 - start, 'BULK') } }, b.apiKey);
    const bulk = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'BULK') } }, c.apiKey);
    assert.equal(bulk.status, 429);
    assert.equal(bulk.body.errors[0].extensions.code, 'QUEUE_FULL');
    assert.equal(bulk.body.errors[0].extensions.scope, 'GLOBAL');
    assert.equal(bulk.body.errors[0].extensions.priority, 'BULK');
    // STANDARD still goes, up to 80.
    assert.equal((await t.gql(SUBMIT_MANY, { i: { jobs: jobs(30, 'STANDARD') } }, c.apiKey)).body.data.submitJobs.jobs.length, 30);
    const std = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'STANDARD') } }, c.apiKey);
    assert.equal(std.body.errors[0].extensions.priority, 'STANDARD');
    // INTERACTIVE still goes, up to 100.
    assert.equal((await t.gql(SUBMIT_MANY, { i: { jobs: jobs(20, 'INTERACTIVE') } }, c.apiKey)).body.data.submitJobs.jobs.length, 20);
    const inter = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'INTERACTIVE') } }, c.apiKey);
    assert.equal(inter.status, 429);
    assert.equal(inter.body.errors[0].extensions.priority, 'INTERACTIVE');
    assert.equal(await waiting(), 100);
    // A mixed submission is refused whole, naming the class that sheds.
    const mixed = await t.gql(SUBMIT_MANY, { i: { jobs: [...jobs(1, 'INTERACTIVE'), ...jobs(1, 'BULK')] } }, b.apiKey);
    assert.equal(mixed.body.errors[0].extensions.priority, 'BULK');
    // Cancelling makes room again.
    const listed = await t.gql(`{ jobs(first: 5, filter: { priority: BULK }) { edges { node { id } } } }`, {}, b.apiKey);
    for (const e of listed.body.data.jobs.edges) await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id } }`, { id: e.node.id }, b.apiKey);
    assert.equal((await t.gql(SUBMIT_MANY, { i: { jobs: jobs(5, 'INTERACTIVE') } }, c.apiKey)).body.data.submitJobs.jobs.length, 5);
    // Leave room for the tests after this one.
    for (const key of [b.apiKey, c.apiKey]) {
      const all = await t.gql(`{ jobs(first: 100, filter: { state: QUEUED }) { edges { node { id } } } }`, {}, key);
      for (const e of all.body.data.jobs.edges) await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id } }`, { id: e.node.id }, key);
    }
    assert.ok((await waiting()) <= 10);
  });

  test('under pressure a submission that cannot fit is refused at the edge while the gate is held; one that could fit waits for the gate', async () => {
    const f = await t.createTenant('edge', 'FREE');
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: f.id, queueBound: 2 } });
    const g = await t.createTenant('edge-room', 'FREE');
    assert.equal((await t.gql(SUBMIT_MANY, { i: { jobs: jobs(2, 'INTERACTIVE') } }, f.apiKey)).body.data.submitJobs.jobs.length, 2);
    // The first refusal is decided at the gate; it puts the tenant under pressure.
    assert.equal((await t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'INTERACTIVE') } }, f.apiKey)).status, 429);
    const sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    try {
      let release!: () => void;
      const released = new Promise<void>((r) => (release = r));
      let held!: () => void;
      const holding = new Promise<void>((r) => (held = r));
      // Another transaction holds the gate (every admission_totals row, as lockGate takes them).
      const holder = sql.begin(async (tx) => {
        await tx`select class from admission_totals order by class for update`;
        held();
        await released;
      });
      await holding;
      try {
        let timer: NodeJS.Timeout | undefined;
        const refused = await Promise.race([
          t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'INTERACTIVE') } }, f.apiKey),
          new Promise<null>((r) => (timer = setTimeout(() => r(null), 10_000))),
        ]);
        clearTimeout(timer);
        assert.ok(refused, 'the refusal waited for the gate: it was not answered while another transaction held it');
        assert.equal(refused.status, 429);
        assert.equal(refused.body.errors[0].extensions.code, 'QUEUE_FULL');
        assert.equal(refused.body.errors[0].extensions.scope, 'TENANT');
        assert.ok(Number(refused.headers.get('retry-after')) >= 1);
        // Another tenant's submission could fit: it goes to the gate and waits there for the holder.
        const fits = t.gql(SUBMIT_MANY, { i: { jobs: jobs(1, 'INTERACTIVE') } }, g.apiKey);
        for (;;) {
          const [w] = await sql`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and query ilike '%admission_totals%for update%'`;
          if (w!.n > 0) break;
          await new Promise((r) => setTimeout(r, 20));
        }
        release();
        await holder;
        assert.equal((await fits).body.data.submitJobs.jobs.length, 1);
      } finally {
        release();
        await holder.catch(() => {});
      }
    } finally {
      await sql.end();
    }
    // Leave room for the tests after this one.
    for (const key of [f.apiKey, g.apiKey]) {
      const all = await t.gql(`{ jobs(first: 100, filter: { state: QUEUED }) { edges { node { id } } } }`, {}, key);
      for (const e of all.body.data.jobs.edges) await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id } }`, { id: e.node.id }, key);
    }
  });

  test('a tenant whose quota is spent and whose policy is FAIL is refused at the door', async () => {
    const d = await t.createTenant('broke', 'FREE');
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: d.id, monthlyQuota: 0, quotaPolicy: 'FAIL' } });
    const r = await t.gql(`mutation { submitJob(input: { api: "dnslookup", params: { domain: "x.example" } }) { job { id } } }`, {}, d.apiKey);
    assert.equal(r.body.errors[0].extensions.code, 'QUOTA_EXCEEDED');
    assert.equal(r.body.errors[0].extensions.creditsRemaining, 0);
    // With policy WAIT the same tenant is accepted (its jobs will wait).
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: d.id, quotaPolicy: 'WAIT' } });
    const w = await t.gql(`mutation { submitJob(input: { api: "dnslookup", params: { domain: "x.example" } }) { job { id state } } }`, {}, d.apiKey);
    assert.ok(w.body.data.submitJob.job.id);
  });

  test('visibility: depth, oldest age, why the head waits, estimates, and a live tenantUsage push', async () => {
    const e = await t.createTenant('watcher', 'PRO');
    const ws = t.ws(e.apiKey);
    const pushes = collect<any>(ws, `subscription { tenantUsage { usage { creditsUsed quota } queues { priority depth waitReason } } }`, {}, (ev) =>
      ev.some((x) => x.tenantUsage.queues.find((q: any) => q.priority === 'STANDARD').depth === 3),
    );
    await new Promise((r) => setTimeout(r, 300));
    const sub = await t.gql(SUBMIT_MANY, { i: { jobs: jobs(3) } }, e.apiKey);
    const got = await pushes;
    assert.equal(got[0].tenantUsage.queues.find((q: any) => q.priority === 'STANDARD').depth, 0, 'the first push is the state at subscribe time');
    await new Promise((r) => setTimeout(r, 50));
    const me = await t.gql(`{ me { estimatedDrainSeconds queues { priority depth running oldestAgeSeconds waitReason estimatedDrainSeconds } } }`, {}, e.apiKey);
    const std = me.body.data.me.queues.find((q: any) => q.priority === 'STANDARD');
    assert.equal(std.depth, 3);
    assert.equal(std.running, 0);
    assert.ok(std.oldestAgeSeconds > 0);
    assert.equal(std.waitReason, 'RATE', 'nothing blocks it: it waits its turn in the pace');
    assert.ok(std.estimatedDrainSeconds > 0);
    const idle = me.body.data.me.queues.find((q: any) => q.priority === 'INTERACTIVE');
    assert.equal(idle.waitReason, null);
    // Jobs of one submission share created_at; the queue order among them is by id.
    const ids = sub.body.data.submitJobs.jobs.map((x: any) => x.id).sort();
    const first = ids[0];
    const last = ids[2];
    const j = await t.gql(`query($a: ID!, $b: ID!) { a: job(id: $a) { estimatedStartAt } b: job(id: $b) { estimatedStartAt } }`, { a: first, b: last }, e.apiKey);
    // Both estimates are "now + wait", read a moment apart: allow for the clock moving between them.
    const [ta, tb] = [Date.parse(j.body.data.a.estimatedStartAt), Date.parse(j.body.data.b.estimatedStartAt)];
    assert.ok(Number.isFinite(ta) && Number.isFinite(tb), `both have estimates: ${JSON.stringify(j.body)}`);
    assert.ok(ta < tb, `a later job starts later: ${JSON.stringify(j.body)}`);

    const sys = await t.gql(`{ system { classes { priority depth running oldestAgeSeconds } estimatedDrainSeconds alerts { key } account { dispatchStoppedUntil } breakers { api state } windows { name busy } } }`);
    assert.ok(sys.body.data.system.classes.find((c: any) => c.priority === 'STANDARD').depth >= 3);
    assert.ok(sys.body.data.system.estimatedDrainSeconds > 0);
  });
});
