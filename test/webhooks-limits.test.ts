/**
 * The webhook sender's limits, over real HTTP with real receivers on 127.0.0.x: an attempt is
 * bounded as a whole (a receiver that trickles its body after the headers, one that never
 * answers), sockets are capped across every host name, each tenant is held to its delivery budget
 * and claimed round-robin beside the others (its backlog shown on the endpoint), the endpoint
 * limit holds under parallel creates, the errors a tenant reads name no resolved address, and
 * signing secrets are sealed in the database (legacy plaintext rows and key rotation included)
 * while deliveries still verify with the secret the API returned.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import postgres from 'postgres';
import { keyId } from '../src/webhooks/secret-box.ts';
import { claimDue } from '../src/webhooks/store.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { createTestDatabase } from './helpers/db.ts';

type Answer = 'ok' | 'trickle' | 'silent';

interface Hit {
  host: string;
  path: string;
  id: string;
  tenantTag: string | null;
  signatures: string[];
  timestamp: number;
  body: string;
}

/** Receivers on 127.0.0.1 and (for the socket cap) 127.0.0.2..: per path an answer, and every hit recorded in order. */
class Receivers {
  readonly hits: Hit[] = [];
  readonly answers = new Map<string, Answer>();
  private readonly servers: http.Server[] = [];
  private readonly sockets = new Set<Socket>();
  private readonly timers = new Set<NodeJS.Timeout>();
  /** Connections open now, across every address. */
  open = 0;
  private readonly conns = new Set<{ openedAt: number; closed: boolean }>();
  private sampler: NodeJS.Timeout | null = null;
  /**
   * The most connections seen open at once, sampled every 10 ms, counting those open for 25 ms or
   * more: a socket the sender closes and the one it opens next can reach this server in either
   * order within one turn of its event loop, which says nothing about the sender's own count.
   */
  maxOpen = 0;
  /** When each trickled answer's connection was closed by the sender (ms after it opened). */
  readonly trickleClosedAfterMs: number[] = [];
  port = 0;

  async start(hosts: string[]): Promise<void> {
    for (const host of hosts) {
      const server = http.createServer((req, res) => {
        const chunks: Buffer[] = [];
        req.on('data', (c: Buffer) => chunks.push(c));
        req.on('end', () => {
          const body = Buffer.concat(chunks).toString();
          let tenantTag: string | null = null;
          try {
            tenantTag = JSON.parse(body)?.data?.params?.tag ?? null;
          } catch {}
          const path = req.url!;
          this.hits.push({
            host,
            path,
            id: String(req.headers['webhook-id']),
            tenantTag,
            signatures: String(req.headers['webhook-signature'] ?? '').split(' '),
            timestamp: Number(req.headers['webhook-timestamp']),
            body,
          });
          const answer = this.answers.get(path) ?? 'ok';
          if (answer === 'silent') return;
          if (answer === 'ok') return void res.writeHead(200).end('thanks');
          // Headers at once, then a byte every 100 ms, for ever.
          const opened = Date.now();
          res.writeHead(200, { 'content-type': 'text/plain' });
          const timer = setInterval(() => res.write('.'), 100);
          this.timers.add(timer);
          res.on('close', () => {
            clearInterval(timer);
            this.trickleClosedAfterMs.push(Date.now() - opened);
          });
        });
      });
      server.on('connection', (socket: Socket) => {
        const conn = { openedAt: Date.now(), closed: false };
        this.sockets.add(socket);
        this.conns.add(conn);
        this.open++;
        const closed = () => {
          if (conn.closed) return;
          conn.closed = true;
          this.conns.delete(conn);
          this.open--;
        };
        // The sender's FIN ends it: 'end' comes before 'close'.
        socket.on('end', closed);
        socket.on('close', () => {
          closed();
          this.sockets.delete(socket);
        });
      });
      await new Promise<void>((r) => server.listen(this.port, host, r));
      this.port = (server.address() as AddressInfo).port;
      this.servers.push(server);
    }
  }

  sample(on: boolean): void {
    if (this.sampler) clearInterval(this.sampler);
    this.sampler = null;
    this.maxOpen = 0;
    if (!on) return;
    this.sampler = setInterval(() => {
      const now = Date.now();
      let n = 0;
      for (const c of this.conns) if (now - c.openedAt >= 25) n++;
      this.maxOpen = Math.max(this.maxOpen, n);
    }, 10);
  }

  url(path: string, host = '127.0.0.1'): string {
    return `http://${host}:${this.port}${path}`;
  }

  at(path: string): Hit[] {
    return this.hits.filter((h) => h.path === path);
  }

  async stop(): Promise<void> {
    this.sample(false);
    for (const t of this.timers) clearInterval(t);
    for (const s of this.sockets) s.destroy();
    await Promise.all(this.servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
  }
}

/** What a receiver computes (README "Webhooks"): HMAC-SHA256 keyed by the base64 after whsec_. */
function verifies(secret: string, hit: Hit): boolean {
  const expected = 'v1,' + createHmac('sha256', Buffer.from(secret.slice('whsec_'.length), 'base64')).update(`${hit.id}.${hit.timestamp}.${hit.body}`).digest('base64');
  return hit.signatures.includes(expected);
}

const CREATE = `mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { endpoint { id } secret } }`;
const DELIVERIES = `query($f: WebhookDeliveryFilter) { webhookDeliveries(first: 100, filter: $f) { edges { node { id status attempts responseStatus lastError } } } }`;
const ALL = ['JOB_SUCCEEDED', 'JOB_FAILED', 'JOB_CANCELLED'];

async function createEndpoint(t: TestApp, key: string, url: string): Promise<{ id: string; secret: string }> {
  const r = await t.gql(CREATE, { i: { url, events: ALL } }, key);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return { id: r.body.data.createWebhookEndpoint.endpoint.id, secret: r.body.data.createWebhookEndpoint.secret };
}

async function submit(t: TestApp, key: string, tag = 'x'): Promise<string> {
  const r = await t.gql(`mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }`, { i: { api: 'emailvalidator', params: { email: 'jane@mailinator.com', tag } } }, key);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return r.body.data.submitJob.job.id;
}

async function deliveries(t: TestApp, key: string, filter: Record<string, unknown>): Promise<any[]> {
  const r = await t.gql(DELIVERIES, { f: filter }, key);
  assert.ok(r.body.data, JSON.stringify(r.body.errors));
  return r.body.data.webhookDeliveries.edges.map((e: { node: unknown }) => e.node);
}

/** A job's event row as the first claim would store it (so seeded deliveries POST without a job). */
const SEEDED_PAYLOAD = `jsonb_build_object('id', gen_random_uuid(), 'api', 'emailvalidator', 'params', jsonb_build_object('tag', 'seeded'),
  'priority', 'STANDARD', 'state', 'SUCCEEDED', 'idempotencyKey', null, 'attempts', 1, 'createdAt', now(), 'startedAt', now(),
  'finishedAt', now(), 'result', '{}'::jsonb, 'errorCode', null, 'errorMessage', null, 'httpStatus', 200, 'creditsBilled', 1)`;

describe('webhook sender limits (WEBHOOK_ALLOW_PRIVATE=true, receivers on 127.0.0.x)', () => {
  let t: TestApp;
  let sql: postgres.Sql;
  const rx = new Receivers();
  const capHosts = Array.from({ length: 8 }, (_, i) => `127.0.0.${i + 2}`);

  before(async () => {
    await rx.start(['127.0.0.1', ...capHosts]);
    t = await startTestApp({
      WEBHOOK_ALLOW_PRIVATE: 'true',
      WEBHOOK_POLL_MS: '100',
      WEBHOOK_RETRY_BASE_MS: '200',
      WEBHOOK_RETRY_MAX_MS: '400',
      WEBHOOK_TIMEOUT_MS: '1000',
      WEBHOOK_HEADERS_TIMEOUT_MS: '500',
      WEBHOOK_MAX_SOCKETS: '3',
      WEBHOOK_ENDPOINT_CONCURRENCY: '2',
      WEBHOOK_CONCURRENCY: '16',
      WEBHOOK_TENANT_DELIVERIES_PER_SECOND: '20',
      WEBHOOK_TENANT_DELIVERY_BURST: '10',
    });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
    await rx.stop();
  });

  test('a receiver that sends its headers and then trickles its body is cut at WEBHOOK_TIMEOUT_MS: the attempt failed (TIMEOUT) and is retried', async () => {
    const c = await t.createTenant('trickler', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/trickle'));
    rx.answers.set('/trickle', 'trickle');
    const jobId = await submit(t, c.apiKey);
    const [first] = await eventually(async () => {
      const d = await deliveries(t, c.apiKey, { jobId });
      return d[0]?.attempts >= 1 && d[0].lastError ? d : null;
    });
    assert.equal(first.status, 'PENDING', 'failed and waiting for its retry, not SUCCEEDED on the 200 of its headers');
    assert.match(first.lastError, /^TIMEOUT: the exchange did not end within 1000 ms/);
    assert.equal(first.responseStatus, null);
    // The sender closed the trickling connection at its total timeout (bounded: not for ever).
    await eventually(async () => rx.trickleClosedAfterMs.length >= 1);
    assert.ok(rx.trickleClosedAfterMs[0]! < 5_000, `closed after ${rx.trickleClosedAfterMs[0]} ms`);
    // The retry, to a receiver that now answers, delivers it.
    rx.answers.set('/trickle', 'ok');
    const [done] = await eventually(async () => {
      const d = await deliveries(t, c.apiKey, { jobId });
      return d[0]?.status === 'SUCCEEDED' ? d : null;
    });
    assert.ok(done.attempts >= 2);
    assert.ok(rx.at('/trickle').every((h) => verifies(hook.secret, h)));
  });

  test('a receiver that never answers fails at the headers timeout, and its connection is closed', async () => {
    const c = await t.createTenant('silent', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, rx.url('/silent'));
    rx.answers.set('/silent', 'silent');
    const jobId = await submit(t, c.apiKey);
    const [row] = await eventually(async () => {
      const d = await deliveries(t, c.apiKey, { jobId });
      return d[0]?.lastError ? d : null;
    });
    assert.match(row.lastError, /^TIMEOUT: no answer within 500 ms of connecting/);
    assert.equal(row.status, 'PENDING');
    await t.gql(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: hook.id }, c.apiKey);
  });

  test('the socket cap holds across host names: 8 hosts that never answer get at most WEBHOOK_MAX_SOCKETS connections at once, and every host is reached in turn', async () => {
    const c = await t.createTenant('many-hosts', 'ENTERPRISE');
    const hooks: Array<{ id: string }> = [];
    await eventually(async () => rx.open === 0, 10_000);
    try {
      rx.sample(true);
      for (const host of capHosts) {
        rx.answers.set(`/cap-${host}`, 'silent');
        hooks.push(await createEndpoint(t, c.apiKey, rx.url(`/cap-${host}`, host)));
      }
      await submit(t, c.apiKey);
      // Each attempt hangs until its headers timeout; the sockets go to the other hosts in turn.
      await eventually(async () => new Set(rx.hits.filter((h) => h.path.startsWith('/cap-')).map((h) => h.host)).size === capHosts.length, 30_000);
      
      assert.ok(rx.maxOpen <= 3, `${rx.maxOpen} connections open at once (cap 3)`);
      assert.ok(rx.maxOpen >= 2, 'several hosts were tried at once');
    } finally {
      rx.sample(false);
      for (const h of hooks) await t.gql(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: h.id }, c.apiKey);
    }
  });

  test('a tenant with thousands of waiting deliveries gets its budget, not the sender: another tenant\'s delivery goes out at once; the backlog shows on the endpoint', async () => {
    await eventually(async () => rx.open === 0, 10_000);
    const a = await t.createTenant('backlogged', 'ENTERPRISE');
    const b = await t.createTenant('punctual', 'PRO');
    const aHook = await createEndpoint(t, a.apiKey, rx.url('/backlog-a'));
    const bHook = await createEndpoint(t, b.apiKey, rx.url('/punctual-b'));
    const started = Date.now();
    await sql.unsafe(
      `insert into webhook_deliveries (tenant_id, endpoint_id, job_id, event, payload)
       select $1, $2, gen_random_uuid(), 'JOB_SUCCEEDED', ${SEEDED_PAYLOAD} from generate_series(1, 3000)`,
      [a.id, aHook.id],
    );
    await sql`select pg_notify('sluice_webhooks', '')`;
    await eventually(async () => rx.at('/backlog-a').length >= 1);
    const jobId = await submit(t, b.apiKey, 'b');
    await eventually(async () => rx.at('/punctual-b').some((h) => h.tenantTag === 'b' && verifies(bHook.secret, h)));
    const aBeforeB = rx.hits.findIndex((h) => h.path === '/punctual-b');
    const aSentBeforeB = rx.hits.slice(0, aBeforeB).filter((h) => h.path === '/backlog-a').length;
    const elapsedS = (Date.now() - started) / 1000;
    // A is held to its burst (10) plus 20 a second: far from its 3,000 (unbudgeted, the sender takes ~1,000 a second).
    assert.ok(aSentBeforeB <= 10 + 20 * elapsedS * 1.5 + 10, `${aSentBeforeB} of A's sent before B's one, in ${elapsedS.toFixed(1)} s`);
    const aSent = rx.at('/backlog-a').length;
    assert.ok(aSent <= 10 + 20 * ((Date.now() - started) / 1000) * 1.5 + 10, `${aSent} of A's sent in all`);
    assert.ok(aSent < 3000);
    // The backlog, visible on each endpoint.
    const list = `query { webhookEndpoints { id pendingDeliveries oldestPendingAt } }`;
    const [aEndpoint] = (await t.gql(list, {}, a.apiKey)).body.data.webhookEndpoints;
    assert.equal(aEndpoint.id, aHook.id);
    assert.ok(aEndpoint.pendingDeliveries > 2_000 && aEndpoint.pendingDeliveries <= 3_000, `${aEndpoint.pendingDeliveries} pending`);
    assert.ok(new Date(aEndpoint.oldestPendingAt).getTime() >= started - 60_000);
    const bEndpoint = await eventually(async () => {
      const [e] = (await t.gql(list, {}, b.apiKey)).body.data.webhookEndpoints;
      return e.pendingDeliveries === 0 ? e : null;
    });
    assert.equal(bEndpoint.oldestPendingAt, null);
    assert.equal((await deliveries(t, b.apiKey, { jobId }))[0].status, 'SUCCEEDED');
    await t.gql(`mutation($id: ID!) { deleteWebhookEndpoint(id: $id) }`, { id: aHook.id }, a.apiKey);
  });
});

describe('webhook claims, the endpoint limit and sealed secrets (an API-only process: no sender claims beside the test)', () => {
  let t: TestApp;
  let sql: postgres.Sql;

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api', WEBHOOK_MAX_ENDPOINTS: '10', WEBHOOK_SECRET_KEY: randomBytes(32).toString('base64') });
    sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await t.stop();
  });

  test('a claim goes round-robin across tenants within their allowances: one delivery of a quiet tenant is claimed beside another tenant\'s thousands', async () => {
    const a = await t.createTenant('claim-a', 'ENTERPRISE');
    const b = await t.createTenant('claim-b', 'PRO');
    const aHooks = [];
    for (let i = 0; i < 5; i++) aHooks.push(await createEndpoint(t, a.apiKey, `https://a${i}.example.com/hook`));
    const bHook = await createEndpoint(t, b.apiKey, 'https://b.example.com/hook');
    for (const h of aHooks) {
      await sql.unsafe(`insert into webhook_deliveries (tenant_id, endpoint_id, job_id, event, payload, next_attempt_at)
        select $1, $2, gen_random_uuid(), 'JOB_SUCCEEDED', ${SEEDED_PAYLOAD}, now() - interval '1 minute' from generate_series(1, 600)`, [a.id, h.id]);
    }
    // B's one delivery is the newest due of all.
    const [bRow] = await sql.unsafe(`insert into webhook_deliveries (tenant_id, endpoint_id, job_id, event, payload) values ($1, $2, gen_random_uuid(), 'JOB_SUCCEEDED', ${SEEDED_PAYLOAD}) returning id`, [b.id, bHook.id]);
    const claim = (limit: number, limited: Record<string, number> = {}) => claimDue(sql, { limit, perEndpoint: 16, claimSeconds: 60, finished: [], allowances: { fallback: 16, limited } });
    // Four slots: A's first turn (one delivery) and B's, before A's second and later turns.
    const first = await claim(4);
    assert.equal(first.length, 4);
    assert.ok(first.some((d) => d.id === bRow!.id), 'B\'s delivery is in the first claim');
    assert.equal(first.filter((d) => d.tenantId === a.id).length, 3);
    // A tenant out of budget gets nothing; one with 2 left gets 2.
    assert.deepEqual(await claim(50, { [a.id]: 0 }), []);
    const two = await claim(50, { [a.id]: 2 });
    assert.equal(two.length, 2);
    assert.ok(two.every((d) => d.tenantId === a.id));
    // Secrets come back sealed; the sender opens them.
    assert.ok(first.every((d) => d.secrets.every((s) => s.startsWith('v1:'))));
  });

  test('20 parallel createWebhookEndpoint over HTTP leave exactly WEBHOOK_MAX_ENDPOINTS; the others get TOO_MANY_WEBHOOK_ENDPOINTS', async () => {
    const c = await t.createTenant('racer', 'PRO');
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => t.gql(CREATE, { i: { url: `https://race${i}.example.com/hook`, events: ALL } }, c.apiKey)));
    const made = results.filter((r) => r.body.data?.createWebhookEndpoint);
    const refused = results.filter((r) => r.body.errors?.[0]?.extensions?.code === 'TOO_MANY_WEBHOOK_ENDPOINTS');
    assert.equal(made.length, 10);
    assert.equal(refused.length, 10);
    assert.ok(refused.every((r) => r.body.errors[0].extensions.max === 10));
    const [row] = await sql`select count(*)::int as n from webhook_endpoints where tenant_id = ${c.id}`;
    assert.equal(row!.n, 10);
  });

  test('the database holds no plaintext signing secret: created and rotated secrets are sealed (v1:<keyId>:…)', async () => {
    const c = await t.createTenant('sealed', 'PRO');
    const hook = await createEndpoint(t, c.apiKey, 'https://sealed.example.com/hook');
    const rotated = await t.gql(`mutation($id: ID!) { rotateWebhookSecret(id: $id) { secret } }`, { id: hook.id }, c.apiKey);
    const fresh = rotated.body.data.rotateWebhookSecret.secret as string;
    const rows = await sql`select secret, previous_secret from webhook_endpoints`;
    assert.ok(rows.length > 0);
    for (const r of rows) {
      for (const v of [r.secret, r.previous_secret].filter((x) => x !== null)) {
        assert.match(v, /^v1:[0-9a-f]{8}:/);
        assert.ok(!v.includes('whsec_'), 'no plaintext secret');
      }
    }
    const all = JSON.stringify(rows);
    for (const s of [hook.secret, fresh]) assert.ok(!all.includes(s.slice('whsec_'.length)), 'neither secret appears in any form the API gave it');
  });
});

describe('webhook errors without WEBHOOK_ALLOW_PRIVATE', () => {
  let t: TestApp;

  before(async () => {
    t = await startTestApp({ WEBHOOK_POLL_MS: '100', WEBHOOK_RETRY_BASE_MS: '200' });
  });
  after(async () => {
    await t.stop();
  });

  test('lastError says the host resolves to a private or special-use address, without the address', async () => {
    const c = await t.createTenant('prober', 'PRO');
    await createEndpoint(t, c.apiKey, 'https://localhost:9/internal');
    const jobId = await submit(t, c.apiKey);
    const [row] = await eventually(async () => {
      const d = await deliveries(t, c.apiKey, { jobId });
      return d[0]?.lastError ? d : null;
    });
    assert.equal(row.lastError, 'ADDRESS_REFUSED: localhost: the host resolves to a private or special-use address');
    assert.doesNotMatch(row.lastError, /127\.0\.0\.1|::1|\d+\.\d+\.\d+\.\d+/);
  });
});

describe('sealed secrets across restarts: a stored key, legacy plaintext rows, WEBHOOK_SECRET_KEY and its rotation', () => {
  const rx = new Receivers();
  let db: { url: string; drop(): Promise<void> };
  let sql: postgres.Sql;
  const k2 = randomBytes(32);
  const k3 = randomBytes(32);
  const base = { WEBHOOK_ALLOW_PRIVATE: 'true', WEBHOOK_POLL_MS: '100', WEBHOOK_RETRY_BASE_MS: '200' };

  before(async () => {
    await rx.start(['127.0.0.1']);
    db = await createTestDatabase();
    sql = postgres(db.url, { max: 2, onnotice: () => {} });
  });
  after(async () => {
    await sql.end();
    await rx.stop();
    await db.drop();
  });

  async function secretsAt(): Promise<string[]> {
    const rows = await sql`select secret, previous_secret from webhook_endpoints order by id`;
    return rows.flatMap((r) => [r.secret, r.previous_secret]).filter((v): v is string => v !== null);
  }

  test('each start seals what is not sealed under its key, and deliveries verify with the secrets the API returned', async () => {
    // 1. No configuration: a key is generated and stored; a legacy plaintext row is sealed at the next start.
    let t = await startTestApp({ ...base, DATABASE_URL: db.url });
    const tenant = await t.createTenant('restarts', 'PRO');
    const sealedHook = await createEndpoint(t, tenant.apiKey, rx.url('/sealed'));
    const legacyHook = await createEndpoint(t, tenant.apiKey, rx.url('/legacy'));
    const [stored] = await sql`select value from settings where key = 'webhook_secret_key'`;
    assert.ok(stored, 'the generated key is stored in settings');
    assert.ok((await secretsAt()).every((s) => s.startsWith(`v1:${keyId(Buffer.from(stored!.value, 'base64'))}:`)));
    const legacySecret = `whsec_${randomBytes(32).toString('base64')}`;
    await sql`update webhook_endpoints set secret = ${legacySecret} where id = ${legacyHook.id}`;
    await t.stop();

    const deliveredAndVerified = async (app: TestApp) => {
      const n = rx.hits.length;
      await submit(app, tenant.apiKey);
      await eventually(async () => rx.hits.length >= n + 2);
      const fresh = rx.hits.slice(n);
      assert.ok(fresh.find((h) => h.path === '/sealed' && verifies(sealedHook.secret, h)), 'the sealed secret signs');
      assert.ok(fresh.find((h) => h.path === '/legacy' && verifies(legacySecret, h)), 'the legacy secret signs');
    };

    // 2. WEBHOOK_SECRET_KEY set: the stored key still opens the rows it sealed; everything is resealed under the new key.
    t = await startTestApp({ ...base, DATABASE_URL: db.url, WEBHOOK_SECRET_KEY: k2.toString('hex') });
    assert.ok((await secretsAt()).every((s) => s.startsWith(`v1:${keyId(k2)}:`) && !s.includes('whsec_')), 'all sealed under WEBHOOK_SECRET_KEY');
    await deliveredAndVerified(t);
    await t.stop();

    // 3. Rotation: the new key seals, the previous one opens until the start's pass resealed everything.
    t = await startTestApp({ ...base, DATABASE_URL: db.url, WEBHOOK_SECRET_KEY: k3.toString('base64'), WEBHOOK_SECRET_KEY_PREVIOUS: k2.toString('base64') });
    assert.ok((await secretsAt()).every((s) => s.startsWith(`v1:${keyId(k3)}:`)), 'all resealed under the new key');
    await deliveredAndVerified(t);
    await t.stop();
  });
});
