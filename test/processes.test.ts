/**
 * Several processes against one Postgres: an API-only process and a
 * worker-only process. Events cross processes through NOTIFY; retryable
 * upstream failures retry and then fail with their attempts recorded.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { collect, eventually, startTestApp, type TestApp } from './helpers/app.ts';

const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;

describe('an API process and a worker process on one database', () => {
  let api: TestApp;
  let worker: TestApp;
  let tenant: { id: string; apiKey: string };

  before(async () => {
    api = await startTestApp({ SLUICE_ROLE: 'api' });
    worker = await startTestApp(
      { SLUICE_ROLE: 'worker', DATABASE_URL: api.databaseUrl, JOB_RETRY_LIMIT: '2', JOB_RETRY_DELAY_SECONDS: '1' },
      // The worker's provider fails every dnslookup with a 503; other APIs work.
      { simulator: { conditions: { apis: { dnslookup: { outage: 503 } } } } },
    );
    tenant = await api.createTenant('cross-process', 'PRO');
  });
  after(async () => {
    await worker.stop();
    await api.stop();
  });

  test('a subscriber on the API process sees a job finished by the worker process', async () => {
    assert.equal(worker.app.url, null, 'the worker serves no HTTP');
    const ws = api.ws(tenant.apiKey);
    const r = await api.gql(SUBMIT, { i: { api: 'exchangerate', params: { currency1: 'USD', currency2: 'JPY' } } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id;
    const events = await collect<{ jobUpdated: { state: string; result: any } }>(
      ws,
      `subscription($id: ID!) { jobUpdated(id: $id) { state result } }`,
      { id },
      (ev) => ev.at(-1)!.jobUpdated.state === 'SUCCEEDED',
    );
    assert.equal(typeof events.at(-1)!.jobUpdated.result.exchangeRate, 'number');
  });

  test('a retryable failure retries with backoff, then fails with its attempts and last error', async () => {
    const r = await api.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'down.example' } } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id;
    const job = await eventually(async () => {
      const q = await api.gql(`query($id: ID!) { job(id: $id) { state attempts httpStatus creditsBilled error { code message } } }`, { id }, tenant.apiKey);
      return q.body.data.job.state === 'FAILED' ? q.body.data.job : null;
    }, 30_000);
    assert.equal(job.attempts, 3, 'one attempt and JOB_RETRY_LIMIT=2 retries');
    assert.equal(job.httpStatus, 503);
    assert.equal(job.creditsBilled, 0);
    assert.equal(job.error.code, 'SERVER_ERROR');
  });
});
