/**
 * GraphiQL, served whole by this process: `@graphql-yoga/render-graphiql`
 * inlines its scripts, styles and workers, so the page loads with no network
 * beyond Sluice (Yoga's default page fetches them from a CDN).
 *
 * Subscriptions go over graphql-ws, and a browser cannot set headers on a
 * WebSocket, so the page hands the Headers tab's Authorization to graphql-ws as
 * `connectionParams` (read when the socket opens; GraphiQL closes an idle
 * socket, so a changed header is used by the next subscription).
 */
import { renderGraphiQL } from '@graphql-yoga/render-graphiql';
import type { GraphiQLOptions } from 'graphql-yoga';

export const GRAPHIQL_WELCOME = `# Sluice: one upstream API account (APIVerve), shared fairly among many tenants.
#
# Authenticate in the Headers tab below, for queries and subscriptions alike:
#   { "Authorization": "Bearer <admin token or tenant key>" }
# The admin token (slcadm_…) is printed at the first start (or set SLUICE_ADMIN_TOKEN);
# a tenant key (slc_…) comes from createTenant or rotateTenantKey, shown once.
#
# As a tenant: submitJob, jobs, me { usage queues }, subscription { jobUpdated(id) jobsCompleted tenantUsage }.
# As the admin: tenants, tenantTable, createTenant, updateTenant, system, subscription { systemStatus }.
# The live console is at /console.

query Catalog {
  apis { name creditCost requiredParams }
}
`;

/** Reads the active tab's headers as GraphiQL persists them (JSON text), returning the Authorization entry. */
const CONNECTION_PARAMS_SCRIPT = `
window.sluiceConnectionParams = function () {
  try {
    var tabs = JSON.parse(localStorage.getItem('graphiql:tabState') || 'null');
    var text = tabs && tabs.tabs && tabs.tabs[tabs.activeTabIndex || 0] ? tabs.tabs[tabs.activeTabIndex || 0].headers : localStorage.getItem('graphiql:headers');
    var headers = JSON.parse(text || '{}');
    for (var k in headers) if (k.toLowerCase() === 'authorization') return { authorization: String(headers[k]) };
  } catch (e) {}
  return {};
};
YogaGraphiQL.renderYogaGraphiQL = (function (render) {
  return function (root, opts) { return render(root, Object.assign({}, opts, { connectionParams: window.sluiceConnectionParams })); };
})(YogaGraphiQL.renderYogaGraphiQL);
`;

let cached: { key: string; html: string } | null = null;

/** The page (9 MB, built once): Yoga's offline GraphiQL, with the connectionParams hook inserted just before it renders. */
export function renderSluiceGraphiQL(opts: GraphiQLOptions): string {
  const key = JSON.stringify(opts);
  if (cached?.key === key) return cached.html;
  const html = renderGraphiQL({ ...opts, defaultQuery: opts.defaultQuery ?? GRAPHIQL_WELCOME });
  const at = html.lastIndexOf('YogaGraphiQL.renderYogaGraphiQL(');
  if (at < 0) throw new Error('@graphql-yoga/render-graphiql changed its page: the connectionParams hook has nowhere to go');
  cached = { key, html: html.slice(0, at) + CONNECTION_PARAMS_SCRIPT + html.slice(at) };
  return cached.html;
}
