/**
 * jobs.tenant_id → tenants without a per-row foreign key (migration 0019): the statement-level
 * triggers must keep the key's guarantees (no job without its tenant, 23503 as before; a tenant's
 * deletion takes its jobs), whole statement or nothing.
 */
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import postgres from 'postgres';
import { startTestApp, type TestApp } from './helpers/app.ts';
import { insertJobsQueued } from '../src/jobs/store.ts';
import { newJobIds } from '../src/jobs/ids.ts';

let t: TestApp;
let sql: postgres.Sql;
before(async () => {
  t = await startTestApp({ SLUICE_ROLE: 'api' });
  sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
});
after(async () => {
  await sql.end();
  await t.stop();
});

const job = (id: string) => ({ id, api: 'dnslookup', params: { domain: 'example.org' }, priority: 'BULK' as const, idempotencyKey: null });
/** The submit path's insert (jobs and pg-boss rows in one statement) of one tenant's jobs. */
const insertJobs = (tx: postgres.Sql | postgres.TransactionSql, tenantId: string, jobs: ReturnType<typeof job>[]) =>
  insertJobsQueued(tx, jobs.map((j) => ({ ...j, tenantId, state: 'QUEUED' as const })));

test('a job naming no tenant is refused with 23503 and nothing of its statement is stored', async () => {
  const tenant = await t.createTenant('fk-a');
  const [good, bad] = newJobIds(2);
  await assert.rejects(
    sql.begin(async (tx) => {
      await insertJobs(tx, tenant.id, [job(good!)]).then(() => tx`
        insert into jobs (id, tenant_id, api, params, priority, state)
        values (${good!}::uuid, ${tenant.id}, 'x', '{}', 'BULK', 'QUEUED'), (${bad!}::uuid, ${randomUUID()}, 'x', '{}', 'BULK', 'QUEUED')
        on conflict do nothing`);
    }),
    (err: { code?: string }) => err.code === '23503',
  );
  const [{ n }] = (await sql`select count(*)::int as n from jobs where id = any(${[good!, bad!]}::uuid[])`) as unknown as [{ n: number }];
  assert.equal(n, 0);
  await assert.rejects(insertJobs(sql, randomUUID(), [job(newJobIds(1)[0]!)]), (err: { code?: string }) => err.code === '23503');
});

test("a job's tenant_id cannot change; deleting a tenant deletes its jobs", async () => {
  const a = await t.createTenant('fk-b');
  const b = await t.createTenant('fk-c');
  const ids = newJobIds(3);
  await insertJobs(sql, a.id, ids.map(job));
  await assert.rejects(sql`update jobs set tenant_id = ${b.id} where id = ${ids[0]!}`, (err: { code?: string }) => err.code === '23503');
  await sql`update jobs set tenant_id = tenant_id, updated_at = now() where id = ${ids[0]!}`; // the same tenant: allowed
  await sql`delete from tenants where id = ${a.id}`;
  const [{ n }] = (await sql`select count(*)::int as n from jobs where id = any(${ids}::uuid[])`) as unknown as [{ n: number }];
  assert.equal(n, 0);
});
