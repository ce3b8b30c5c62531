/**
 * Real Chromium (Debian's `chromium` package) driven by playwright-core, for
 * the console and GraphiQL tests. Every page is watched: a request or a
 * WebSocket to anything but 127.0.0.1 is blocked and fails the test.
 *
 * Without chromium the tests skip with a message, except under CI=true, where
 * a missing browser is a failure (.ci/run installs it first).
 */
import { existsSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import type { TestContext } from 'node:test';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';

export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const ROOT = path.dirname(path.dirname(path.dirname(new URL(import.meta.url).pathname)));
/**
 * Where the tests save their screenshots: .data/screenshots (gitignored), so a test run leaves
 * the tree clean; `npm run screenshots` writes the README's, in docs/screenshots.
 */
export const SCREENSHOTS = process.env.SCREENSHOTS_DIR ? path.resolve(process.env.SCREENSHOTS_DIR) : path.join(ROOT, '.data', 'screenshots');

/** Whether browser tests can run here; throws under CI when they cannot (a skipped browser test must not pass CI). */
export function browserAvailable(): boolean {
  if (existsSync(CHROMIUM)) return true;
  if (process.env.CI === 'true' || process.env.CI === '1') throw new Error(`CI=true but no Chromium at ${CHROMIUM}: .ci/run installs it with apt-get install chromium`);
  return false;
}
export const SKIP_MESSAGE = `no Chromium at ${CHROMIUM} (apt-get install -y chromium, or set CHROMIUM_PATH): browser tests skipped`;

export function isLocal(url: string): boolean {
  if (url.startsWith('data:') || url.startsWith('blob:') || url === 'about:blank') return true;
  try {
    return new URL(url).hostname === '127.0.0.1';
  } catch {
    return false;
  }
}

export interface Browsing {
  browser: Browser;
  /** A new page whose context blocks and records every request leaving 127.0.0.1. */
  page(viewport?: { width: number; height: number }): Promise<Page>;
  /** Requests that tried to leave 127.0.0.1 (the test fails when any did). */
  outside: string[];
  close(): Promise<void>;
}

export async function launch(): Promise<Browsing> {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    // As root Chromium needs --no-sandbox; the rest keeps it from calling home on its own.
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-gpu'],
  });
  const outside: string[] = [];
  const contexts: BrowserContext[] = [];
  return {
    browser,
    outside,
    async page(viewport = { width: 1280, height: 800 }) {
      const context = await browser.newContext({ viewport });
      contexts.push(context);
      await context.route('**/*', (route) => {
        const url = route.request().url();
        if (isLocal(url)) return route.continue();
        outside.push(url);
        return route.abort('blockedbyclient');
      });
      const page = await context.newPage();
      page.on('websocket', (ws) => {
        if (!isLocal(ws.url())) outside.push(ws.url());
      });
      page.on('request', (req) => {
        if (!isLocal(req.url())) outside.push(req.url());
      });
      return page;
    },
    async close() {
      for (const c of contexts) await c.close().catch(() => {});
      await browser.close();
    },
  };
}

export async function screenshot(page: Page, name: string): Promise<void> {
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

/** Whether the page scrolls sideways at its current viewport. */
export async function scrollsSideways(page: Page): Promise<boolean> {
  return page.evaluate(() => document.documentElement.scrollWidth > window.innerWidth || document.body.scrollWidth > window.innerWidth);
}

/** Skips (locally) or fails (CI) a test when there is no Chromium. */
export function needChromium(t: TestContext): boolean {
  if (browserAvailable()) return true;
  t.skip(SKIP_MESSAGE);
  return false;
}
