/**
 * Retention and usage history (I10): the summed creditsBilled of
 * usage history equals me.usage.creditsUsed and the ledger, before and after
 * retention deletes the jobs, their results and settled reservations; cleared
 * alerts are pruned; pg-boss keeps finished jobs as long as we do.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { randomUUID } from 'node:crypto';
import { Retention } from '../src/retention/retention.ts';
import { percentileMs } from '../src/usage/histogram.ts';
import { parseUsageQuery, toCsv } from '../src/http/usage-csv.ts';
import { eventually, startTestApp, ADMIN_TOKEN, type TestApp } from './helpers/app.ts';

const RETENTION = 86_400;

describe('usage history: pure parts', () => {
  test('p95 is the upper bound of the bucket holding it; none without samples', () => {
    assert.equal(percentileMs([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.95), null);
    assert.equal(percentileMs([100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0.95), 25);
    assert.equal(percentileMs([94, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0], 0.95), 500);
    assert.equal(percentileMs([95, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0], 0.95), 25);
    assert.equal(percentileMs([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3], 0.5), 30_000);
  });
  test('CSV rows and query parsing', () => {
    const csv = toCsv([{ start: new Date('2026-01-01T00:00:00Z'), api: 'dnslookup', priority: null, calls: 2, succeeded: 1, failed: 1, creditsBilled: 1, creditsRefunded: 1, latencyP95Ms: 250 }]);
    assert.equal(csv, 'start,api,priority,calls,succeeded,failed,creditsBilled,creditsRefunded,latencyP95Ms\r\n2026-01-01T00:00:00.000Z,dnslookup,,2,1,1,1,1,250\r\n');
    const q = parseUsageQuery(new URLSearchParams('from=2026-01-01T00:00:00Z&to=2026-02-01T00:00:00Z&granularity=hour&groupBy=API,PRIORITY'));
    assert.equal(q.granularity, 'HOUR');
    assert.deepEqual(q.groupBy, ['API', 'PRIORITY']);
    assert.throws(() => parseUsageQuery(new URLSearchParams('from=2026-02-01&to=2026-01-01')), /before/);
    assert.throws(() => parseUsageQuery(new URLSearchParams('from=2026-01-01&to=2026-02-01&groupBy=TENANT')), /groupBy/);
  });
});

describe('retention keeps history equal to the ledger', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  let tenant: { id: string; apiKey: string };
  before(async () => {
    t = await startTestApp({ JOB_RETENTION_SECONDS: String(RETENTION) });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    tenant = await t.createTenant('billed-co');
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  const history = async (granularity: string, groupBy: string[]) => {
    const { periodStart, periodEnd } = (await t.gql('{ me { usage { periodStart periodEnd } } }', {}, tenant.apiKey)).body.data.me.usage;
    const r = await t.gql(
      `query($from: DateTime!, $to: DateTime!, $g: UsageGranularity, $by: [UsageGroupBy!]) { me { usageHistory(from: $from, to: $to, granularity: $g, groupBy: $by) { start api priority calls succeeded failed creditsBilled creditsRefunded latencyP95Ms } } }`,
      { from: periodStart, to: periodEnd, g: granularity, by: groupBy },
      tenant.apiKey,
    );
    assert.equal(r.status, 200, JSON.stringify(r.body));
    return r.body.data.me.usageHistory as Array<{ api: string | null; priority: string | null; calls: number; succeeded: number; creditsBilled: number; latencyP95Ms: number | null }>;
  };
  const sum = (rows: Array<{ creditsBilled: number }>) => rows.reduce((s, r) => s + r.creditsBilled, 0);
  /** me.usage, the ledger row and history by month, by hour per API and class, and the CSV, all at once. */
  const figures = async () => {
    const usage = (await t.gql('{ me { usage { creditsUsed periodStart periodEnd } } }', {}, tenant.apiKey)).body.data.me.usage;
    const [ledger] = await sql`select billed::int from tenant_ledger where tenant_id = ${tenant.id}`;
    const byMonth = await history('MONTH', []);
    const byHour = await history('HOUR', ['API', 'PRIORITY']);
    const csv = await fetch(`${t.url.replace('/graphql', '')}/usage.csv?from=${usage.periodStart}&to=${usage.periodEnd}&granularity=DAY&groupBy=API`, {
      headers: { authorization: `Bearer ${tenant.apiKey}` },
    });
    assert.equal(csv.status, 200);
    assert.match(csv.headers.get('content-type')!, /^text\/csv/);
    const lines = (await csv.text()).trim().split('\r\n');
    const billedColumn = lines[0]!.split(',').indexOf('creditsBilled');
    const csvBilled = lines.slice(1).reduce((s, l) => s + Number(l.split(',')[billedColumn]), 0);
    return { used: usage.creditsUsed, ledger: ledger!.billed as number, month: sum(byMonth), hour: sum(byHour), csv: csvBilled, byHour, byMonth };
  };

  test('history equals me.usage and the ledger, before and after retention deletes the jobs', async () => {
    const apis = ['dnslookup', 'exchangerate', 'emailvalidator'];
    const params: Record<string, Record<string, string>> = { dnslookup: { domain: 'example.com' }, exchangerate: { currency1: 'USD', currency2: 'EUR' }, emailvalidator: { email: 'jane@mailinator.com' } };
    const jobs = Array.from({ length: 24 }, (_, i) => ({ api: apis[i % 3], params: { ...params[apis[i % 3]!], n: String(i) }, priority: ['INTERACTIVE', 'STANDARD', 'BULK'][i % 3] }));
    const sub = await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`, { i: { jobs } }, tenant.apiKey);
    assert.equal(sub.status, 200, JSON.stringify(sub.body));
    await eventually(async () => {
      const [r] = await sql`select count(*)::int as n from jobs where tenant_id = ${tenant.id} and state in ('SUCCEEDED', 'FAILED')`;
      return r!.n === 24;
    }, 60_000);

    const before = await figures();
    assert.ok(before.used > 0);
    assert.deepEqual([before.ledger, before.month, before.hour, before.csv], [before.used, before.used, before.used, before.used]);
    assert.ok(before.byHour.every((r) => r.api !== null && r.priority !== null && r.latencyP95Ms !== null));
    assert.equal(before.byMonth.reduce((s, r) => s + r.calls, 0) >= 24, true);
    assert.equal(new Set(before.byHour.map((r) => r.api)).size, 3);

    // Age everything past the retention, add an old cleared alert and a recent one.
    await sql`update jobs set finished_at = now() - interval '2 days' where tenant_id = ${tenant.id}`;
    await sql`update reservations set created_at = now() - interval '2 days', settled_at = now() - interval '2 days' + interval '1 second' where tenant_id = ${tenant.id}`;
    // The sent marks (one lease_sends row per lease) as old; one more of a lease still open, whose
    // row says whether its call was sent: it stays.
    await sql`update lease_sends set at = now() - interval '2 days'`;
    const openLease = randomUUID();
    await sql`insert into reservations (id, job_id, attempt, tenant_id, period_start, "window", node_id, credits, lease_id)
      values (gen_random_uuid(), gen_random_uuid(), 1, gen_random_uuid(), now(), 'w', gen_random_uuid(), 1, ${openLease})`;
    await sql`insert into lease_sends (lease_id, sent_at, at) values (${openLease}, now() - interval '2 days', now() - interval '2 days')`;
    const [marks] = await sql`select count(*)::int as n from lease_sends`;
    assert.ok(marks!.n > 1, 'the drain marked its leases sent');
    await sql`insert into alerts (id, key, severity, message, raised_at, cleared_at) values
      (gen_random_uuid(), 'AGE_PROMISE:BULK', 'warning', 'old', now() - interval '3 days', now() - interval '2 days'),
      (gen_random_uuid(), 'AGE_PROMISE:BULK', 'warning', 'recent', now() - interval '2 hours', now() - interval '1 hour')`;
    const retention = new Retention({ sql: sql as never, retentionSeconds: RETENTION, batchSize: 5, maxBatches: 100, intervalSeconds: 0 });
    const pass = await retention.runOnce();
    assert.ok(pass);
    assert.equal(pass.jobs, 24);
    assert.ok(pass.reservations >= 24);
    assert.equal(pass.alerts, 1);
    assert.ok(pass.foldedDeltas > 0);

    const [left] = await sql`
      select (select count(*) from jobs where tenant_id = ${tenant.id})::int as jobs,
        (select count(*) from jobs where result is not null or error_code is not null)::int as results,
        (select count(*) from reservations where tenant_id = ${tenant.id})::int as reservations,
        (select count(*) from usage_deltas)::int as deltas,
        (select count(*) from alerts where message = 'recent')::int as recent_alerts,
        (select array_agg(lease_id) from lease_sends) as sends`;
    assert.deepEqual({ ...left }, { jobs: 0, results: 0, reservations: 0, deltas: 0, recent_alerts: 1, sends: [openLease] });
    await sql`delete from reservations where lease_id = ${openLease}`;

    const afterwards = await figures();
    assert.deepEqual(
      { used: afterwards.used, ledger: afterwards.ledger, month: afterwards.month, hour: afterwards.hour, csv: afterwards.csv },
      { used: before.used, ledger: before.used, month: before.used, hour: before.used, csv: before.used },
    );
    assert.deepEqual(afterwards.byHour, before.byHour);
  });

  test("pg-boss deletes the tenant queues' finished jobs after the same retention", async () => {
    const rows = await sql`select deletion_seconds from pgboss.queue where name like ${`t.${tenant.id}.%`}`;
    assert.equal(rows.length, 3);
    assert.ok(rows.every((r) => r.deletion_seconds === RETENTION));
  });

  test('the CSV needs the same credentials: none is 401, the admin names the tenant', async () => {
    const base = `${t.url.replace('/graphql', '')}/usage.csv?from=2020-01-01T00:00:00Z&to=2100-01-01T00:00:00Z&granularity=MONTH`;
    assert.equal((await fetch(base)).status, 401);
    const admin = await fetch(base, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    assert.equal(admin.status, 400);
    assert.equal((await admin.json()).errors[0].extensions.code, 'BAD_USER_INPUT');
    const named = await fetch(`${base}&tenantId=${tenant.id}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
    assert.equal(named.status, 200);
    assert.match(await named.text(), /^start,api,priority,calls/);
  });
});
