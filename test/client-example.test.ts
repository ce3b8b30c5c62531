/**
 * examples/client against a live Sluice: it submits jobs into a queue bound of
 * 1 (so some submissions meet QUEUE_FULL and wait out Retry-After), follows
 * each through jobUpdated to SUCCEEDED, and reads me { usage }. Its typed
 * documents are checked by `npm run typecheck`; here, that their generated
 * schema types are not stale.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { queueFullDelaySeconds } from '../examples/client/retry.ts';
import { startTestApp, type TestApp } from './helpers/app.ts';

const root = path.dirname(path.dirname(new URL(import.meta.url).pathname));

function run(cmd: string, args: string[], env: Record<string, string> = {}): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.on('exit', (code) => resolve({ code: code ?? 1, out }));
  });
}

test('queueFullDelaySeconds: Retry-After first, then extensions, only for QUEUE_FULL', () => {
  const full = [{ message: 'full', extensions: { code: 'QUEUE_FULL', retryAfterSeconds: 7 } }];
  assert.equal(queueFullDelaySeconds(429, '3', full), 3);
  assert.equal(queueFullDelaySeconds(429, null, full), 7);
  assert.equal(queueFullDelaySeconds(429, 'Wed, 21 Oct 2015 07:28:00 GMT', full), 7);
  assert.equal(queueFullDelaySeconds(429, '0', full), 1);
  assert.equal(queueFullDelaySeconds(400, null, [{ message: 'x', extensions: { code: 'UNKNOWN_API' } }]), null);
  assert.equal(queueFullDelaySeconds(200, null, undefined), null);
});

test('the generated schema types (graphql-env.d.ts) match schema/schema.graphql', async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'sluice-tada-'));
  try {
    const out = path.join(dir, 'graphql-env.d.ts');
    const r = await run(path.join(root, 'node_modules', '.bin', 'gql.tada'), ['generate-output', '-c', 'examples/client/tsconfig.json', '-o', out]);
    assert.equal(r.code, 0, r.out);
    assert.equal(readFileSync(out, 'utf8'), readFileSync(path.join(root, 'examples/client/graphql-env.d.ts'), 'utf8'), 'run npm run example:client:types');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

describe('examples/client against a live Sluice', () => {
  let t: TestApp;
  before(async () => {
    // Calls take 0.5 s, the tenant has one call in flight and room for one waiting job.
    t = await startTestApp({}, { simulator: { conditions: { latencyMs: 500, latencyP95Ms: 500 } } });
  });
  after(async () => {
    await t?.stop();
  });

  test('submits, honours Retry-After on QUEUE_FULL, waits through jobUpdated, reads usage', async () => {
    const tenant = await t.createTenant('example-co');
    const r = await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, concurrencyCap: 1, queueBound: 1 } });
    assert.equal(r.body.errors, undefined);
    const res = await run(process.execPath, ['examples/client/main.ts', '--count', '4', '--api', 'exchangerate', '--param', 'currency1=USD', '--param', 'currency2=EUR'], {
      SLUICE_URL: t.url,
      SLUICE_KEY: tenant.apiKey,
    });
    assert.equal(res.code, 0, res.out);
    assert.match(res.out, /QUEUE_FULL \(HTTP 429\): retrying in \d+ s/);
    assert.equal(res.out.match(/^submitted exchangerate job /gm)?.length, 4, res.out);
    assert.equal(res.out.match(/^job \S+ SUCCEEDED$/gm)?.length, 4, res.out);
    assert.match(res.out, /example-co: 4 of \d+ credits used/);
    assert.match(res.out, /all jobs SUCCEEDED/);
  });
});
