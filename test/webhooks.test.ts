/**
 * Completion webhooks over real HTTP and graphql-ws, with a real receiver (a node:http server)
 * that checks every signature itself (HMAC-SHA256 as Standard Webhooks defines it, computed here,
 * not by Sluice's code): delivery, retries with the same webhook-id after a 500 and after a
 * timeout, disabling after the failure period and re-enabling, secret rotation, tenant isolation,
 * bad input; on a Sluice without WEBHOOK_ALLOW_PRIVATE, the https-only and address refusals; and
 * the sender's own thread (not the main one), its metrics, and a thread that dies started again.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { threadId, type Worker } from 'node:worker_threads';
import { pino } from 'pino';
import postgres from 'postgres';
import { Retention } from '../src/retention/retention.ts';
import { collect, eventually, startTestApp, type TestApp } from './helpers/app.ts';

interface Received {
  path: string;
  id: string;
  timestamp: number;
  signatures: string[];
  body: string;
  json: any;
  /** Whether one of the signatures verified against the secrets the test registered for this path. */
  verified: boolean;
  answered: number | 'hang';
}

/** The receiver: per path, a list of answers to give in turn (the last one repeats), and the secrets to verify with. */
class Receiver {
  readonly got: Received[] = [];
  readonly answers = new Map<string, Array<number | 'hang'>>();
  readonly secrets = new Map<string, string[]>();
  private readonly hung: http.ServerResponse[] = [];
  /** Requests open now, and the most ever open at once, per path: the concurrency a sender really used. */
  private readonly open = new Map<string, number>();
  readonly maxOpen = new Map<string, number>();
  private server!: http.Server;
  port = 0;

  async start(): Promise<void> {
    this.server = http.createServer((req, res) => {
      const opened = req.url!;
      this.open.set(opened, (this.open.get(opened) ?? 0) + 1);
      this.maxOpen.set(opened, Math.max(this.maxOpen.get(opened) ?? 0, this.open.get(opened)!));
      res.on('close', () => this.open.set(opened, this.open.get(opened)! - 1));
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString();
        const path = req.url!;
        const id = String(req.headers['webhook-id']);
        const timestamp = Number(req.headers['webhook-timestamp']);
        const signatures = String(req.headers['webhook-signature'] ?? '').split(' ');
        // The check a receiver writes (README "Webhooks"): HMAC-SHA256 keyed by the base64 after whsec_.
        const expected = (secret: string) => 'v1,' + createHmac('sha256', Buffer.from(secret.slice('whsec_'.length), 'base64')).update(`${id}.${timestamp}.${body}`).digest('base64');
        const verified = (this.secrets.get(path) ?? []).some((s) => signatures.includes(expected(s)));
        const queue = this.answers.get(path) ?? [200];
        const answer = queue.length > 1 ? queue.shift()! : queue[0]!;
        let json: any = null;
        try {
          json = JSON.parse(body);
        } catch {}
        this.got.push({ path, id, timestamp, signatures, body, json, verified, answered: answer });
        if (answer === 'hang') {
          this.hung.push(res);
          return;
        }
        res.writeHead(answer).end();
      });
    });
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', r));
    this.port = (this.server.address() as AddressInfo).port;
  }

  url(path: string): string {
    return `http://127.0.0.1:${this.port}${path}`;
  }

  at(path: string): Received[] {
    return this.got.filter((g) => g.path === path);
  }

  async stop(): Promise<void> {
    for (const res of this.hung) res.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

const CREATE = `mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { endpoint { id url events enabled createdAt } secret } }`;
const UPDATE = `mutation($i: UpdateWebhookEndpointInput!) { updateWebhookEndpoint(input: $i) { id url events enabled disabledReason disabledAt failingSince } }`;
const DELIVERIES = `query($f: WebhookDeliveryFilter, $first: Int, $after: String) {
  webhookDeliveries(first: $first, after: $after, filter: $f) {
    edges { cursor node { id endpointId event jobId status attempts lastAttemptAt responseStatus lastError nextAttemptAt } }
    pageInfo { hasNextPage endCursor } } }`;
const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }`;
const ALL_EVENTS = ['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED'];

async function createEndpoint(t: TestApp, key: string, url: string, events = ALL_EVENTS): Promise<{ id: string; secret: string }> {
  const r = await t.gql(CREATE, { i: { url, events } }, key);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return { id: r.body.data.createWebhookEndpoint.endpoint.id, secret: r.body.data.createWebhookEndpoint.secret };
}

async function submit(t: TestApp, key: string, input: Record<string, unknown> = { api: 'emailvalidator', params: { email: 'jane@mailinator.com' } }): Promise<string> {
  const r = await t.gql(SUBMIT, { i: input }, key);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return r.body.data.submitJob.job.id;
}

async function deliveries(t: TestApp, key: string, filter: Record<string, unknown>): Promise<any[]> {
  const r = await t.gql(DELIVERIES, { f: filter, first: 100 }, key);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return r.body.data.webhookDeliveries.edges.map((e: { node: unknown }) => e.node);
}

describe('completion webhooks (WEBHOOK_ALLOW_PRIVATE=true, a real receiver)', () => {
  let t: TestApp;
  const rx = new Receiver();
  let a: { id: string; apiKey: string };
  let b: { id: string; apiKey: string };
  let aHook: { id: string; secret: string };

  before(async () => {
    await rx.start();
    t = await startTestApp({
      WEBHOOK_ALLOW_PRIVATE: 'true',
      WEBHOOK_RETRY_BASE_MS: '200',
      WEBHOOK_TIMEOUT_MS: '1000',
      WEBHOOK_DISABLE_AFTER_SECONDS: '2',
      WEBHOOK_POLL_MS: '100',
      WEBHOOK_MAX_ENDPOINTS: '3',
      // Small, so one stuck endpoint could take every slot of the process were it not bounded per endpoint.
      WEBHOOK_CONCURRENCY: '8',
      WEBHOOK_ENDPOINT_CONCURRENCY: '4',
    });
    a = await t.createTenant('hooked', 'PRO');
    b = await t.createTenant('other', 'PRO');
    aHook = await createEndpoint(t, a.apiKey, rx.url('/a'));
    rx.secrets.set('/a', [aHook.secret]);
  });
  after(async () => {
    await t.stop();
    await rx.stop();
  });

  test('a finished job is POSTed once, signed, with the Standard Webhooks headers and the job; its delivery is listed (also over graphql-ws)', async () => {
    const jobId = await submit(t, a.apiKey);
    const [got] = await eventually(async () => {
      const hits = rx.at('/a').filter((g) => g.json?.data?.id === jobId);
      return hits.length > 0 ? hits : null;
    });
    assert.ok(got!.verified, `signature ${got!.signatures.join(' ')} did not verify`);
    assert.ok(Math.abs(got!.timestamp - Date.now() / 1000) < 300, 'webhook-timestamp is Unix seconds, now');
    assert.equal(got!.json.type, 'job.succeeded');
    assert.equal(got!.json.data.state, 'SUCCEEDED');
    assert.equal(got!.json.data.api, 'emailvalidator');
    assert.equal(got!.json.data.creditsBilled, 5, 'the bill settled with the result rides in the event');
    assert.equal(got!.json.data.result.email, 'jane@mailinator.com');
    assert.equal(got!.json.data.error, null);
    assert.equal(got!.json.timestamp, got!.json.data.finishedAt);

    // The record, over HTTP...
    const rows = await eventually(async () => {
      const d = await deliveries(t, a.apiKey, { jobId });
      return d.length === 1 && d[0].status === 'SUCCEEDED' ? d : null;
    });
    assert.equal(rows[0].id, got!.id, 'the delivery id is the webhook-id');
    assert.equal(rows[0].endpointId, aHook.id);
    assert.equal(rows[0].event, 'JOB_SUCCEEDED');
    assert.equal(rows[0].attempts, 1);
    assert.equal(rows[0].responseStatus, 200);
    // ...and over graphql-ws, the same.
    const ws = t.ws(a.apiKey);
    const [viaWs] = await collect<any>(ws, DELIVERIES, { f: { jobId }, first: 10 }, () => true);
    assert.deepEqual(viaWs.webhookDeliveries.edges.map((e: any) => e.node), rows);
    // Exactly one POST for the job (no duplicate from the settlement's retry paths).
    assert.equal(rx.at('/a').filter((g) => g.json?.data?.id === jobId).length, 1);
  });

  test('FAILED and CANCELLED jobs are sent too; an endpoint gets only the events it asked for', async () => {
    const cancelsOnly = await createEndpoint(t, a.apiKey, rx.url('/a-cancelled'), ['JOB_CANCELLED']);
    rx.secrets.set('/a-cancelled', [cancelsOnly.secret]);
    const failed = await submit(t, a.apiKey, { api: 'dnslookup', params: { domain: 'not a domain!' } });
    await eventually(async () => rx.at('/a').some((g) => g.json?.data?.id === failed));
    const f = rx.at('/a').find((g) => g.json?.data?.id === failed)!;
    assert.equal(f.json.type, 'job.failed');
    assert.equal(f.json.data.state, 'FAILED');
    assert.ok(f.json.data.error?.code, 'the error rides in the event');
    assert.ok(f.verified);

    // A job held by a spent quota waits; cancelling it is its final state.
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: a.id, monthlyQuota: 0 } });
    const cancelled = await submit(t, a.apiKey);
    const c = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { state } }`, { id: cancelled }, a.apiKey);
    assert.equal(c.body.data?.cancelJob.state, 'CANCELLED', JSON.stringify(c.body));
    await t.gql(`mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }`, { i: { id: a.id, monthlyQuota: null } });
    await eventually(async () => rx.at('/a').some((g) => g.json?.data?.id === cancelled) && rx.at('/a-cancelled').some((g) => g.json?.data?.id === cancelled));
    for (const path of ['/a', '/a-cancelled']) {
      const got = rx.at(path).find((g) => g.json?.data?.id === cancelled)!;
      assert.equal(got.json.type, 'job.cancelled');
      assert.ok(got.verified, path);
    }
    // The FAILED job's event went to /a only: /a-cancelled did not ask for it.
    assert.equal(rx.at('/a-cancelled').some((g) => g.json?.data?.id === failed), false);
    const d = await deliveries(t, a.apiKey, { endpointId: cancelsOnly.id });
    assert.deepEqual(d.map((x) => x.jobId), [cancelled]);
  });

  test('a 500 is retried with backoff and the same webhook-id until a 2xx', async () => {
    const c = await t.createTenant('flaky-receiver', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/flaky'));
    rx.secrets.set('/flaky', [hook.secret]);
    rx.answers.set('/flaky', [500, 503, 200]);
    const jobId = await submit(t, c.apiKey);
    await eventually(async () => rx.at('/flaky').filter((g) => g.answered === 200).length === 1);
    const hits = rx.at('/flaky');
    assert.equal(hits.length, 3);
    assert.deepEqual(new Set(hits.map((h) => h.id)).size, 1, 'one webhook-id across attempts');
    assert.ok(hits.every((h) => h.verified && h.json.data.id === jobId));
    assert.deepEqual(new Set(hits.map((h) => h.body)).size, 1, 'the same body every time');
    const [row] = await eventually(async () => {
      const d = await deliveries(t, c.apiKey, { jobId });
      return d[0]?.status === 'SUCCEEDED' ? d : null;
    });
    assert.equal(row.attempts, 3);
    assert.equal(row.responseStatus, 200);
    assert.equal(row.lastError, null);
  });

  test('a receiver that does not answer within WEBHOOK_TIMEOUT_MS is retried (TIMEOUT), same webhook-id', async () => {
    const c = await t.createTenant('slow-receiver', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/slow'));
    rx.secrets.set('/slow', [hook.secret]);
    rx.answers.set('/slow', ['hang', 200]);
    const jobId = await submit(t, c.apiKey);
    // While the first attempt hangs, the row says so; its lastError after the retry landed is cleared.
    await eventually(async () => (await deliveries(t, c.apiKey, { jobId, status: 'PENDING' })).some((d) => d.attempts === 1 && /^TIMEOUT/.test(d.lastError)), 20_000, 50);
    await eventually(async () => rx.at('/slow').some((g) => g.answered === 200));
    const hits = rx.at('/slow');
    assert.equal(new Set(hits.map((h) => h.id)).size, 1);
    const [row] = await eventually(async () => {
      const d = await deliveries(t, c.apiKey, { jobId });
      return d[0]?.status === 'SUCCEEDED' ? d : null;
    });
    assert.equal(row.attempts, 2);
  });

  test('an endpoint failing for WEBHOOK_DISABLE_AFTER_SECONDS is disabled visibly; re-enabled, it gets the deliveries it kept', async () => {
    const c = await t.createTenant('down-receiver', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/down'));
    rx.secrets.set('/down', [hook.secret]);
    rx.answers.set('/down', [500]);
    const jobId = await submit(t, c.apiKey);
    const list = `query { webhookEndpoints { id enabled disabledReason disabledAt failingSince } }`;
    const [disabled] = await eventually(async () => {
      const r = await t.gql(list, {}, c.apiKey);
      const e = r.body.data.webhookEndpoints;
      return e[0]?.enabled === false ? e : null;
    });
    assert.equal(disabled.disabledReason, 'FAILING');
    assert.ok(disabled.disabledAt && disabled.failingSince);
    // Kept, not dropped, and not tried while disabled.
    const [waiting] = await deliveries(t, c.apiKey, { jobId });
    assert.equal(waiting.status, 'PENDING');
    const triedBefore = rx.at('/down').length;
    assert.ok(triedBefore >= 2);
    const ids = new Set(rx.at('/down').map((h) => h.id));
    assert.equal(ids.size, 1);

    rx.answers.set('/down', [200]);
    const r = await t.gql(UPDATE, { i: { id: hook.id, enabled: true } }, c.apiKey);
    assert.equal(r.body.data.updateWebhookEndpoint.enabled, true);
    assert.equal(r.body.data.updateWebhookEndpoint.disabledReason, null);
    await eventually(async () => rx.at('/down').some((g) => g.answered === 200));
    assert.ok(ids.has(rx.at('/down').at(-1)!.id), 'the same webhook-id after re-enabling');
    await eventually(async () => (await deliveries(t, c.apiKey, { jobId }))[0]?.status === 'SUCCEEDED');
    const after = await t.gql(list, {}, c.apiKey);
    assert.equal(after.body.data.webhookEndpoints[0].failingSince, null);
  });

  test('a receiver that never answers holds only its own endpoint\'s slots: another tenant\'s deliveries go through', async () => {
    const stuck = await t.createTenant('stuck-receiver', 'ENTERPRISE');
    const stuckHook = await createEndpoint(t, stuck.apiKey, rx.url('/stuck'));
    rx.answers.set('/stuck', ['hang']);
    const r = await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`, {
      i: { jobs: Array.from({ length: 20 }, (_, i) => ({ api: 'dnslookup', params: { domain: `stuck${i}.example.com` } })) },
    }, stuck.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    // The stuck endpoint has its 4 slots hanging (more would fill the process's 8).
    await eventually(async () => rx.at('/stuck').length >= 4);
    const fast = await t.createTenant('fast-receiver', 'PRO');
    const fastHook = await createEndpoint(t, fast.apiKey, rx.url('/fast'));
    rx.secrets.set('/fast', [fastHook.secret]);
    const jobId = await submit(t, fast.apiKey);
    await eventually(async () => rx.at('/fast').some((g) => g.json?.data?.id === jobId && g.verified));
    const stuckRows = await deliveries(t, stuck.apiKey, {});
    assert.ok(stuckRows.length >= 4 && stuckRows.length <= 20, `${stuckRows.length} deliveries (one per finished job)`);
    assert.ok(stuckRows.every((d) => d.status !== 'SUCCEEDED'), 'the stuck endpoint is still stuck');
    // Counted where it matters, at the receiver: rows may say SENDING a moment longer than their
    // request lasts (a claim runs beside the recording of attempts that ended), sockets may not.
    assert.ok(rx.maxOpen.get('/stuck')! <= 4, `at most WEBHOOK_ENDPOINT_CONCURRENCY requests open at once to one endpoint (${rx.maxOpen.get('/stuck')})`);
    // Deleting the endpoint drops its deliveries: nothing more is sent to it.
    const del = await t.gql(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: stuckHook.id }, stuck.apiKey);
    assert.equal(del.body.data.deleteWebhookEndpoint, stuckHook.id);
    assert.deepEqual(await deliveries(t, stuck.apiKey, {}), []);
  });

  test('rotateWebhookSecret: deliveries carry the new and the old signature during the overlap', async () => {
    const c = await t.createTenant('rotating', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/rotating'));
    const r = await t.gql(`mutation($id: ID!) { rotateWebhookSecret(id: $id) { endpoint { id } secret } }`, { id: hook.id }, c.apiKey);
    const fresh = r.body.data.rotateWebhookSecret.secret as string;
    assert.notEqual(fresh, hook.secret);
    assert.match(fresh, /^whsec_/);
    rx.secrets.set('/rotating', [fresh]);
    const jobId = await submit(t, c.apiKey);
    await eventually(async () => rx.at('/rotating').some((g) => g.json?.data?.id === jobId));
    const got = rx.at('/rotating')[0]!;
    assert.equal(got.signatures.length, 2);
    assert.ok(got.verified, 'the new secret verifies');
    rx.secrets.set('/rotating', [hook.secret]);
    const old = 'v1,' + createHmac('sha256', Buffer.from(hook.secret.slice(6), 'base64')).update(`${got.id}.${got.timestamp}.${got.body}`).digest('base64');
    assert.ok(got.signatures.includes(old), 'the old secret still verifies during the overlap');
  });

  test('tenants are isolated: no tenant sees, changes or receives for another tenant\'s endpoints', async () => {
    const bJob = await submit(t, b.apiKey);
    const listed = await t.gql(`query { webhookEndpoints { id } }`, {}, b.apiKey);
    assert.deepEqual(listed.body.data.webhookEndpoints, []);
    assert.deepEqual(await deliveries(t, b.apiKey, {}), []);
    assert.deepEqual(await deliveries(t, b.apiKey, { endpointId: aHook.id }), []);
    for (const [query, vars] of [
      [UPDATE, { i: { id: aHook.id, enabled: false } }],
      [`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: aHook.id }],
      [`mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, { id: aHook.id }],
    ] as const) {
      const r = await t.gql(query, vars, b.apiKey);
      assert.equal(r.body.errors?.[0]?.extensions?.code, 'NOT_FOUND', JSON.stringify(r.body));
    }
    // A's endpoint is untouched, and B's finished job went nowhere.
    const mine = await t.gql(`query { webhookEndpoints { id enabled } }`, {}, a.apiKey);
    assert.ok(mine.body.data.webhookEndpoints.some((e: { id: string; enabled: boolean }) => e.id === aHook.id && e.enabled));
    await eventually(async () => {
      const r = await t.gql(`query($id: ID!) { job(id: $id) { state } }`, { id: bJob }, b.apiKey);
      return r.body.data.job.state === 'SUCCEEDED';
    });
    // A later job of A's is delivered after B's finished: had B's been sent to A, it would be there by now.
    const aJob = await submit(t, a.apiKey);
    await eventually(async () => rx.at('/a').some((g) => g.json?.data?.id === aJob));
    assert.equal(rx.got.some((g) => g.json?.data?.id === bJob), false);
    // The admin token does not act as a tenant here: it names one.
    const admin = await t.gql(`query { webhookEndpoints { id } }`);
    assert.equal(admin.body.errors?.[0]?.extensions?.code, 'BAD_USER_INPUT');
  });

  test('the admin reads any tenant\'s endpoints and deliveries by naming it, and re-enables a failed endpoint; a tenant naming another is FORBIDDEN', async () => {
    const c = await t.createTenant('operator-watched', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/watched'));
    rx.secrets.set('/watched', [hook.secret]);
    rx.answers.set('/watched', [500]);
    const jobId = await submit(t, c.apiKey);
    const LIST = `query($t: ID) { webhookEndpoints(tenantId: $t) { id url enabled disabledReason failingSince } }`;
    const ADMIN_DELIVERIES = `query($t: ID, $f: WebhookDeliveryFilter) { webhookDeliveries(tenantId: $t, first: 20, filter: $f) { edges { node { id endpointId jobId status attempts responseStatus } } } }`;
    // It fails until disabled; the admin sees why, and the delivery it kept.
    const [disabled] = await eventually(async () => {
      const r = await t.gql(LIST, { t: c.id });
      assert.ok(r.body.data, JSON.stringify(r.body.errors));
      const e = r.body.data.webhookEndpoints;
      return e[0]?.enabled === false ? e : null;
    });
    assert.equal(disabled.id, hook.id);
    assert.equal(disabled.disabledReason, 'FAILING');
    assert.ok(disabled.failingSince);
    const kept = await t.gql(ADMIN_DELIVERIES, { t: c.id, f: { endpointId: hook.id } });
    const [waiting] = kept.body.data.webhookDeliveries.edges.map((e: { node: any }) => e.node);
    assert.equal(waiting.jobId, jobId);
    assert.equal(waiting.status, 'PENDING');
    assert.equal(waiting.responseStatus, 500);
    // The admin may enable or disable, never change where deliveries go.
    const moved = await t.gql(UPDATE, { i: { id: hook.id, url: rx.url('/elsewhere') } });
    assert.equal(moved.body.errors?.[0]?.extensions?.code, 'FORBIDDEN');
    rx.answers.set('/watched', [200]);
    const on = await t.gql(UPDATE, { i: { id: hook.id, enabled: true } });
    assert.equal(on.body.data.updateWebhookEndpoint.enabled, true, JSON.stringify(on.body));
    assert.equal(on.body.data.updateWebhookEndpoint.url, rx.url('/watched'));
    await eventually(async () => rx.at('/watched').some((g) => g.answered === 200 && g.verified && g.json?.data?.id === jobId));
    await eventually(async () => {
      const r = await t.gql(ADMIN_DELIVERIES, { t: c.id, f: { jobId } });
      return r.body.data.webhookDeliveries.edges[0]?.node.status === 'SUCCEEDED';
    });
    const off = await t.gql(UPDATE, { i: { id: hook.id, enabled: false } });
    assert.equal(off.body.data.updateWebhookEndpoint.disabledReason, 'DISABLED_BY_OPERATOR');
    assert.equal((await t.gql(UPDATE, { i: { id: hook.id, enabled: true } })).body.data.updateWebhookEndpoint.enabled, true);
    // A tenant names only itself; another tenant's ids stay NOT_FOUND.
    const code = async (query: string, vars: Record<string, unknown>, key?: string) => (await t.gql(query, vars, key)).body.errors?.[0]?.extensions?.code;
    assert.equal(await code(LIST, { t: c.id }, b.apiKey), 'FORBIDDEN');
    assert.equal(await code(ADMIN_DELIVERIES, { t: c.id }, b.apiKey), 'FORBIDDEN');
    assert.equal((await t.gql(LIST, { t: c.id }, c.apiKey)).body.data.webhookEndpoints[0].id, hook.id, 'naming itself is allowed');
    assert.equal(await code(UPDATE, { i: { id: hook.id, enabled: false } }, b.apiKey), 'NOT_FOUND');
    assert.equal((await t.gql(LIST, { t: c.id })).body.data.webhookEndpoints[0].enabled, true);
    // The admin names a tenant that exists.
    assert.equal(await code(LIST, {}), 'BAD_USER_INPUT');
    assert.equal(await code(LIST, { t: '00000000-0000-4000-8000-000000000000' }), 'NOT_FOUND');
    assert.equal(await code(ADMIN_DELIVERIES, { t: 'nope' }), 'BAD_USER_INPUT', 'an id that is not a UUID');
    assert.equal(await code(UPDATE, { i: { id: '00000000-0000-4000-8000-000000000000', enabled: true } }), 'NOT_FOUND');
  });

  test('bad input is refused with a code', async () => {
    const c = await t.createTenant('careless', 'PRO');
    const code = async (query: string, vars: Record<string, unknown>) => (await t.gql(query, vars, c.apiKey)).body.errors?.[0]?.extensions?.code;
    assert.equal(await code(CREATE, { i: { url: 'not a url', events: ALL_EVENTS } }), 'BAD_WEBHOOK_URL');
    assert.equal(await code(CREATE, { i: { url: 'ftp://example.com/x', events: ALL_EVENTS } }), 'BAD_WEBHOOK_URL');
    assert.equal(await code(CREATE, { i: { url: 'https://u:p@example.com/x', events: ALL_EVENTS } }), 'BAD_WEBHOOK_URL');
    assert.equal(await code(CREATE, { i: { url: 'https://example.com/x', events: [] } }), 'BAD_USER_INPUT');
    assert.ok(await code(CREATE, { i: { url: 'https://example.com/x', events: ['JOB_EXPLODED'] } }), 'an unknown event is refused');
    assert.equal(await code(UPDATE, { i: { id: 'nope', enabled: true } }), 'BAD_USER_INPUT', 'an id that is not a UUID');
    assert.equal(await code(UPDATE, { i: { id: '00000000-0000-4000-8000-000000000000', enabled: true } }), 'NOT_FOUND');
    assert.equal(await code(DELIVERIES, { after: 'garbage' }), 'BAD_USER_INPUT');
    assert.equal(await code(DELIVERIES, { first: 501 }), 'BAD_USER_INPUT');
    for (let i = 0; i < 3; i++) await createEndpoint(t, c.apiKey, `https://example.com/${i}`);
    assert.equal(await code(CREATE, { i: { url: 'https://example.com/4', events: ALL_EVENTS } }), 'TOO_MANY_WEBHOOK_ENDPOINTS');
    const first = (await t.gql(`query { webhookEndpoints { id } }`, {}, c.apiKey)).body.data.webhookEndpoints[0].id;
    const del = await t.gql(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: first }, c.apiKey);
    assert.equal(del.body.data.deleteWebhookEndpoint, first);
    assert.equal(await code(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: first }), 'NOT_FOUND');
  });

  test('retention deletes deliveries that ended longer ago than JOB_RETENTION_SECONDS, not the waiting ones', async () => {
    // Retention holds one connection for its lock and deletes on another.
    const sql = postgres(t.databaseUrl, { max: 3, onnotice: () => {} });
    try {
      // A waiting delivery: an endpoint disabled by hand keeps its event PENDING.
      const c = await t.createTenant('retained', 'PRO');
      const hook = await createEndpoint(t, c.apiKey, rx.url('/retained'));
      const off = await t.gql(UPDATE, { i: { id: hook.id, enabled: false } }, c.apiKey);
      assert.equal(off.body.data.updateWebhookEndpoint.disabledReason, 'DISABLED_BY_TENANT');
      await sql`insert into webhook_deliveries (tenant_id, endpoint_id, job_id, event, updated_at) values (${c.id}, ${hook.id}, gen_random_uuid(), 'JOB_SUCCEEDED', now() - interval '1 hour')`;
      const retention = new Retention({ sql, retentionSeconds: 1, batchSize: 100, maxBatches: 100, intervalSeconds: 1 });
      await eventually(async () => {
        await retention.runOnce();
        const [r] = await sql`select count(*)::int as n from webhook_deliveries where status in ('SUCCEEDED', 'FAILED')`;
        return r!.n === 0;
      });
      const [pending] = await sql`select count(*)::int as n from webhook_deliveries where endpoint_id = ${hook.id} and status = 'PENDING'`;
      assert.equal(pending!.n, 1);
    } finally {
      await sql.end();
    }
  });
});

describe('completion webhooks without WEBHOOK_ALLOW_PRIVATE', () => {
  let t: TestApp;
  const rx = new Receiver();
  let c: { id: string; apiKey: string };

  before(async () => {
    await rx.start();
    t = await startTestApp({ WEBHOOK_POLL_MS: '100', WEBHOOK_RETRY_BASE_MS: '200' });
    c = await t.createTenant('strict', 'PRO');
  });
  after(async () => {
    await t.stop();
    await rx.stop();
  });

  test('plain http and literal private addresses are refused when the endpoint is made', async () => {
    for (const url of [rx.url('/x'), 'http://example.com/hook', 'https://127.0.0.1/hook', 'https://10.0.0.7/hook', 'https://169.254.169.254/latest', 'https://[::1]/hook', 'https://[::ffff:192.168.1.1]/hook']) {
      const r = await t.gql(CREATE, { i: { url, events: ALL_EVENTS } }, c.apiKey);
      assert.equal(r.body.errors?.[0]?.extensions?.code, 'BAD_WEBHOOK_URL', url);
    }
    const ok = await t.gql(CREATE, { i: { url: 'https://hooks.example.com/sluice', events: ALL_EVENTS } }, c.apiKey);
    assert.ok(ok.body.data?.createWebhookEndpoint.secret);
  });

  test('a name resolving to a private address is refused when the delivery resolves it: nothing is sent', async () => {
    const d = await t.createTenant('rebinding', 'PRO');
    // https://localhost passes the literal check; the address is judged at each delivery.
    const hook = await createEndpoint(t, d.apiKey, `https://localhost:${rx.port}/private`);
    const jobId = await submit(t, d.apiKey);
    const [row] = await eventually(async () => {
      const rows = await deliveries(t, d.apiKey, { jobId });
      return rows[0] && rows[0].attempts >= 1 && rows[0].lastError ? rows : null;
    });
    assert.match(row.lastError, /^ADDRESS_REFUSED/);
    assert.equal(row.responseStatus, null);
    assert.equal(row.endpointId, hook.id);
    assert.equal(rx.got.length, 0, 'the receiver on loopback got nothing');
  });
});

describe('the webhook sender runs on its own thread', () => {
  let t: TestApp;
  const rx = new Receiver();
  const lines: any[] = [];
  const threads: Array<{ worker: Worker; threadId: number }> = [];
  let c: { id: string; apiKey: string };

  before(async () => {
    await rx.start();
    const log = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
    t = await startTestApp({ WEBHOOK_ALLOW_PRIVATE: 'true', WEBHOOK_POLL_MS: '100', WEBHOOK_RETRY_BASE_MS: '200' }, { webhookThread: (worker, threadId) => void threads.push({ worker, threadId }) }, { log });
    c = await t.createTenant('threaded', 'PRO');
    await createEndpoint(t, c.apiKey, rx.url('/threaded'));
  });
  after(async () => {
    await t.stop();
    await rx.stop();
  });

  async function attemptsMetric(): Promise<number> {
    const text = await (await fetch(t.url.replace(/\/graphql$/, '/metrics'))).text();
    const m = text.match(/^sluice_webhook_attempts_total\{outcome="delivered"\} (\d+)$/m);
    return m ? Number(m[1]) : 0;
  }

  test('deliveries are sent from a thread that is not the main one; its attempts reach the metrics', async () => {
    assert.equal(threads.length, 1);
    assert.notEqual(threads[0]!.threadId, 0, 'not the main thread (id 0)');
    assert.notEqual(threads[0]!.threadId, threadId);
    assert.ok(lines.some((l) => l.msg === 'webhook sender thread running' && l.threadId === threads[0]!.threadId), 'the main thread logs the thread it started');
    // Its young generation is bounded (V8's default here is 128 MB of new space, resident once grown).
    const young = threads[0]!.worker.resourceLimits?.maxYoungGenerationSizeMb ?? 0;
    assert.ok(young > 0 && young <= 32, `the thread's young generation is bounded: ${young} MB`);
    const jobId = await submit(t, c.apiKey);
    await eventually(async () => (rx.at('/threaded').some((g) => g.json?.data?.id === jobId) ? true : null));
    // Counted in the thread, posted to the main thread's /metrics.
    await eventually(async () => ((await attemptsMetric()) >= 1 ? true : null));
  });

  test('a thread that dies is logged and started again; the process and the deliveries carry on', async () => {
    const first = threads[0]!;
    await first.worker.terminate();
    await eventually(async () => (threads.length === 2 ? true : null), 15_000);
    assert.notEqual(threads[1]!.threadId, first.threadId);
    assert.ok(lines.some((l) => l.msg.startsWith('webhook sender thread died')), 'the death is logged');
    const jobId = await submit(t, c.apiKey);
    await eventually(async () => (rx.at('/threaded').some((g) => g.json?.data?.id === jobId) ? true : null));
    await eventually(async () => ((await attemptsMetric()) >= 2 ? true : null));
    // The API still answers: the process did not go down with the thread.
    const r = await t.gql(`{ __typename }`);
    assert.equal(r.body.data.__typename, 'Query');
  });
});
