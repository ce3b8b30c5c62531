/**
 * The console at /console in real Chromium, against a real Sluice (in-process,
 * simulator over HTTP): the operator sees the windows move as jobs run and
 * creates a tenant; a tenant submits a job from the form and watches it go
 * QUEUED → SUCCEEDED without a reload; neither view scrolls sideways at 390 px;
 * nothing is fetched from outside 127.0.0.1.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import type { Page } from 'playwright-core';
import { ADMIN_TOKEN, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { browserAvailable, launch, screenshot, scrollsSideways, SKIP_MESSAGE, type Browsing } from './helpers/browser.ts';

const available = browserAvailable();

describe('console', { skip: available ? false : SKIP_MESSAGE }, () => {
  let t: TestApp;
  let b: Browsing;
  let origin: string;

  before(async () => {
    // Slow calls (0.8 s) so a job is seen waiting before it runs.
    t = await startTestApp({}, { simulator: { conditions: { latencyMs: 800, latencyP95Ms: 800 } } });
    origin = new URL(t.url).origin;
    b = await launch();
  });
  after(async () => {
    await b?.close();
    await t?.stop();
  });

  async function signIn(page: Page, token: string): Promise<void> {
    await page.goto(`${origin}/console`);
    await page.getByLabel('Token').fill(token);
    await page.getByRole('button', { name: 'Sign in' }).click();
  }

  test('serves the page, its modules and nothing else under /console', async () => {
    for (const p of ['/console/', '/console/app.js', '/console/vendor/preact.js', '/console/vendor/graphql-ws/client.js', '/console/vendor/uplot.css']) {
      const res = await fetch(`${origin}${p}`);
      assert.equal(res.status, 200, p);
      await res.arrayBuffer();
    }
    const page = await fetch(`${origin}/console/`);
    assert.match(page.headers.get('content-security-policy') ?? '', /default-src 'self'/);
    for (const p of ['/console/../package.json', '/console/vendor/graphql-ws/../../package.json', '/console/vendor/nope.js', '/console/%2e%2e/package.json']) {
      assert.equal((await fetch(`${origin}${p}`)).status === 200, false, p);
    }
  });

  test('an operator sees the windows change as jobs run, and creates a tenant', async () => {
    const page = await b.page();
    await signIn(page, ADMIN_TOKEN);
    const windows = page.getByTestId('windows');
    await windows.waitFor();
    await page.getByText('● live').waitFor();
    const before = await windows.locator('tbody').innerText();

    const tenant = await t.createTenant('busy-co');
    const jobs = Array.from({ length: 12 }, (_, i) => ({ api: 'dnslookup', params: { domain: `d${i}.example` }, priority: 'STANDARD' }));
    const r = await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, tenant.apiKey);
    assert.equal(r.body.errors, undefined);

    // Calls/s, tokens or busy move on the page, pushed by systemStatus (no reload).
    await eventually(async () => (await windows.locator('tbody').innerText()) !== before, 30_000);
    await eventually(async () => Number((await windows.getByTestId('calls').first().innerText()).replace(/[^0-9.]/g, '')) > 0, 30_000);
    await page.getByRole('figure', { name: /calls\/s vs paced rate/ }).first().waitFor();

    await page.getByLabel('New tenant name').fill('console-made');
    await page.getByRole('button', { name: 'Create tenant' }).click();
    const key = (await page.getByTestId('new-key').innerText()).trim();
    assert.match(key, /^slc_/);
    const me = await t.gql('{ me { tenant { name } } }', {}, key);
    assert.equal(me.body.data.me.tenant.name, 'console-made');
    await page.getByTestId('tenants').getByRole('rowheader', { name: 'console-made' }).waitFor();
    assert.equal(await scrollsSideways(page), false, 'the operator view scrolls sideways at 1280 px');
    await screenshot(page, 'operator');

    // Change its limits, then rotate its key (confirming the dialog): the old key stops working.
    await page.getByRole('button', { name: 'Done' }).click();
    await page.getByRole('button', { name: 'Change limits of console-made' }).click();
    await page.getByLabel('Concurrency cap').fill('3');
    await page.getByRole('button', { name: 'Save limits' }).click();
    await eventually(async () => {
      const r = await t.gql('{ tenants { name concurrencyCap } }');
      return r.body.data.tenants.find((x: { name: string }) => x.name === 'console-made')?.concurrencyCap === 3;
    });
    page.once('dialog', (d) => void d.accept());
    await page.getByRole('button', { name: 'Rotate the key of console-made' }).click();
    const rotated = (await page.getByTestId('new-key').innerText()).trim();
    assert.notEqual(rotated, key);
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, key)).status, 401);
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, rotated)).body.data.me.tenant.name, 'console-made');

    assert.deepEqual(b.outside, []);
  });

  test('a tenant submits a job from the form and sees it go QUEUED → SUCCEEDED without a reload', async () => {
    const tenant = await t.createTenant('form-co');
    // Cap 1 and four 0.8 s jobs ahead of it: the form's job waits its turn, visibly QUEUED.
    await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, concurrencyCap: 1 } });
    const ahead = [1, 2, 3, 4].map((i) => ({ api: 'dnslookup', params: { domain: `ahead${i}.example` } }));
    await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs: ahead } }, tenant.apiKey);

    const page = await b.page();
    await signIn(page, tenant.apiKey);
    await page.getByTestId('usage').waitFor();
    await page.getByText('● live').waitFor();
    await page.getByLabel('API').selectOption('emailvalidator');
    await page.getByLabel('email', { exact: true }).fill('jane@mailinator.com');
    await page.getByLabel('Priority').selectOption('BULK');
    // Record every state each job's row shows, as it changes.
    await page.evaluate(() => {
      const seen: Record<string, string[]> = {};
      (window as unknown as { seen: typeof seen }).seen = seen;
      new MutationObserver(() => {
        for (const row of document.querySelectorAll('[data-testid="jobs"] tbody tr[data-job]')) {
          const id = row.getAttribute('data-job')!;
          const text = row.querySelector('[data-testid="state"]')?.textContent?.trim();
          const list = (seen[id] ??= []);
          if (text && list[list.length - 1] !== text) list.push(text);
        }
      }).observe(document.body, { subtree: true, childList: true, characterData: true });
    });
    const navigations: string[] = [];
    page.on('framenavigated', (f) => navigations.push(f.url()));
    await page.getByRole('button', { name: 'Submit job' }).click();
    const note = await page.getByText(/^Job .* is QUEUED\.$/).innerText();
    const id = /^Job (\S+) is/.exec(note)![1]!;
    const first = page.getByTestId('jobs').locator(`tbody tr[data-job="${id}"]`);
    await first.getByText('SUCCEEDED').waitFor({ timeout: 60_000 });
    const seen = (await page.evaluate(() => (window as unknown as { seen: Record<string, string[]> }).seen))[id!] ?? [];
    assert.equal(seen[0], 'QUEUED', `states seen: ${seen.join(' → ')}`);
    assert.equal(seen[seen.length - 1], 'SUCCEEDED', `states seen: ${seen.join(' → ')}`);
    const job = await t.gql('query($id: ID!) { job(id: $id) { state params } }', { id }, tenant.apiKey);
    assert.equal(job.body.data.job.state, 'SUCCEEDED');
    assert.deepEqual(job.body.data.job.params, { email: 'jane@mailinator.com' });
    assert.deepEqual(navigations, [], 'the page did not reload');

    await first.getByRole('button', { name: /Details of job/ }).click();
    await page.getByTestId('job-detail').getByText('"hasTypo"', { exact: false }).waitFor();
    assert.equal(await scrollsSideways(page), false, 'the tenant view scrolls sideways at 1280 px');
    await screenshot(page, 'tenant');
    assert.deepEqual(b.outside, []);
  });

  test('at phone width (390 px) neither view scrolls sideways', async () => {
    const tenant = await t.createTenant('phone-co');
    for (const [token, name] of [
      [ADMIN_TOKEN, 'operator-phone'],
      [tenant.apiKey, 'tenant-phone'],
    ] as const) {
      const page = await b.page({ width: 390, height: 844 });
      await signIn(page, token);
      await page.getByText('● live').waitFor();
      await page.locator(name.startsWith('operator') ? '[data-testid="windows"]' : '[data-testid="usage"]').waitFor();
      await page.getByRole('heading', { name: name.startsWith('operator') ? 'Tenants' : 'Recent jobs' }).waitFor();
      await page.waitForTimeout(300); // let charts and tables lay out
      assert.equal(await scrollsSideways(page), false, `${name} scrolls sideways`);
      await screenshot(page, name);
    }
    assert.deepEqual(b.outside, []);
  });

  test('a banner shows while the live connection is reconnecting', async () => {
    const page = await b.page();
    // Every socket passes through the test, which can cut it as a network failure would.
    const sockets: Array<{ close(o?: { code?: number; reason?: string }): Promise<void> }> = [];
    let refuse = false;
    await page.routeWebSocket(/\/graphql$/, (ws) => {
      if (refuse) return void ws.close({ code: 1012, reason: 'test: server unreachable' });
      ws.connectToServer();
      sockets.push(ws);
    });
    await signIn(page, ADMIN_TOKEN);
    await page.getByText('● live').waitFor();
    assert.equal(await page.getByTestId('reconnecting').count(), 0);
    refuse = true;
    for (const ws of sockets) await ws.close({ code: 1012, reason: 'test: connection lost' });
    await page.getByTestId('reconnecting').getByText(/reconnecting/).waitFor({ timeout: 30_000 });
    await screenshot(page, 'operator-reconnecting');
    refuse = false;
    await page.getByText('● live').waitFor({ timeout: 30_000 });
    await page.getByTestId('reconnecting').waitFor({ state: 'detached' });
    assert.deepEqual(b.outside, []);
  });

  test('sign-out forgets the token; a wrong token is refused on the page', async () => {
    const page = await b.page();
    // By keyboard alone: the token field takes focus by Tab, Enter submits.
    await page.goto(`${origin}/console`);
    await page.getByLabel('Token').waitFor();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'token');
    await page.keyboard.type(ADMIN_TOKEN);
    await page.keyboard.press('Enter');
    await page.getByRole('button', { name: 'Sign out' }).waitFor();
    await page.getByRole('button', { name: 'Sign out' }).click();
    await signIn(page, 'slc_not_a_key');
    await page.getByRole('alert').getByText(/not valid/).waitFor();
    await signIn(page, ADMIN_TOKEN);
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('Token').waitFor();
    assert.equal(await page.evaluate(() => sessionStorage.getItem('sluice.token')), null);
    assert.deepEqual(b.outside, []);
  });
});
