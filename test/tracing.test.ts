/**
 * One trace per job, across processes: an API node and a worker node (real processes) export
 * OTLP/HTTP JSON to a receiver written here. Jobs submitted with and without a client
 * traceparent, a batch call, a retried job, webhook deliveries and a subscription: each job's
 * spans, their parents and links, their attributes, the traceparent the provider and the
 * webhook receiver got, and that no span carries a key, a secret, a param or a result.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { startSimulator, type Simulator } from '../src/simulator/index.ts';
import { createTestDatabase } from './helpers/db.ts';
import { ADMIN_TOKEN, eventually } from './helpers/app.ts';
import { crashTestEnv, gqlAt, startNode, type NodeProcess } from './helpers/processes.ts';
import { watch, type Watched } from './helpers/ws-watch.ts';

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string;
  name: string;
  kind: number;
  start: number;
  end: number;
  attributes: Record<string, unknown>;
  events: Array<{ name: string; attributes: Record<string, unknown> }>;
  links: Array<{ traceId: string; spanId: string; attributes: Record<string, unknown> }>;
  resource: Record<string, unknown>;
}

const KIND = { INTERNAL: 1, SERVER: 2, CLIENT: 3, PRODUCER: 4 };

function attrs(list: Array<{ key: string; value: Record<string, unknown> }> | undefined): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const a of list ?? []) {
    const v = a.value;
    out[a.key] = v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : undefined) ?? v.doubleValue ?? v.boolValue;
  }
  return out;
}

/** An OTLP/HTTP receiver (JSON encoding): every span it was sent, flattened. */
async function otlpReceiver(): Promise<{ url: string; spans: OtlpSpan[]; raw: string[]; close(): Promise<void> }> {
  const spans: OtlpSpan[] = [];
  const raw: string[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      raw.push(text);
      assert.equal(req.url, '/v1/traces');
      assert.match(String(req.headers['content-type']), /application\/json/);
      const body = JSON.parse(text) as { resourceSpans: any[] };
      for (const rs of body.resourceSpans ?? []) {
        const resource = attrs(rs.resource?.attributes);
        for (const ss of rs.scopeSpans ?? []) {
          for (const s of ss.spans ?? []) {
            spans.push({
              traceId: s.traceId,
              spanId: s.spanId,
              parentSpanId: s.parentSpanId ?? '',
              name: s.name,
              kind: s.kind,
              start: Number(BigInt(s.startTimeUnixNano) / 1_000_000n),
              end: Number(BigInt(s.endTimeUnixNano) / 1_000_000n),
              attributes: attrs(s.attributes),
              events: (s.events ?? []).map((e: any) => ({ name: e.name, attributes: attrs(e.attributes) })),
              links: (s.links ?? []).map((l: any) => ({ traceId: l.traceId, spanId: l.spanId, attributes: attrs(l.attributes) })),
              resource,
            });
          }
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, spans, raw, close: () => new Promise((r) => server.close(() => r())) };
}

/** An HTTP server recording each request's path and traceparent (a proxy to `target` when given). */
async function recorder(target?: string): Promise<{ url: string; seen: Array<{ path: string; traceparent: string | undefined }>; close(): Promise<void> }> {
  const seen: Array<{ path: string; traceparent: string | undefined }> = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push({ path: req.url ?? '', traceparent: req.headers.traceparent as string | undefined });
      if (!target) return void res.writeHead(204).end();
      const up = http.request(new URL(req.url ?? '/', target), { method: req.method, headers: { ...req.headers, host: new URL(target).host } }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      });
      up.on('error', () => res.writeHead(502).end());
      up.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen, close: () => new Promise((r) => server.close(() => r())) };
}

const CLIENT_TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const CLIENT_SPAN = '00f067aa0ba902b7';

describe('tracing across an API node and a worker node', () => {
  let db: Awaited<ReturnType<typeof createTestDatabase>>;
  let sim: Simulator;
  let otlp: Awaited<ReturnType<typeof otlpReceiver>>;
  let provider: Awaited<ReturnType<typeof recorder>>;
  let hooks: Awaited<ReturnType<typeof recorder>>;
  let api: NodeProcess;
  let worker: NodeProcess;
  let tenant: { id: string; apiKey: string };
  let webhookSecret: string;
  let sub: Watched;
  const ids: { withParent?: string; plain?: string; batch?: string[]; retried?: string } = {};

  before(async () => {
    db = await createTestDatabase();
    sim = await startSimulator({ plan: 'PRO', ratePerMinute: 6000, latencyMs: 20, latencyP95Ms: 30, concurrentCalls: 50, seed: 5, conditions: { apis: { dnslookup: { outage: 503 } } } });
    otlp = await otlpReceiver();
    provider = await recorder(sim.url);
    hooks = await recorder();
    const env = crashTestEnv({ apiKey: sim.apiKey, url: `${provider.url}/v1` }, db.url, 6000, {
      OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
      OTEL_BSP_SCHEDULE_DELAY: '100',
      OTEL_SERVICE_NAME: 'sluice-test',
      TRACE_URL_TEMPLATE: 'http://jaeger.test/trace/{traceId}',
      // Single calls for these two; emailvalidator batches.
      BATCH_DISABLED_APIS: 'exchangerate,dnslookup',
      JOB_RETRY_LIMIT: '1',
      JOB_RETRY_DELAY_SECONDS: '1',
      WEBHOOK_ALLOW_PRIVATE: 'true',
      WEBHOOK_POLL_MS: '100',
    });
    api = await startNode('api', env);
    worker = await startNode('worker', env);
    const { createTenant } = await gqlAt(api.url!, `mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }`, { i: { name: 'traced', tier: 'PRO' } });
    tenant = { id: createTenant.tenant.id, apiKey: createTenant.apiKey };
    const hook = await gqlAt(api.url!, `mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { endpoint { id } secret } }`, { i: { url: `${hooks.url}/hook`, events: ['JOB_SUCCEEDED', 'JOB_FAILED'] } }, tenant.apiKey);
    webhookSecret = hook.createWebhookEndpoint.secret;
    sub = watch(api.url!, tenant.apiKey, 'subscription { jobsCompleted { id state } }');
    await eventually(async () => sub.acknowledged, 10_000);
  });
  after(async () => {
    await sub?.client.dispose();
    await worker?.stop();
    await api?.stop();
    await Promise.all([otlp?.close(), provider?.close(), hooks?.close()]);
    await sim?.stop();
    await db?.drop();
  });

  const submit = async (input: Record<string, unknown>, traceparent?: string): Promise<string> => {
    const res = await fetch(api.url!, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${tenant.apiKey}`, ...(traceparent ? { traceparent } : {}) },
      body: JSON.stringify({ query: 'mutation Submit($i: JobInput!) { submitJob(input: $i) { job { id } } }', variables: { i: input } }),
    });
    const body: any = await res.json();
    assert.ok(body.data, JSON.stringify(body.errors));
    return body.data.submitJob.job.id;
  };

  const spansOf = (jobId: string) => otlp.spans.filter((s) => s.attributes['sluice.job.id'] === jobId);
  const one = (list: OtlpSpan[], name: string) => {
    const found = list.filter((s) => s.name === name);
    assert.equal(found.length, 1, `one ${name}: ${found.length}`);
    return found[0]!;
  };
  const byId = (spanId: string) => otlp.spans.find((s) => s.spanId === spanId);

  test('jobs with and without a client traceparent, a batch and a retried job all finish, with their webhooks and events', async () => {
    // The batch first: a turn whose head job's API does not batch sends the jobs behind it as
    // single calls, so three emails queued behind the exchange rate would not make a batch.
    const many = await gqlAt(
      api.url!,
      `mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }`,
      { i: { jobs: ['a', 'b', 'c'].map((u) => ({ api: 'emailvalidator', params: { email: `${u}@secret-param.example` } })) } },
      tenant.apiKey,
    );
    ids.batch = many.submitJobs.jobs.map((j: { id: string }) => j.id);
    ids.withParent = await submit({ api: 'exchangerate', params: { currency1: 'USD', currency2: 'JPY' }, priority: 'INTERACTIVE' }, `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01`);
    ids.plain = await submit({ api: 'exchangerate', params: { currency1: 'EUR', currency2: 'GBP' }, fairnessKey: 'customer-7' });
    ids.retried = await submit({ api: 'dnslookup', params: { domain: 'down.example' } });
    const all = [ids.withParent, ids.plain, ids.retried, ...ids.batch!];
    await eventually(async () => {
      const d = await gqlAt(api.url!, `query { jobs(first: 20) { edges { node { id state } } } }`, {}, tenant.apiKey);
      return d.jobs.edges.every((e: any) => ['SUCCEEDED', 'FAILED'].includes(e.node.state)) && d.jobs.edges.length === all.length;
    }, 30_000);
    await eventually(async () => hooks.seen.length >= all.length, 15_000);
    await eventually(async () => sub.events.length >= all.length, 10_000);
    // Spans arrive within the batch processor's delay (100 ms) of ending; the webhook and push spans last.
    await eventually(async () => all.every((id) => spansOf(id).some((s) => s.name === 'POST webhook') && spansOf(id).some((s) => s.name === 'sluice.subscription.push')), 15_000);
  });

  test("a client's traceparent: the job's whole life is in the client's trace, each span under the right parent", async () => {
    const id = ids.withParent!;
    const spans = spansOf(id);
    for (const s of spans) assert.equal(s.traceId, CLIENT_TRACE, `${s.name} is in the client's trace`);
    const submitSpan = one(otlp.spans.filter((s) => s.traceId === CLIENT_TRACE), 'sluice.submit');
    const request = byId(submitSpan.parentSpanId)!;
    assert.equal(request.kind, KIND.SERVER);
    assert.equal(request.name, 'POST /graphql');
    assert.equal(request.parentSpanId, CLIENT_SPAN, "the request's parent is the client's span");
    assert.equal(request.attributes['graphql.operation.name'], 'Submit');
    assert.equal(request.attributes['graphql.operation.type'], 'mutation');
    assert.equal(request.attributes['sluice.tenant.id'], tenant.id);
    assert.equal(request.attributes['http.response.status_code'], 200);
    assert.equal(request.resource['service.name'], 'sluice-test');
    assert.equal(request.resource['sluice.role'], 'api');

    const wait = one(spans, 'sluice.queue.wait');
    const lease = one(spans, 'sluice.lease');
    const settle = one(otlp.spans.filter((s) => s.parentSpanId === lease.spanId), 'sluice.settle');
    const call = one(otlp.spans.filter((s) => s.parentSpanId === lease.spanId), 'GET /v1/exchangerate');
    const hook = one(spans, 'POST webhook');
    const push = one(spans, 'sluice.subscription.push');
    for (const s of [wait, lease, hook, push]) assert.equal(s.parentSpanId, submitSpan.spanId, `${s.name} is a child of the submit span`);
    assert.equal(wait.resource['sluice.role'], 'worker', 'the wait and the lease come from the worker node');
    assert.equal(push.resource['sluice.role'], 'api', 'the push from the API node');
    assert.ok(wait.start <= wait.end && wait.end <= lease.end);
    assert.ok(wait.events.some((e) => e.name === 'wait' && typeof e.attributes['sluice.wait.reason'] === 'string'));

    assert.deepEqual(
      { tenant: lease.attributes['sluice.tenant.id'], api: lease.attributes['sluice.job.api'], priority: lease.attributes['sluice.job.priority'], attempt: lease.attributes['sluice.job.attempt'], reserved: lease.attributes['sluice.credits.reserved'], billed: lease.attributes['sluice.credits.billed'], state: lease.attributes['sluice.job.state'] },
      { tenant: tenant.id, api: 'exchangerate', priority: 'INTERACTIVE', attempt: 1, reserved: 1, billed: 1, state: 'SUCCEEDED' },
    );
    assert.equal(typeof lease.attributes['sluice.window'], 'string');
    assert.equal(typeof lease.attributes['sluice.window.pool'], 'number');
    assert.equal(typeof lease.attributes['sluice.window.paced_per_minute'], 'number');
    assert.equal(settle.attributes['sluice.credits.billed'], 1);

    assert.equal(call.kind, KIND.CLIENT);
    assert.equal(call.attributes['http.response.status_code'], 200);
    assert.equal(call.attributes['sluice.outcome'], 'billed');
    assert.equal(typeof call.attributes['provider.rate_limit.limit'], 'number', "the provider's rate-limit headers");
    assert.equal(typeof call.attributes['provider.rate_limit.remaining'], 'number');
    assert.ok(provider.seen.some((r) => r.path.startsWith('/v1/exchangerate') && r.traceparent === `00-${CLIENT_TRACE}-${call.spanId}-01`), 'the provider got the call span as its parent');

    assert.equal(hook.kind, KIND.CLIENT);
    assert.equal(hook.attributes['http.response.status_code'], 204);
    assert.equal(hook.attributes['sluice.webhook.event'], 'JOB_SUCCEEDED');
    assert.equal(hook.attributes['sluice.webhook.attempt'], 1);
    assert.ok(hooks.seen.some((r) => r.traceparent === `00-${CLIENT_TRACE}-${hook.spanId}-01`), 'the receiver got the delivery span as its parent');
    assert.equal(push.attributes['sluice.subscription.subscribers'], 1);

    const d = await gqlAt(api.url!, `query($id: ID!) { job(id: $id) { traceId traceUrl } }`, { id }, tenant.apiKey);
    assert.deepEqual(d.job, { traceId: CLIENT_TRACE, traceUrl: `http://jaeger.test/trace/${CLIENT_TRACE}` });
  });

  test('without a traceparent: the request starts the trace; the fairness key is on the spans', async () => {
    const spans = spansOf(ids.plain!);
    const traceId = spans[0]!.traceId;
    assert.notEqual(traceId, CLIENT_TRACE);
    for (const s of spans) assert.equal(s.traceId, traceId);
    const submitSpan = byId(one(spans, 'sluice.lease').parentSpanId)!;
    assert.equal(submitSpan.name, 'sluice.submit');
    const request = byId(submitSpan.parentSpanId)!;
    assert.equal(request.parentSpanId, '', 'a root span');
    assert.equal(one(spans, 'sluice.lease').attributes['sluice.job.fairness_key'], 'customer-7');
  });

  test('a batch call: a span of its own that links to every job it carries, not a child of one', async () => {
    // The worker exports on its own schedule: the batch call's span may land after the API node's
    // spans the first test waited for.
    await eventually(async () => otlp.spans.some((s) => s.name === 'POST /v1/emailvalidator/batch') && ids.batch!.every((id) => spansOf(id).some((s) => s.name === 'sluice.lease')), 15_000);
    const leases = ids.batch!.map((id) => one(spansOf(id), 'sluice.lease'));
    const batch = otlp.spans.filter((s) => s.name === 'POST /v1/emailvalidator/batch');
    assert.equal(batch.length, 1, 'one batch call');
    const call = batch[0]!;
    assert.equal(call.parentSpanId, '');
    assert.ok(!leases.some((l) => l.traceId === call.traceId), 'not in any one job\'s trace');
    assert.deepEqual(call.links.map((l) => `${l.traceId}/${l.spanId}`).sort(), leases.map((l) => `${l.traceId}/${l.spanId}`).sort());
    assert.deepEqual(call.links.map((l) => l.attributes['sluice.job.id']).sort(), [...ids.batch!].sort());
    assert.equal(call.attributes['sluice.job.count'], 3);
    assert.ok(provider.seen.some((r) => r.path.includes('/batch') && r.traceparent?.includes(call.spanId)));
    // The three jobs were one submission: one trace, one submit span.
    assert.equal(new Set(leases.map((l) => l.parentSpanId)).size, 1);
  });

  test('a retried job: one wait and one lease per attempt, the retry a wait reason, the last attempt FAILED', async () => {
    const spans = spansOf(ids.retried!);
    const leases = spans.filter((s) => s.name === 'sluice.lease').sort((a, b) => a.start - b.start);
    const waits = spans.filter((s) => s.name === 'sluice.queue.wait').sort((a, b) => a.start - b.start);
    assert.equal(leases.length, 2);
    assert.equal(waits.length, 2);
    assert.deepEqual(leases.map((l) => [l.attributes['sluice.job.attempt'], l.attributes['sluice.job.state']]), [[1, 'QUEUED'], [2, 'FAILED']]);
    assert.equal(new Set(spans.map((s) => s.traceId)).size, 1, 'every attempt in the one trace');
    assert.ok(waits[1]!.events.some((e) => e.attributes['sluice.wait.reason'] === 'RETRY'), 'the second wait says it was a retry');
    const calls = otlp.spans.filter((s) => leases.some((l) => l.spanId === s.parentSpanId) && s.kind === KIND.CLIENT);
    assert.deepEqual(calls.map((c) => c.attributes['http.response.status_code']), [503, 503]);
    assert.ok(calls.every((c) => c.attributes['error.type'] === 'server_error'));
    assert.equal(one(spans, 'POST webhook').attributes['sluice.webhook.event'], 'JOB_FAILED');
  });

  test('no span, event, link or resource carries a key, a secret, a param or a result', async () => {
    const text = otlp.raw.join('\n');
    for (const secret of [sim.apiKey, tenant.apiKey, ADMIN_TOKEN, webhookSecret, 'secret-param.example', 'USD', 'JPY', 'down.example', 'exchangeRate', 'whsec_']) {
      assert.ok(!text.includes(secret), `the exported spans contain ${secret.slice(0, 12)}…`);
    }
    for (const s of otlp.spans) {
      for (const key of [...Object.keys(s.attributes), ...s.events.flatMap((e) => Object.keys(e.attributes)), ...s.links.flatMap((l) => Object.keys(l.attributes))]) {
        assert.doesNotMatch(key, /param|result|secret|api.?key|authorization|url\.full|query/i, `${s.name}: ${key}`);
      }
    }
  });
});
