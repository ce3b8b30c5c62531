/**
 * GraphiQL, served whole by this process: `@graphql-yoga/render-graphiql`
 * inlines its scripts, styles and workers, so the page loads with no network
 * beyond Sluice (Yoga's default page fetches them from a CDN).
 *
 * Subscriptions go over graphql-ws, and a browser cannot set headers on a
 * WebSocket, so the page hands the Headers tab's Authorization to graphql-ws as
 * `connectionParams` (read when the socket opens; GraphiQL closes an idle
 * socket, so a changed header is used by the next subscription).
 *
 * Safe outside a developer's machine:
 *  - off unless GRAPHIQL=true (on by default in demo mode and development);
 *  - served with a Content-Security-Policy: the page's one inline script by its
 *    hash, workers from blob: (how the page starts them), connections to this
 *    origin only, `frame-ancestors 'none'` (no clickjacking of an admin session);
 *  - headers (the admin token, a tenant key) never reach localStorage: GraphiQL
 *    gets a storage that keeps them in the page's memory and writes everything
 *    else (tabs, history) to localStorage with `headers` emptied. A reload asks
 *    for the token again.
 */
import { createHash } from 'node:crypto';
import { renderGraphiQL } from '@graphql-yoga/render-graphiql';
import type { GraphiQLOptions, Plugin } from 'graphql-yoga';

/**
 * The first tab's text. Lines stay under WELCOME_WIDTH characters: the editor
 * shows about that many beside the results pane at 1280 px, and a comment
 * cut off at the pane's edge hides what it says.
 */
export const WELCOME_WIDTH = 60;
export const GRAPHIQL_WELCOME = `# Sluice: one upstream API account (APIVerve),
# shared fairly among many tenants.
#
# Authenticate in the Headers tab below, for queries
# and subscriptions alike:
#   { "Authorization": "Bearer <token>" }
# - the admin token (slcadm_...) is printed at the first
#   start, or set SLUICE_ADMIN_TOKEN;
# - a tenant key (slc_...) comes from createTenant or
#   rotateTenantKey, and is shown once.
#
# The tabs above hold examples, in the order you need
# them: as the admin, create a tenant (this tab); then,
# with its key, submitJob, job, and the jobUpdated
# subscription. The live console is at /console.

mutation CreateTenant($input: CreateTenantInput!) {
  createTenant(input: $input) {
    tenant { id name tier }
    apiKey
  }
}
`;

const json = (v: unknown) => JSON.stringify(v, null, 2);

/**
 * Example tabs by role, first visit only (GraphiQL keeps the tabs a person
 * has afterwards). The admin's comes first: a newcomer holds the admin token
 * before any tenant key. Headers are placeholders; the real token is typed in
 * and stays in the page's memory (see the storage below).
 */
export const GRAPHIQL_TABS: Array<{ query: string; variables?: string; headers?: string }> = [
  { query: GRAPHIQL_WELCOME, variables: json({ input: { name: 'acme', tier: 'PRO' } }), headers: json({ Authorization: 'Bearer <admin token>' }) },
  {
    query: `# As a tenant (its key from createTenant): queue a job.
# It answers at once with state QUEUED; copy the id
# into the next two tabs.
mutation SubmitJob($input: JobInput!) {
  submitJob(input: $input) {
    job { id state }
  }
}
`,
    variables: json({ input: { api: 'dnslookup', params: { domain: 'example.com' }, priority: 'INTERACTIVE', idempotencyKey: 'my-first-job' } }),
    headers: json({ Authorization: 'Bearer <tenant key>' }),
  },
  {
    query: `# As a tenant: read a job back, with its result.
query Job($id: ID!) {
  job(id: $id) {
    id api state attempts creditsBilled
    result
    error { code message }
  }
}
`,
    variables: json({ id: '<job id from submitJob>' }),
    headers: json({ Authorization: 'Bearer <tenant key>' }),
  },
  {
    query: `# As a tenant: follow a job live over WebSocket.
# Sends the state now, then every change, and
# completes after SUCCEEDED, FAILED or CANCELLED.
subscription JobUpdated($id: ID!) {
  jobUpdated(id: $id) {
    id state attempts result
    error { code message }
  }
}
`,
    variables: json({ id: '<job id from submitJob>' }),
    headers: json({ Authorization: 'Bearer <tenant key>' }),
  },
];

/**
 * GraphiQL's storage: values under `headers` (the Headers tab, in tabs and in the
 * history) stay in this page's memory; localStorage gets the rest. The graphql-ws
 * connectionParams read the active tab's Authorization from the memory copy.
 */
const CONNECTION_PARAMS_SCRIPT = `
(function () {
  var memory = {};
  var withoutHeaders = function (text) {
    try { return JSON.stringify(JSON.parse(text), function (k, v) { return k === 'headers' ? null : v; }); } catch (e) { return text; }
  };
  window.sluiceStorage = {
    getItem: function (k) { return Object.prototype.hasOwnProperty.call(memory, k) ? memory[k] : localStorage.getItem(k); },
    setItem: function (k, v) {
      memory[k] = v;
      if (/:headers$/.test(k)) localStorage.removeItem(k);
      else localStorage.setItem(k, withoutHeaders(v));
    },
    removeItem: function (k) { delete memory[k]; localStorage.removeItem(k); },
    clear: function () { memory = {}; localStorage.clear(); },
    get length() { return localStorage.length; },
  };
  window.sluiceConnectionParams = function () {
    try {
      var tabs = JSON.parse(window.sluiceStorage.getItem('graphiql:tabState') || 'null');
      var text = tabs && tabs.tabs && tabs.tabs[tabs.activeTabIndex || 0] ? tabs.tabs[tabs.activeTabIndex || 0].headers : window.sluiceStorage.getItem('graphiql:headers');
      var headers = JSON.parse(text || '{}');
      for (var k in headers) if (k.toLowerCase() === 'authorization') return { authorization: String(headers[k]) };
    } catch (e) {}
    return {};
  };
})();
YogaGraphiQL.renderYogaGraphiQL = (function (render) {
  return function (root, opts) {
    return render(root, Object.assign({}, opts, { connectionParams: window.sluiceConnectionParams, storage: window.sluiceStorage, shouldPersistHeaders: true }));
  };
})(YogaGraphiQL.renderYogaGraphiQL);
`;

let cached: { key: string; html: string; csp: string } | null = null;

/** The Content-Security-Policy for a page whose inline scripts are these. Pure. */
export function graphiqlCsp(inlineScripts: readonly string[]): string {
  const hashes = inlineScripts.map((s) => `'sha256-${createHash('sha256').update(s, 'utf8').digest('base64')}'`);
  return [
    "default-src 'none'",
    `script-src ${hashes.join(' ')}`,
    "worker-src blob:",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
    "form-action 'none'",
  ].join('; ');
}

function build(opts: GraphiQLOptions): { key: string; html: string; csp: string } {
  const key = JSON.stringify(opts);
  if (cached?.key === key) return cached;
  const html = renderGraphiQL({ ...opts, defaultQuery: opts.defaultQuery ?? GRAPHIQL_WELCOME, defaultTabs: opts.defaultTabs ?? GRAPHIQL_TABS });
  const at = html.lastIndexOf('YogaGraphiQL.renderYogaGraphiQL(');
  if (at < 0) throw new Error('@graphql-yoga/render-graphiql changed its page: the connectionParams hook has nowhere to go');
  const page = html.slice(0, at) + CONNECTION_PARAMS_SCRIPT + html.slice(at);
  const scripts = [...page.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]!);
  cached = { key, html: page, csp: graphiqlCsp(scripts) };
  return cached;
}

/** The page (9 MB, built once): Yoga's offline GraphiQL, with the storage and connectionParams hook inserted just before it renders. */
export function renderSluiceGraphiQL(opts: GraphiQLOptions): string {
  return build(opts).html;
}

/** Security headers on the GraphiQL page (the only HTML Yoga serves). */
export function useGraphiQLHeaders(): Plugin {
  return {
    onResponse({ response }) {
      if (!cached || !(response.headers.get('content-type') ?? '').startsWith('text/html')) return;
      response.headers.set('content-security-policy', cached.csp);
      response.headers.set('x-frame-options', 'DENY');
      response.headers.set('referrer-policy', 'no-referrer');
      response.headers.set('x-content-type-options', 'nosniff');
    },
  };
}
