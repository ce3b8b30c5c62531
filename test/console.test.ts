/**
 * The console at /console in real Chromium, against a real Sluice (in-process,
 * simulator over HTTP): the operator sees the health strip and the windows move
 * as jobs run (pace used, charts from the server's history with ranges),
 * creates a tenant, finds a job by key and retries it, opens a tenant's page
 * (usage chart, CSV, quota meter thresholds) and suspends, resumes and deletes
 * it through inline confirmations; a tenant submits a job from the form and
 * follows it live in the note, the table and the detail, filters and pages its
 * jobs and retries a failed one; every view works at 1280 px and at 390 px
 * without scrolling sideways; nothing is fetched from outside 127.0.0.1.
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
    assert.equal(await ask.evaluate((el) => el === document.activeElement), true, 'focus moves into the confirmation');
    await ask.getByRole('button', { name: 'Cancel' }).click();
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, key)).status, 200);
    await page.getByRole('button', { name: 'Rotate the key of console-made' }).click();
    await page.getByRole('alertdialog').getByRole('button', { name: 'Rotate key' }).click();
    const rotated = (await page.getByTestId('new-key').innerText()).trim();
    assert.notEqual(rotated, key);
    assert.equal((await t.gql('{ me { tenant { name } } }', {}, key)).status, 401);
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
    assert.equal(await detail.evaluate((el) => el === document.activeElement), true, 'focus moves into the job detail');
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
      assert.equal(await panel.evaluate((el) => el === document.activeElement), true, 'focus moves into the tenant page');
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
});
