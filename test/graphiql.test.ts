/**
 * GraphiQL at /graphql in real Chromium with every request outside 127.0.0.1
 * blocked: it renders from the process alone, shows Sluice's welcome text, and
 * a subscription run in it authenticates with the Headers tab's Authorization
 * and receives an event, under its Content-Security-Policy, and the key never
 * reaches localStorage. Also: graphql-ws takes the credential from
 * connectionParams (GraphiQL's `headers` shape too) or the upgrade's header.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { connectionAuthorization } from '../src/graphql/context.ts';
import { readFileSync } from 'node:fs';
import { buildSchema, parse, validate } from 'graphql';
import { GRAPHIQL_TABS, GRAPHIQL_WELCOME, WELCOME_WIDTH } from '../src/http/graphiql.ts';
import { collect, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { browserAvailable, launch, screenshot, SKIP_MESSAGE, type Browsing } from './helpers/browser.ts';

test('connectionAuthorization: params in any case, GraphiQL headers, then the upgrade header', () => {
  assert.equal(connectionAuthorization({ authorization: 'Bearer a' }, 'Bearer z'), 'Bearer a');
  assert.equal(connectionAuthorization({ Authorization: 'Bearer b' }, undefined), 'Bearer b');
  assert.equal(connectionAuthorization({ headers: { AUTHORIZATION: 'Bearer c' } }, undefined), 'Bearer c');
  assert.equal(connectionAuthorization({}, 'Bearer z'), 'Bearer z');
  assert.equal(connectionAuthorization(undefined, ['Bearer y']), 'Bearer y');
  assert.equal(connectionAuthorization({ authorization: '' }, undefined), null);
  assert.equal(connectionAuthorization(null, undefined), null);
});

describe('graphql-ws credentials', () => {
  let t: TestApp;
  before(async () => {
    t = await startTestApp();
  });
  after(async () => {
    await t?.stop();
  });

  for (const [name, make] of [
    ['connectionParams.headers.Authorization', (key: string) => ({ connectionParams: { headers: { Authorization: `Bearer ${key}` } } })],
    ['the upgrade request\'s Authorization header', (key: string) => ({ webSocketImpl: class extends WebSocket {
      constructor(url: string, protocols: string[]) {
        super(url, protocols, { headers: { authorization: `Bearer ${key}` } });
      }
    } })],
  ] as const) {
    test(`a tenant authenticates with ${name}`, async () => {
      const tenant = await t.createTenant(`ws-${name.length}`);
      const client = createClient({ url: t.url.replace(/^http/, 'ws'), webSocketImpl: WebSocket, retryAttempts: 0, lazy: true, ...make(tenant.apiKey) });
      try {
        const events = await collect<{ tenantUsage: { usage: { quota: number } } }>(client, 'subscription { tenantUsage { usage { quota } } }', {}, (e) => e.length >= 1);
        assert.ok(events[0]!.tenantUsage.usage.quota > 0);
      } finally {
        await client.dispose();
      }
    });
  }
});

describe('GraphiQL in Chromium', { skip: browserAvailable() ? false : SKIP_MESSAGE }, () => {
  let t: TestApp;
  let b: Browsing;
  before(async () => {
    t = await startTestApp();
    b = await launch();
  });
  after(async () => {
    await b?.close();
    await t?.stop();
  });

  test('renders offline, welcomes, and a subscription run in it receives an event', async () => {
    const tenant = await t.createTenant('graphiql-co');
    const submitted = await t.gql('mutation { submitJob(input: {api: "dnslookup", params: {domain: "x.example"}}) { job { id } } }', {}, tenant.apiKey);
    const id = submitted.body.data.submitJob.job.id as string;

    // A first visit shows the welcome text in the editor, rendered from the process alone.
    const welcome = await b.page();
    // The page is 9 MB: on a loaded machine its load event can take longer than Playwright's default 30 s.
    await welcome.goto(`${new URL(t.url).origin}/graphql`, { timeout: 120_000 });
    await welcome.getByText('Sluice: one upstream API account').first().waitFor({ timeout: 30_000 });
    // Example tabs by role, the admin's first (a newcomer holds the admin token before any tenant key).
    const tabs = welcome.locator('.graphiql-tab');
    await eventually(async () => (await tabs.count()) === GRAPHIQL_TABS.length, 20_000);
    const names = (await tabs.allInnerTexts()).map((x) => x.trim());
    assert.match(names[0]!, /CreateTenant/);
    assert.match(names.slice(1).join(' '), /SubmitJob.*Job.*JobUpdated/s);
    // The welcome's lines fit the editor at 1280 px: none runs past the editor's right edge.
    const clipped = await welcome.evaluate(() => {
      const editor = document.querySelector('.graphiql-query-editor');
      if (!editor) return ['no editor'];
      const right = editor.getBoundingClientRect().right;
      return [...editor.querySelectorAll('.view-line')].filter((l) => [...l.querySelectorAll('span span')].some((s) => s.getBoundingClientRect().right > right + 1)).map((l) => l.textContent ?? '');
    });
    assert.deepEqual(clipped, [], 'welcome lines cut off at the editor edge');
    await screenshot(welcome, 'graphiql-welcome');

    const page = await b.page();
    // The page runs whole under its Content-Security-Policy: Chromium reports every refusal on the console.
    const refused: string[] = [];
    for (const p of [welcome, page]) p.on('console', (m) => void (/Content Security Policy/i.test(m.text()) && refused.push(m.text())));
    const query = `subscription { jobUpdated(id: "${id}") { id api state } }`;
    await page.goto(`${new URL(t.url).origin}/graphql?query=${encodeURIComponent(query)}`, { timeout: 120_000 });
    // The Headers tab, as a person would fill it.
    await page.getByRole('button', { name: /^headers$/i }).click();
    const headers = page.locator('.graphiql-editor-tool .graphiql-editor').last();
    await headers.click();
    await page.keyboard.press('ControlOrMeta+A');
    await page.keyboard.insertText(JSON.stringify({ Authorization: `Bearer ${tenant.apiKey}` }));
    // GraphiQL stores the tab after 500 ms: headers in the page's memory only; the socket reads them when it opens.
    await page.waitForFunction(() => ((window as unknown as { sluiceConnectionParams(): { authorization?: string } }).sluiceConnectionParams().authorization ?? '').includes('Bearer slc_'), null, { timeout: 10_000 });
    // Introspection needs a key outside development (INTROSPECTION=keys): with the key in the Headers
    // tab, re-fetching the schema loads the docs (the README says so).
    await page.getByRole('button', { name: /re-fetch graphql schema/i }).click();
    await page.getByRole('button', { name: /show documentation explorer/i }).click();
    await page.locator('.graphiql-doc-explorer').getByText('Subscription', { exact: true }).first().waitFor({ timeout: 30_000 });
    await page.getByRole('button', { name: /execute query/i }).click();
    await page.locator('.graphiql-response').getByText('dnslookup').waitFor({ timeout: 30_000 });
    const response = await page.locator('.graphiql-response').innerText();
    assert.match(response.replace(/\s+/g, ''), new RegExp(id)); // the docs pane narrows the response: long ids wrap
    assert.doesNotMatch(response, /UNAUTHENTICATED|4403|Forbidden/);
    await screenshot(page, 'graphiql');
    assert.deepEqual(b.outside, []);
    // The key never reached localStorage (tabs, history and all), yet the tab itself was stored there.
    const stored = await page.evaluate(() => JSON.stringify({ ...localStorage }));
    assert.match(stored, /graphiql:tabState/);
    assert.ok(!stored.includes(tenant.apiKey), 'no key in localStorage');
    // (The welcome's own text says "Bearer <token>"; no credential follows the word anywhere.)
    assert.doesNotMatch(stored, /Bearer slc/);
    assert.deepEqual(refused, [], 'nothing refused by the CSP');
  });

  test('the welcome text says what Sluice is and how to authenticate', async () => {
    const res = await fetch(`${t.url}`, { headers: { accept: 'text/html' } });
    assert.equal(res.status, 200);
    const html = await res.text();
    assert.match(html, /Sluice: one upstream API account/);
    assert.match(html, /Authorization/);
    assert.match(html, /sluiceConnectionParams/);
    // The example tabs ride in the page: createTenant for the admin, then a tenant's submitJob, job and jobUpdated.
    for (const op of ['CreateTenant', 'SubmitJob', 'query Job', 'subscription JobUpdated']) assert.ok(html.includes(op), op);
  });

  test('the welcome text is wrapped to the editor width, and every example tab parses against the schema', async () => {
    for (const line of GRAPHIQL_WELCOME.split('\n')) assert.ok(line.length <= WELCOME_WIDTH, `longer than ${WELCOME_WIDTH}: ${line}`);
    const schema = buildSchema(readFileSync(new URL('../schema/schema.graphql', import.meta.url), 'utf8'));
    for (const tab of GRAPHIQL_TABS) assert.deepEqual(validate(schema, parse(tab.query)).map((e) => e.message), [], tab.query);
  });
});
