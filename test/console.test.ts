/**
 * The console at /console in real Chromium, against a real Sluice (in-process,
 * simulator over HTTP): the operator sees the health strip and the windows move
 * as jobs run (pace used, charts from the server's history with ranges),
 * creates a tenant, finds a job by key and retries it, opens a tenant's page
 * (usage chart, CSV, quota meter thresholds) and suspends, resumes and deletes
 * it through inline confirmations; a tenant submits a job from the form and
 * follows it live in the note, the table and the detail, filters and pages its
 * jobs and retries a failed one; the operator manages a tenant's API keys and
 * re-enables its failed webhook endpoint from the tenant's page, and sees the
 * learned pace and the fairness lag; a tenant manages its own keys and webhook
 * endpoints; every view works at 1280 px and at 390 px without scrolling
 * sideways; nothing is fetched from outside 127.0.0.1.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import type { Locator, Page } from 'playwright-core';
import { ADMIN_TOKEN, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { browserAvailable, launch, screenshot, scrollsSideways, SKIP_MESSAGE, type Browsing } from './helpers/browser.ts';

const available = browserAvailable();

/** The element takes focus (the console moves it in an effect after the render that shows it, so a frame later). */
async function hasFocus(el: Locator, what: string): Promise<void> {
  await el.waitFor();
  await eventually(async () => el.evaluate((e) => e === document.activeElement), 5_000, 20).catch(() => assert.fail(what));
}

describe('console', { skip: available ? false : SKIP_MESSAGE }, () => {
  let t: TestApp;
  let b: Browsing;
  let origin: string;
  // A webhook receiver on 127.0.0.1: answers each path with the status set for it (200 unless set).
  const answers = new Map<string, number>();
  const received: string[] = [];
  const receiver = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      received.push(req.url!);
      res.writeHead(answers.get(req.url!) ?? 200).end();
    });
  });
  let hooks: string;

  before(async () => {
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
    hooks = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
    // Slow calls (0.8 s) so a job is seen waiting before it runs. Webhooks may go to the local
    // receiver, and an endpoint failing for a second is disabled (retried every 0.2 s till then).
    t = await startTestApp(
      { WEBHOOK_ALLOW_PRIVATE: 'true', WEBHOOK_DISABLE_AFTER_SECONDS: '1', WEBHOOK_RETRY_BASE_MS: '200', WEBHOOK_POLL_MS: '100' },
      { simulator: { conditions: { latencyMs: 800, latencyP95Ms: 800 } } },
    );
    origin = new URL(t.url).origin;
    b = await launch();
  });
  after(async () => {
    await b?.close();
    await t?.stop();
    receiver.closeAllConnections();
    await new Promise<void>((r) => receiver.close(() => r()));
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
    // "pace used N% (x of y calls/s)": the calls move, against the paced rate.
    await eventually(async () => Number(/\(([0-9.]+) of [0-9.]+ calls\/s\)/.exec(await windows.getByTestId('calls').first().innerText())?.[1] ?? 0) > 0, 30_000);
    assert.match(await windows.getByTestId('calls').first().innerText(), /^pace used \d+% \([0-9.]+ of [0-9.]+ calls\/s\)$/);
    // One verdict of health, with its reason.
    await page.getByTestId('health').getByRole('heading', { name: /Healthy|Degraded/ }).waitFor();
    // Charts come from the server's history: a summary in words, units on the axes, UTC; ranges switch.
    const chart = page.getByRole('figure', { name: /calls\/s vs paced rate \(15 min\)/ }).first();
    await chart.waitFor({ timeout: 30_000 });
    assert.match(await chart.getByTestId('chart-summary').innerText(), /^Last 15 min: [0-9.]+ calls\/s on average, peak [0-9.]+/);
    assert.match(await page.getByRole('group', { name: 'Chart range' }).innerText(), /times in UTC/);
    await page.getByRole('button', { name: '1 h', exact: true }).click();
    await page.getByRole('figure', { name: /calls\/s vs paced rate \(1 h\)/ }).first().waitFor();
    assert.equal(await page.getByRole('button', { name: '1 h', exact: true }).getAttribute('aria-pressed'), 'true');
    // Resume is offered only while dispatch is stopped.
    assert.equal(await page.getByRole('button', { name: /Resume dispatch/ }).count(), 0);
    const history = await t.gql('{ systemHistory(range: MINUTES_15) { window points { at callsPerSecond } } }');
    assert.ok(history.body.data.systemHistory.some((w: { points: unknown[] }) => w.points.length > 0), JSON.stringify(history.body));

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
    // An inline confirmation, not confirm(): it takes focus; Cancel leaves the key alone.
    page.on('dialog', (d) => assert.fail(`a browser dialog opened: ${d.message()}`));
    await page.getByRole('button', { name: 'Rotate the key of console-made' }).click();
    const ask = page.getByRole('alertdialog', { name: /Rotate the key of console-made/ });
    await ask.waitFor();
    await hasFocus(ask, 'focus moves into the confirmation');
    await ask.getByRole('button', { name: 'Cancel' }).click();
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, key)).status, 200);
    await page.getByRole('button', { name: 'Rotate the key of console-made' }).click();
    await page.getByRole('alertdialog').getByRole('button', { name: 'Rotate key' }).click();
    const rotated = (await page.getByTestId('new-key').innerText()).trim();
    assert.notEqual(rotated, key);
    // The old key keeps working through the overlap, now with an expiry.
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, key)).status, 200);
    const listed = await t.gql('{ apiKeys { prefix expiresAt revokedAt } }', {}, rotated);
    assert.equal(listed.body.data.apiKeys.filter((k: { expiresAt: string | null }) => k.expiresAt !== null).length, 1, JSON.stringify(listed.body));
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, rotated)).body.data.me.tenant.name, 'console-made');

    assert.deepEqual(b.outside, []);
  });

  test('a tenant submits a job from the form and sees it go QUEUED → SUCCEEDED without a reload', async () => {
    const tenant = await t.createTenant('form-co');
    // Cap 1 and eight 0.8 s jobs ahead of it: the form's job waits its turn, visibly QUEUED.
    await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, concurrencyCap: 1 } });
    const ahead = [1, 2, 3, 4, 5, 6, 7, 8].map((i) => ({ api: 'dnslookup', params: { domain: `ahead${i}.example` } }));
    await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs: ahead } }, tenant.apiKey);

    const page = await b.page();
    await signIn(page, tenant.apiKey);
    await page.getByTestId('usage').waitFor();
    await page.getByText('● live').waitFor();
    await page.getByText(/^Page 1 · \d+ jobs?$/).waitFor();
    const form = page.getByRole('region', { name: 'Submit a job' });
    await form.getByLabel('API').selectOption('emailvalidator');
    await form.getByLabel('email', { exact: true }).fill('jane@mailinator.com');
    await form.getByLabel('Priority').selectOption('BULK');
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
    // The tenant is suspended while the job waits, so it stays QUEUED (held) however slow this
    // machine is; the detail, opened then, takes focus and follows the job live (jobUpdated) once
    // the tenant is resumed.
    await t.gql('mutation($id: ID!) { suspendTenant(id: $id) { id } }', { id: tenant.id });
    await first.getByRole('button', { name: /Details of job/ }).click();
    const detail = page.getByTestId('job-detail');
    await detail.getByTestId('detail-state').getByText(/QUEUED|RUNNING/).waitFor();
    await hasFocus(detail, 'focus moves into the job detail');
    await t.gql('mutation($id: ID!) { resumeTenant(id: $id) { id } }', { id: tenant.id });
    await first.getByText('SUCCEEDED').waitFor({ timeout: 60_000 });
    await detail.getByTestId('detail-state').getByText('SUCCEEDED').waitFor({ timeout: 30_000 });
    // The submit note follows the job too.
    await page.getByTestId('submit-note').getByText(`Job ${id} is SUCCEEDED.`).waitFor({ timeout: 30_000 });
    const seen = (await page.evaluate(() => (window as unknown as { seen: Record<string, string[]> }).seen))[id!] ?? [];
    assert.equal(seen[0], 'QUEUED', `states seen: ${seen.join(' → ')}`);
    assert.equal(seen[seen.length - 1], 'SUCCEEDED', `states seen: ${seen.join(' → ')}`);
    const job = await t.gql('query($id: ID!) { job(id: $id) { state params } }', { id }, tenant.apiKey);
    assert.equal(job.body.data.job.state, 'SUCCEEDED');
    assert.deepEqual(job.body.data.job.params, { email: 'jane@mailinator.com' });
    assert.deepEqual(navigations, [], 'the page did not reload');

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
      await page.getByRole('heading', { name: name.startsWith('operator') ? 'Tenants' : 'Your jobs' }).waitFor();
      await page.waitForTimeout(300); // let charts and tables lay out
      assert.equal(await scrollsSideways(page), false, `${name} scrolls sideways`);
      await screenshot(page, name);
    }
    assert.deepEqual(b.outside, []);
  });

  test('a tenant filters and pages its jobs and retries a failed one, at 1280 px and 390 px', async () => {
    const tenant = await t.createTenant('jobs-co');
    // 21 jobs (a page is 20): one fails upstream (the simulator answers 400 to a malformed domain), one carries a key.
    const jobs = [
      { api: 'dnslookup', params: { domain: 'not a domain' }, priority: 'INTERACTIVE', idempotencyKey: 'invoice-9' },
      ...Array.from({ length: 20 }, (_, i) => ({ api: 'dnslookup', params: { domain: `j${i}.example` }, priority: 'BULK' })),
    ];
    const r = await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, tenant.apiKey);
    const failedId = r.body.data.submitJobs.jobs[0].id;
    await eventually(async () => (await t.gql('query($id: ID!) { job(id: $id) { state } }', { id: failedId }, tenant.apiKey)).body.data.job.state === 'FAILED', 60_000);

    let total = 21; // the retry adds one
    for (const [width, height, shot] of [[1280, 800, 'tenant-jobs'], [390, 844, 'tenant-jobs-phone']] as const) {
      const page = await b.page({ width, height });
      await signIn(page, tenant.apiKey);
      const table = page.getByTestId('jobs');
      await table.locator('tbody tr').first().waitFor();
      // Paging: 21 jobs, 20 a page.
      await page.getByText(`Page 1 · ${total} jobs`).waitFor();
      await page.getByRole('button', { name: 'Next' }).click();
      await page.getByText(`Page 2 · ${total} jobs`).waitFor();
      assert.equal(await table.locator('tbody tr').count(), total - 20);
      await page.getByRole('button', { name: 'Previous' }).click();
      await page.getByText(`Page 1 · ${total} jobs`).waitFor();
      // Filters: by state, then by idempotency key.
      await page.getByLabel('Job state').selectOption('FAILED');
      const failedCount = total - 20; // the first job and, after the retry, its retry
      await page.getByText(`Page 1 · ${failedCount} job${failedCount === 1 ? '' : 's'}`, { exact: true }).waitFor();
      assert.ok((await table.locator('tbody tr').evaluateAll((rows) => rows.map((x) => x.getAttribute('data-job')))).includes(failedId));
      if (width === 1280) {
        // Retry the failed job from the filtered list: a new job linked to it is submitted, and runs.
        await table.getByRole('button', { name: `Retry job ${failedId}` }).click();
        const retried = await page.getByTestId('jobs-note').getByText(/retried as job/).innerText();
        const newId = /retried as job (\S+) /.exec(retried)![1]!;
        total += 1;
        const again = await t.gql('query($id: ID!) { job(id: $id) { retryOf api params } }', { id: newId }, tenant.apiKey);
        assert.equal(again.body.data.job.retryOf, failedId);
        assert.deepEqual(again.body.data.job.params, { domain: 'not a domain' });
        // Once it fails too, the filtered list shows it, marked as a retry.
        await eventually(async () => (await t.gql('query($id: ID!) { job(id: $id) { state } }', { id: newId }, tenant.apiKey)).body.data.job.state === 'FAILED', 60_000);
        await page.getByLabel('Job state').selectOption('');
        await page.getByLabel('Job state').selectOption('FAILED');
        await table.locator(`tbody tr[data-job="${newId}"]`).getByText(`retry of ${failedId.slice(0, 8)}…`).waitFor();
      }
      await page.getByLabel('Job state').selectOption('');
      await page.getByLabel('Idempotency key').fill('invoice-9');
      await page.getByRole('button', { name: 'Filter' }).click();
      await page.getByText('Page 1 · 1 job', { exact: true }).waitFor();
      await table.getByText('key invoice-9').waitFor();
      await page.getByLabel('Idempotency key').fill('');
      await page.getByRole('button', { name: 'Filter' }).click();
      await page.getByText(/Page 1 · 2\d jobs/).waitFor();
      assert.equal(await scrollsSideways(page), false, `${shot} scrolls sideways`);
      await screenshot(page, shot);
    }
    assert.deepEqual(b.outside, []);
  });

  test('an operator finds a job by key, retries it, and opens, suspends, resumes and deletes its tenant, at 1280 px and 390 px', async () => {
    const tenant = await t.createTenant('page-co');
    // Quota 4 credits and three 1-credit jobs: 75 % used, the meter turns amber.
    await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: tenant.id, monthlyQuota: 4 } });
    const jobs = [
      { api: 'dnslookup', params: { domain: 'bad domain' }, idempotencyKey: 'shipment-42' },
      ...[1, 2, 3].map((i) => ({ api: 'dnslookup', params: { domain: `p${i}.example` } })),
    ];
    const r = await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, tenant.apiKey);
    const ids: string[] = r.body.data.submitJobs.jobs.map((j: { id: string }) => j.id);
    await eventually(async () => {
      const d = await t.gql('{ jobs { edges { node { state } } } }', {}, tenant.apiKey);
      return d.body.data.jobs.edges.every((e: { node: { state: string } }) => ['SUCCEEDED', 'FAILED'].includes(e.node.state));
    }, 60_000);

    // Phone width first: the wide pass ends by deleting the tenant.
    for (const [width, height, shot] of [[390, 844, 'operator-tenant-phone'], [1280, 800, 'operator-tenant']] as const) {
      const page = await b.page({ width, height });
      page.on('dialog', (d) => assert.fail(`a browser dialog opened: ${d.message()}`));
      await signIn(page, ADMIN_TOKEN);
      await page.getByTestId('health').waitFor();
      // Search across tenants by idempotency key; the hit names its tenant.
      await page.getByLabel('Job id or idempotency key').fill('shipment-42');
      await page.getByRole('button', { name: 'Find', exact: true }).click();
      const hits = page.getByTestId('search-results');
      await hits.locator(`tr[data-job="${ids[0]}"]`).getByText('FAILED').waitFor();
      if (width === 1280) {
        await hits.getByRole('button', { name: `Retry job ${ids[0]}` }).click();
        await page.getByText(new RegExp(`Job ${ids[0]} retried as job`)).waitFor();
        const mine = await t.gql('{ jobs(first: 10) { edges { node { retryOf } } } }', {}, tenant.apiKey);
        assert.ok(mine.body.data.jobs.edges.some((e: { node: { retryOf: string | null } }) => e.node.retryOf === ids[0]));
      }
      // Open its tenant: the page takes focus, shows queues, failed and recent jobs, the usage chart and meter.
      await hits.getByRole('button', { name: 'page-co' }).first().click();
      const panel = page.getByTestId('tenant-page');
      await panel.getByRole('heading', { name: /Tenant page-co/ }).waitFor();
      await hasFocus(panel, 'focus moves into the tenant page');
      await panel.getByTestId('tenant-queues').waitFor();
      await panel.getByTestId('tenant-failed').locator(`tr[data-job="${ids[0]}"]`).waitFor();
      await panel.getByTestId('tenant-jobs').locator('tbody tr').first().waitFor();
      await panel.getByText(/over 75%/).first().waitFor();
      await panel.getByRole('figure', { name: /credits billed per day/ }).getByText(/^Last 30 days: 3 credits billed/).waitFor({ timeout: 30_000 });
      // The CSV downloads from the page, with the same credentials.
      const [download] = await Promise.all([page.waitForEvent('download'), panel.getByRole('button', { name: 'Download usage CSV' }).click()]);
      const csv = await new Promise<string>((resolve, reject) => {
        download.createReadStream().then((stream) => {
          let text = '';
          stream.on('data', (c: Buffer) => (text += c.toString()));
          stream.on('end', () => resolve(text));
          stream.on('error', reject);
        }, reject);
      });
      assert.match(csv, /^start,api,priority,calls,succeeded,failed,creditsBilled/);
      assert.match(csv, /dnslookup/);
      assert.equal(await scrollsSideways(page), false, `${shot} scrolls sideways`);
      await screenshot(page, shot);
      if (width !== 1280) continue;

      // Suspend and resume, each confirmed inline.
      await panel.getByRole('button', { name: 'Suspend…' }).click();
      await panel.getByRole('alertdialog').getByRole('button', { name: 'Suspend' }).click();
      await panel.getByText(/suspended since/).waitFor();
      assert.notEqual((await t.gql('query($id: ID!) { tenantRow(id: $id) { tenant { suspendedAt } } }', { id: tenant.id })).body.data.tenantRow.tenant.suspendedAt, null);
      await panel.getByRole('button', { name: 'Resume…' }).click();
      await panel.getByRole('alertdialog').getByRole('button', { name: 'Resume' }).click();
      await panel.getByRole('button', { name: 'Suspend…' }).waitFor();
      assert.equal((await t.gql('query($id: ID!) { tenantRow(id: $id) { tenant { suspendedAt } } }', { id: tenant.id })).body.data.tenantRow.tenant.suspendedAt, null);
      // Delete: Cancel first leaves it; then confirmed, it is gone.
      await panel.getByRole('button', { name: 'Delete…' }).click();
      await panel.getByRole('alertdialog').getByRole('button', { name: 'Cancel' }).click();
      assert.notEqual((await t.gql('query($id: ID!) { tenantRow(id: $id) { tenant { id } } }', { id: tenant.id })).body.data.tenantRow, null);
      await panel.getByRole('button', { name: 'Delete…' }).click();
      await panel.getByRole('alertdialog').getByRole('button', { name: 'Delete page-co' }).click();
      await page.getByText(/Tenant page-co deleted/).waitFor({ timeout: 30_000 });
      await page.getByTestId('tenant-page').waitFor({ state: 'detached' });
      assert.equal((await t.gql('query($id: ID!) { tenantRow(id: $id) { tenant { id } } }', { id: tenant.id })).body.data.tenantRow, null);
      assert.equal((await t.gql('{ me { tenant { name } } }', {}, tenant.apiKey)).status, 401);
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
  test('a tenant manages its own keys and webhook endpoints, at 1280 px and 390 px', async () => {
    const tenant = await t.createTenant('self-serve');
    for (const [width, height, shot] of [[1280, 800, 'tenant-keys-webhooks'], [390, 844, 'tenant-keys-webhooks-phone']] as const) {
      const page = await b.page({ width, height });
      page.on('dialog', (d) => assert.fail(`a browser dialog opened: ${d.message()}`));
      await signIn(page, tenant.apiKey);
      const keys = page.getByTestId('api-keys');
      await keys.getByTestId('keys').locator('tbody tr').first().waitFor();
      const name = `ci-${width}`;
      await keys.getByLabel('Key name').fill(name);
      await keys.getByRole('button', { name: 'Create key' }).click();
      const shown = keys.getByRole('dialog', { name: new RegExp(`Key ${name} created`) });
      await shown.waitFor();
      await hasFocus(shown, 'focus moves into the secret dialog');
      const secret = (await shown.getByTestId('new-key').innerText()).trim();
      assert.equal((await t.gql('{ me { tenant { name } } }', {}, secret)).body.data.me.tenant.name, 'self-serve');
      await shown.getByRole('button', { name: 'Done' }).click();
      await keys.getByRole('button', { name: `Revoke key ${name}` }).click();
      await keys.getByRole('alertdialog').getByRole('button', { name: `Revoke ${name}` }).click();
      await keys.getByTestId('keys').locator('tr', { hasText: name }).getByText(/^revoked /).waitFor();
      assert.equal((await t.gql('{ me { tenant { name } } }', {}, secret)).status, 401);

      // A webhook endpoint: its signing secret shown once; a finished job's delivery listed.
      const hooksCard = page.getByTestId('webhooks');
      const path = `/self-${width}`;
      await hooksCard.getByLabel('Endpoint URL').fill(`${hooks}${path}`);
      await hooksCard.getByRole('button', { name: 'Create endpoint' }).click();
      const signing = hooksCard.getByRole('dialog', { name: /Endpoint .* created/ });
      await signing.waitFor();
      await hasFocus(signing, 'focus moves into the secret dialog');
      assert.match((await signing.getByTestId('new-key').innerText()).trim(), /^whsec_/);
      await signing.getByRole('button', { name: 'Done' }).click();
      const r = await t.gql('mutation { submitJob(input: { api: "dnslookup", params: { domain: "hook.example" } }) { job { id } } }', {}, tenant.apiKey);
      const jobId = r.body.data.submitJob.job.id;
      await hooksCard.locator(`tr[data-job="${jobId}"]`).getByTestId('delivery-status').getByText('SUCCEEDED').waitFor({ timeout: 30_000 });
      assert.ok(received.includes(path));
      // Disable, enable, then delete (Cancel first leaves it).
      const url = `${hooks}${path}`;
      await hooksCard.getByRole('button', { name: `Disable endpoint ${url}` }).click();
      await hooksCard.locator('tr', { hasText: url }).getByText(/^disabled: disabled by the tenant/).waitFor();
      await hooksCard.getByRole('button', { name: `Enable endpoint ${url}` }).click();
      await hooksCard.locator('tr', { hasText: url }).getByTestId('endpoint-state').getByText(/^enabled$/).waitFor();
      assert.equal(await scrollsSideways(page), false, `${shot} scrolls sideways`);
      await screenshot(page, shot);
      await hooksCard.getByRole('button', { name: `Delete endpoint ${url}` }).click();
      const ask = hooksCard.getByRole('alertdialog');
      await hasFocus(ask, 'focus moves into the confirmation');
      await ask.getByRole('button', { name: 'Cancel' }).click();
      assert.equal((await t.gql('{ webhookEndpoints { id } }', {}, tenant.apiKey)).body.data.webhookEndpoints.length, 1);
      await hooksCard.getByRole('button', { name: `Delete endpoint ${url}` }).click();
      await hooksCard.getByRole('alertdialog').getByRole('button', { name: 'Delete endpoint' }).click();
      await hooksCard.getByText(/^No webhook endpoints\.$/).waitFor();
      assert.deepEqual((await t.gql('{ webhookEndpoints { id } }', {}, tenant.apiKey)).body.data.webhookEndpoints, []);
    }
    assert.deepEqual(b.outside, []);
  });

  test("an operator sees the learned pace and the fairness lag, and manages a tenant's keys and webhooks from its page, at 1280 px and 390 px", async () => {
    const sim = t.app.simulator!;
    const stated = sim.conditions().ratePerMinute;
    const [hooked, other] = [await t.createTenant('hooks-co'), await t.createTenant('fair-co')];
    // The endpoint answers 500 until it is disabled as FAILING.
    const made = await t.gql('mutation($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { endpoint { id } } }', { i: { url: `${hooks}/down`, events: ['JOB_SUCCEEDED'] } }, hooked.apiKey);
    const endpointId = made.body.data.createWebhookEndpoint.endpoint.id;
    answers.set('/down', 500);
    // The provider now states a window of a third of the configured one: the pacer learns it (and
    // the 429s on the way may pause a window for a while: this test runs last).
    sim.setConditions({ ratePerMinute: 60 });
    try {
      // Both tenants backlogged together (cap 1, six 0.8 s jobs each): the fairness lag is measured for the pair.
      for (const x of [hooked, other]) {
        await t.gql('mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', { i: { id: x.id, concurrencyCap: 1 } });
        const jobs = Array.from({ length: 6 }, (_, i) => ({ api: 'dnslookup', params: { domain: `f${i}.example` } }));
        const r = await t.gql('mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }', { i: { jobs } }, x.apiKey);
        assert.equal(r.body.errors, undefined);
      }
      const page = await b.page();
      page.on('dialog', (d) => assert.fail(`a browser dialog opened: ${d.message()}`));
      await signIn(page, ADMIN_TOKEN);
      const windows = page.getByTestId('windows');
      // Pace used against the learned rate, with the configured rate and the reason beside it.
      const learned = windows.getByTestId('pace-learned').first();
      await learned.waitFor({ timeout: 30_000 });
      assert.match(await learned.innerText(), /^learned [0-9.]+ calls\/s, below the configured 2\.7 calls\/s: (the provider states a smaller window|the provider answered 429)/);
      // One reading of the row: the pace used is against the learned rate, at most the stated 60/min × 0.9.
      const row = await windows.locator('tbody tr:has([data-testid="pace-learned"])').first().innerText();
      const rate = /learned ([0-9.]+) calls\/s/.exec(row)![1]!;
      assert.ok(Number(rate) <= 0.9 + 1e-9, `learned ${rate} calls/s`);
      assert.match(row, new RegExp(`pace used \\d+% \\([0-9.]+ of ${rate.replace('.', '\\.')} calls/s\\)`), row);
      // The fairness line names the pair backlogged together, with its lag against the bound.
      await page.getByTestId('fairness').getByText(/worst pair (hooks-co and fair-co|fair-co and hooks-co), lag [0-9.]+ of bound [0-9.]+/).waitFor({ timeout: 30_000 });
      await screenshot(page, 'operator-pace-fairness');

      // The tenant's page: its fairness, keys and webhooks.
      await page.getByRole('button', { name: 'Open tenant hooks-co' }).click();
      const panel = page.getByTestId('tenant-page');
      await panel.getByTestId('tenant-fairness').getByText(/lag [0-9.]+ of bound [0-9.]+ \(\d+%/).waitFor({ timeout: 30_000 });
      const keys = panel.getByTestId('api-keys');
      await keys.getByTestId('keys').locator('tbody tr').first().waitFor();
      // A read-only key that expires in 30 days: its secret is shown once, in a dialog that takes focus.
      await keys.getByLabel('Key name').fill('dashboard');
      await keys.getByLabel('SUBMIT').uncheck();
      await keys.getByLabel('Expires').selectOption('30');
      await keys.getByRole('button', { name: 'Create key' }).click();
      const shown = keys.getByRole('dialog', { name: /Key dashboard created/ });
      await shown.waitFor();
      await hasFocus(shown, 'focus moves into the secret dialog');
      const secret = (await shown.getByTestId('new-key').innerText()).trim();
      assert.match(secret, /^slc_/);
      assert.equal((await t.gql('{ me { tenant { name } } }', {}, secret)).body.data.me.tenant.name, 'hooks-co');
      const submit = await t.gql('mutation { submitJob(input: { api: "dnslookup", params: { domain: "x.example" } }) { job { id } } }', {}, secret);
      assert.equal(submit.body.errors?.[0]?.extensions?.code, 'FORBIDDEN', 'a READ key cannot submit');
      await shown.getByRole('button', { name: 'Done' }).click();
      const dash = keys.getByTestId('keys').locator('tr', { hasText: 'dashboard' });
      assert.match(await dash.innerText(), /READ/);
      assert.doesNotMatch(await dash.innerText(), /SUBMIT/);
      await dash.getByText(/active, expires 20\d\d-/).waitFor();
      await dash.getByText(secret.slice(0, 6)).waitFor();
      // Revoke, confirmed inline: the key stops working.
      await keys.getByRole('button', { name: 'Revoke key dashboard' }).click();
      const ask = keys.getByRole('alertdialog', { name: /Revoke key dashboard/ });
      await hasFocus(ask, 'focus moves into the confirmation');
      await ask.getByRole('button', { name: 'Revoke dashboard' }).click();
      await dash.getByTestId('key-state').getByText(/^revoked /).waitFor();
      assert.equal((await t.gql('{ me { tenant { name } } }', {}, secret)).status, 401);

      // The endpoint failed until disabled; the delivery it keeps shows the 500.
      const hooksCard = panel.getByTestId('webhooks');
      const endpoint = hooksCard.locator(`tr[data-endpoint="${endpointId}"]`);
      await endpoint.getByText(/^disabled: failed every delivery for too long/).waitFor({ timeout: 30_000 });
      await hooksCard.getByTestId('deliveries').locator('tbody tr').first().getByText(/HTTP 500/).waitFor({ timeout: 30_000 });
      // Re-enabled by the operator once the receiver is fixed: the kept delivery goes through.
      answers.set('/down', 200);
      await hooksCard.getByRole('button', { name: `Re-enable endpoint ${hooks}/down` }).click();
      await hooksCard.getByText(/enabled: the deliveries it kept waiting are sent now/).waitFor();
      await endpoint.getByTestId('endpoint-state').getByText(/^enabled/).waitFor();
      await hooksCard.getByTestId('delivery-status').getByText('SUCCEEDED').first().waitFor({ timeout: 30_000 });
      assert.equal(await hooksCard.getByRole('button', { name: /Delete endpoint/ }).count(), 0, 'the operator does not delete endpoints');
      assert.equal(await scrollsSideways(page), false, 'the tenant page scrolls sideways at 1280 px');
      await screenshot(page, 'operator-tenant-keys-webhooks');

      // At phone width the same page reads without scrolling sideways.
      const phone = await b.page({ width: 390, height: 844 });
      await signIn(phone, ADMIN_TOKEN);
      await phone.getByTestId('fairness').waitFor();
      await phone.getByRole('button', { name: 'Open tenant hooks-co' }).click();
      await phone.getByTestId('tenant-page').getByTestId('keys').getByText('dashboard').waitFor();
      await phone.getByTestId('tenant-page').getByTestId('delivery-status').getByText('SUCCEEDED').first().waitFor();
      assert.equal(await scrollsSideways(phone), false, 'the tenant page scrolls sideways at 390 px');
      await screenshot(phone, 'operator-tenant-keys-webhooks-phone');
    } finally {
      sim.setConditions({ ratePerMinute: stated });
    }
    assert.deepEqual(b.outside, []);
  });
});
