/**
 * The console at /console: static files from console/ and, under
 * /console/vendor/, ES modules straight from the npm packages in
 * node_modules (Preact, htm, uPlot, graphql-ws's browser client). No build
 * step: `npm install` is all it needs, and nothing loads from outside Sluice.
 * Only the files named here are served (no path reaches elsewhere).
 */
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import type { IncomingMessage, ServerResponse } from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const CONSOLE_PATH = '/console';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const modules = path.join(root, 'node_modules');

/** URL path under /console/ → file. The import map in console/index.html names the vendor files. */
const FILES: Record<string, string> = {
  '': path.join(root, 'console', 'index.html'),
  'app.js': path.join(root, 'console', 'app.js'),
  'api.js': path.join(root, 'console', 'api.js'),
  'operator.js': path.join(root, 'console', 'operator.js'),
  'tenant.js': path.join(root, 'console', 'tenant.js'),
  'format.js': path.join(root, 'console', 'format.js'),
  'ui.js': path.join(root, 'console', 'ui.js'),
  'jobs.js': path.join(root, 'console', 'jobs.js'),
  'keys.js': path.join(root, 'console', 'keys.js'),
  'webhooks.js': path.join(root, 'console', 'webhooks.js'),
  'console.css': path.join(root, 'console', 'console.css'),
  'vendor/preact.js': path.join(modules, 'preact', 'dist', 'preact.module.js'),
  'vendor/preact-hooks.js': path.join(modules, 'preact', 'hooks', 'dist', 'hooks.module.js'),
  'vendor/htm.js': path.join(modules, 'htm', 'dist', 'htm.module.js'),
  'vendor/htm-preact.js': path.join(modules, 'htm', 'preact', 'index.module.js'),
  'vendor/uplot.js': path.join(modules, 'uplot', 'dist', 'uPlot.esm.js'),
  'vendor/uplot.css': path.join(modules, 'uplot', 'dist', 'uPlot.min.css'),
};
/** graphql-ws's browser client imports a sibling chunk whose name carries a hash: serve that folder's top-level .js files. */
const GRAPHQL_WS_DIST = path.join(modules, 'graphql-ws', 'dist');

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
};

/** Which file a /console URL path names, or null; pure. */
export function consoleFile(pathname: string): string | null {
  if (pathname === CONSOLE_PATH || pathname === `${CONSOLE_PATH}/`) return FILES['']!;
  if (!pathname.startsWith(`${CONSOLE_PATH}/`)) return null;
  const rest = pathname.slice(CONSOLE_PATH.length + 1);
  if (rest in FILES) return FILES[rest]!;
  const ws = /^vendor\/graphql-ws\/([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.js)$/.exec(rest);
  return ws ? path.join(GRAPHQL_WS_DIST, ws[1]!) : null;
}

/**
 * The Host header as a CSP host-source, or null when it is not a plain host
 * name or IP literal with an optional port (anything else could smuggle
 * another source or directive into the policy). Pure.
 */
export function cspHost(host: string | undefined): string | null {
  if (!host) return null;
  const h = host.trim().toLowerCase();
  const name = /^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*(?::\d{1,5})?$/;
  const v6 = /^\[[0-9a-f:.]+\](?::\d{1,5})?$/;
  return h.length <= 255 && (name.test(h) || v6.test(h)) ? h : null;
}

/**
 * Nothing on these pages may load from, or talk to, another origin. The only
 * inline script is index.html's import map, allowed by its hash. The page's
 * graphql-ws socket goes to its own host (console/api.js): 'self' covers
 * ws:/wss: of the same origin in CSP Level 3 browsers (Chromium, Firefox),
 * and the host is named with ws:// and wss:// as well for browsers that read
 * 'self' as http(s) only; never `ws:`/`wss:` alone, which would let the page
 * open a socket to any host.
 */
export function contentSecurityPolicy(html: string | null, host?: string): string {
  const map = html ? /<script type="importmap">([\s\S]*?)<\/script>/.exec(html)?.[1] : undefined;
  const scripts = map === undefined ? "'self'" : `'self' 'sha256-${createHash('sha256').update(map).digest('base64')}'`;
  const own = cspHost(host);
  const connect = own ? `'self' ws://${own} wss://${own}` : "'self'";
  return `default-src 'self'; script-src ${scripts}; connect-src ${connect}; img-src 'self' data:; style-src 'self' 'unsafe-inline'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'`;
}

/** The coded 404 of a path under /console that names no file. */
function notFound(res: ServerResponse, pathname: string): void {
  const body = JSON.stringify({ errors: [{ message: `no console file at ${pathname.slice(0, 200)}`, extensions: { code: 'NOT_FOUND' } }] });
  res.writeHead(404, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) }).end(body);
}

/** Serves a /console request; false when the path is not the console's. */
export async function serveConsole(req: IncomingMessage, res: ServerResponse, pathname: string): Promise<boolean> {
  if (pathname !== CONSOLE_PATH && !pathname.startsWith(`${CONSOLE_PATH}/`)) return false;
  if (pathname === CONSOLE_PATH) {
    res.writeHead(308, { location: `${CONSOLE_PATH}/` }).end();
    return true;
  }
  const file = consoleFile(pathname);
  if (!file || (req.method !== 'GET' && req.method !== 'HEAD')) {
    notFound(res, pathname);
    return true;
  }
  let body: Buffer;
  try {
    body = await readFile(file);
  } catch {
    notFound(res, pathname);
    return true;
  }
  res.writeHead(200, {
    'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream',
    'content-length': body.length,
    'cache-control': 'no-cache',
    'content-security-policy': contentSecurityPolicy(file.endsWith('.html') ? body.toString('utf8') : null, req.headers.host),
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
  });
  res.end(req.method === 'HEAD' ? undefined : body);
  return true;
}
