/**
 * Sluice's SQL reads and writes pg-boss's tables directly (the lease fence,
 * deferring a queue's jobs, turning pg-boss's job heartbeat off, locking a
 * job row in the lock order). That is a contract with one exact pg-boss
 * version: this test fails when the pinned version or pg-boss's schema moves,
 * so an upgrade is a deliberate change that re-checks those statements.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import postgres from 'postgres';
import { BossMaintenance, startBoss } from '../src/queue/boss.ts';
import { createTestDatabase } from './helpers/db.ts';

const PINNED = '12.38.0';
const SCHEMA_VERSION = 46;

test('pg-boss is pinned to one exact version, and that version is installed', () => {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'));
  assert.equal(pkg.dependencies['pg-boss'], PINNED, 'package.json pins pg-boss exactly (no range)');
  const installed = JSON.parse(readFileSync(new URL('../node_modules/pg-boss/package.json', import.meta.url), 'utf8'));
  assert.equal(installed.version, PINNED);
  assert.equal(installed.pgboss.schema, SCHEMA_VERSION);
});

test("pg-boss's tables have the columns and the schema version Sluice's SQL relies on", async () => {
  const db = await createTestDatabase();
  const boss = await startBoss(db.url, { supervise: false });
  const sql = postgres(db.url, { max: 1, onnotice: () => {} });
  try {
    const [v] = await sql`select version from pgboss.version`;
    assert.equal(Number(v!.version), SCHEMA_VERSION);
    const columns = async (table: string) =>
      new Map((await sql`select column_name, data_type from information_schema.columns where table_schema = 'pgboss' and table_name = ${table}`).map((r) => [r.column_name as string, r.data_type as string]));
    const job = await columns('job');
    // sluice_lease (drizzle/0013_lease.sql) fetches and activates jobs as pg-boss's fetch does, and completes some.
    for (const [name, type] of Object.entries({
      id: 'uuid', name: 'text', data: 'jsonb', start_after: 'timestamp with time zone', heartbeat_seconds: 'integer', heartbeat_on: 'timestamp with time zone',
      priority: 'integer', created_on: 'timestamp with time zone', started_on: 'timestamp with time zone', completed_on: 'timestamp with time zone',
      retry_count: 'integer', blocked: 'boolean', output: 'jsonb',
    })) {
      assert.equal(job.get(name), type, `pgboss.job.${name} is ${type}`);
    }
    assert.ok(job.has('state'), 'pgboss.job.state');
    const states = (await sql`select unnest(enum_range(null::pgboss.job_state))::text as s`).map((r) => r.s as string);
    for (const s of ['created', 'retry', 'active', 'completed', 'cancelled', 'failed']) assert.ok(states.includes(s), `job state ${s}`);
    const [now] = await sql`select count(*)::int as n from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'pgboss' and p.proname = 'job_now'`;
    assert.equal(now!.n, 1, 'pgboss.job_now() (the clock pg-boss fetch and complete use)');
    const queue = await columns('queue');
    assert.equal(queue.get('name'), 'text');
    assert.equal(queue.get('heartbeat_seconds'), 'integer');
  } finally {
    await sql.end();
    await boss.stop({ graceful: false, close: true });
    await db.drop();
  }
});

test("pg-boss's maintenance runs on one process at a time, and another takes over when it stops", async () => {
  const db = await createTestDatabase();
  const bosses = [await startBoss(db.url, { supervise: false }), await startBoss(db.url, { supervise: false })];
  const pools = bosses.map(() => postgres(db.url, { max: 2, onnotice: () => {} }));
  const errors: unknown[] = [];
  const m = bosses.map((b, i) => new BossMaintenance(b, pools[i]!, 60_000, (err) => errors.push(err)));
  try {
    await m[0]!.pass();
    await m[1]!.pass();
    assert.deepEqual(m.map((x) => x.isLeader), [true, false], 'the first to try runs it; the second does not');
    await m[1]!.pass();
    assert.equal(m[1]!.isLeader, false, 'still one');
    await m[0]!.stop();
    await m[1]!.pass();
    assert.equal(m[1]!.isLeader, true, 'the other process takes over once the first stops');
    assert.deepEqual(errors, []);
  } finally {
    await Promise.all(m.map((x) => x.stop()));
    await Promise.all(pools.map((p) => p.end()));
    await Promise.all(bosses.map((b) => b.stop({ graceful: false, close: true })));
    await db.drop();
  }
});

test("a maintenance pass supervises one page of queues, in name order, skips queues without rows, and wraps around", async () => {
  const db = await createTestDatabase();
  const boss = await startBoss(db.url, { supervise: false });
  const pool = postgres(db.url, { max: 2, onnotice: () => {} });
  const m = new BossMaintenance(boss, pool, 60_000, (err) => assert.fail(String(err)), 2);
  try {
    for (const name of ['t.c', 't.a', 't.b', 't.empty']) await boss.createQueue(name);
    // A queue is supervised only while it holds a pg-boss row: 't.empty' never does.
    for (const name of ['t.c', 't.a', 't.b']) await boss.send(name, {});
    // pg-boss stamps a queue's monitor claim when supervise covers it: the contract that
    // `supervise` takes a list of queue rows and touches only those.
    const claimed = async () =>
      (await pool`select name from pgboss.queue where monitor_claim_on is not null order by name`).map((r) => r.name as string);
    assert.deepEqual(await m.superviseNextPage(), ['t.a', 't.b']);
    assert.deepEqual(await claimed(), ['t.a', 't.b'], 'only the page was supervised');
    assert.deepEqual(await m.superviseNextPage(), ['t.c'], "the page (t.c, t.empty) minus the queue without rows");
    assert.deepEqual(await claimed(), ['t.a', 't.b', 't.c']);
    assert.deepEqual(await m.superviseNextPage(), [], 'the page after the last full one is empty: it ends the cycle');
    assert.deepEqual(await m.superviseNextPage(), ['t.a', 't.b'], 'and the next starts again from the first queue');
  } finally {
    await m.stop();
    await pool.end();
    await boss.stop({ graceful: false, close: true });
    await db.drop();
  }
});
