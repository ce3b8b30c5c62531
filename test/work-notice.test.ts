/**
 * The dispatchers' wake-up after a submission's commit (src/jobs/work-notice.ts): this process's
 * dispatcher is poked at once, other processes get a NOTIFY sent after the commit, one at a time,
 * and a submission's own transaction sends none (it does not queue on the notification lock).
 * Real Sluice and real Postgres.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import pino from 'pino';
import { WORK_CHANNEL } from '../src/jobs/service.ts';
import { WorkNotice } from '../src/jobs/work-notice.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

describe('the work notice follows the commit', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  const payloads: string[] = [];

  before(async () => {
    t = await startTestApp();
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    await sql.listen(WORK_CHANNEL, (p) => void payloads.push(p));
  });
  after(async () => {
    await sql?.end({ timeout: 2 });
    await t?.stop();
  });

  test('a submission wakes another process by a notice sent after its commit, not in it', async () => {
    const tenant = await t.createTenant('work-notice', 'PRO');
    const since = payloads.length;
    const r = await t.gql('mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }', { i: { api: 'dnslookup', params: { domain: 'wake.example' } } }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    await eventually(async () => payloads.length > since);
    // The submission's transaction named its tenants in its own NOTIFY; the notice after the commit names none.
    assert.ok(payloads.slice(since).every((p) => p === ''), `notices after the submission: ${JSON.stringify(payloads.slice(since))}`);
    await eventually(async () => (await t.gql('query($id: ID!) { job(id: $id) { state } }', { id: r.body.data.submitJob.job.id }, tenant.apiKey)).body.data?.job.state === 'SUCCEEDED');
  });

  test('wakes coalesce: one notice at a time, and one more after it for the wakes it did not cover', async () => {
    const log = pino({ level: 'silent' });
    const notice = new WorkNotice(sql, log);
    let pokes = 0;
    notice.setLocal(() => void pokes++);
    const before = payloads.length;
    for (let i = 0; i < 50; i++) notice.wake();
    assert.equal(pokes, 50, 'the local dispatcher is poked on every wake, at once');
    await eventually(async () => notice.sent === 2);
    await eventually(async () => payloads.length >= before + 2);
    assert.equal(notice.sent, 2, 'the first wake sent one; the 49 during it, one more after it');
    notice.wake();
    await eventually(async () => notice.sent === 3);
  });
});
