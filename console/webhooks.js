// A tenant's webhook endpoints and their recent deliveries, for both views. A tenant creates
// endpoints (the signing secret shown once), enables and disables them and deletes them with an
// inline confirmation; the operator (`tenantId` set) reads any tenant's and re-enables one that
// was disabled, e.g. after it failed for a day. The server keeps tenants apart.
import { useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { gql } from './api.js';
import { errorText, time } from './format.js';
import { Confirm, SecretOnce, usePoll } from './ui.js';

const ENDPOINT_FIELDS = 'id url events enabled disabledReason disabledAt failingSince createdAt';
const READ = `query Hooks($t: ID) {
  webhookEndpoints(tenantId: $t) { ${ENDPOINT_FIELDS} }
  webhookDeliveries(tenantId: $t, first: 10) { edges { node { id endpointId event jobId status attempts lastAttemptAt responseStatus lastError nextAttemptAt } } }
}`;
const CREATE = `mutation CreateHook($i: CreateWebhookEndpointInput!) { createWebhookEndpoint(input: $i) { endpoint { ${ENDPOINT_FIELDS} } secret } }`;
const UPDATE = `mutation UpdateHook($i: UpdateWebhookEndpointInput!) { updateWebhookEndpoint(input: $i) { ${ENDPOINT_FIELDS} } }`;
const DELETE = `mutation DeleteHook($id: ID!) { deleteWebhookEndpoint(id: $id) }`;
const EVENTS = [
  ['JOB_SUCCEEDED', 'succeeded'],
  ['JOB_FAILED', 'failed'],
  ['JOB_CANCELLED', 'cancelled'],
];
const DISABLED = {
  FAILING: 'failed every delivery for too long',
  DISABLED_BY_TENANT: 'disabled by the tenant',
  DISABLED_BY_OPERATOR: 'disabled by an operator',
};

/** An endpoint's state in words: enabled (and failing since when), or disabled with the reason. */
export function endpointState(e) {
  if (e.enabled) return e.failingSince ? { text: `enabled, failing since ${time(e.failingSince)}`, cls: 'warn' } : { text: 'enabled', cls: 'good' };
  return { text: `disabled: ${DISABLED[e.disabledReason] ?? e.disabledReason ?? 'disabled'}${e.disabledAt ? ` (${time(e.disabledAt)})` : ''}${e.failingSince ? `, failing since ${time(e.failingSince)}` : ''}`, cls: 'bad' };
}

/** A delivery's outcome in words: the status, the last HTTP answer or error, and the next try. */
function deliveryText(d) {
  const answer = d.responseStatus !== null ? `HTTP ${d.responseStatus}` : d.lastError ?? 'not tried yet';
  const next = d.status === 'PENDING' && d.nextAttemptAt ? `, next try ${time(d.nextAttemptAt)}` : '';
  return `${answer}${d.attempts ? `, ${d.attempts} attempt${d.attempts === 1 ? '' : 's'}` : ''}${next}`;
}

export function Webhooks({ token, tenantId = null, tenantName = null }) {
  const operator = tenantId !== null;
  const [data, setData] = useState(null);
  const [error, setError] = useState(null);
  const [note, setNote] = useState(null);
  const [reload, setReload] = useState(0);
  const [url, setUrl] = useState('');
  const [events, setEvents] = useState({ JOB_SUCCEEDED: true, JOB_FAILED: true, JOB_CANCELLED: false });
  const [created, setCreated] = useState(null);
  const [deleting, setDeleting] = useState(null);
  usePoll(
    () => gql(token, READ, { t: tenantId }),
    (d) => setData({ endpoints: d.webhookEndpoints, deliveries: d.webhookDeliveries.edges.map((x) => x.node) }),
    setError,
    [token, tenantId, reload],
  );
  const act = async (fn, done) => {
    setError(null);
    setNote(null);
    try {
      await fn();
      if (done) setNote(done);
      setReload((n) => n + 1);
    } catch (e) {
      setError(e);
    }
  };
  const create = (ev) => {
    ev.preventDefault();
    return act(async () => {
      const d = await gql(token, CREATE, { i: { url: url.trim(), events: EVENTS.map(([v]) => v).filter((v) => events[v]) } });
      setCreated({ title: `Endpoint ${d.createWebhookEndpoint.endpoint.url} created.`, secret: d.createWebhookEndpoint.secret });
      setUrl('');
    });
  };
  const enable = (e, on) => act(() => gql(token, UPDATE, { i: { id: e.id, enabled: on } }), on ? `Endpoint ${e.url} enabled: the deliveries it kept waiting are sent now.` : `Endpoint ${e.url} disabled: deliveries wait until it is enabled.`);
  const remove = (e) =>
    act(async () => {
      await gql(token, DELETE, { id: e.id });
      setDeleting(null);
    }, `Endpoint ${e.url} deleted, with its deliveries.`);
  const urlOf = new Map((data?.endpoints ?? []).map((e) => [e.id, e.url]));
  const H = operator ? 'h3' : 'h2';
  return html`<section aria-labelledby="hooks-h" class="card wide" data-testid="webhooks">
    <${H} id="hooks-h">${tenantName ? `Webhook endpoints of ${tenantName}` : 'Webhook endpoints'}</${H}>
    ${error && html`<p class="error" role="alert">${errorText(error)}</p>`}
    ${note && html`<p class="good" role="status">${note}</p>`}
    ${!operator && html`<form class="inline" onSubmit=${create} aria-label="Create a webhook endpoint">
      <label>Endpoint URL<input type="url" required size="36" placeholder="https://example.com/hooks/sluice" value=${url} onInput=${(e) => setUrl(e.currentTarget.value)} /></label>
      <fieldset class="checks"><legend>Events</legend>
        ${EVENTS.map(([v, text]) => html`<label class="check"><input type="checkbox" checked=${events[v]} onChange=${(e) => setEvents({ ...events, [v]: e.currentTarget.checked })} /> ${text}</label>`)}
      </fieldset>
      <button type="submit">Create endpoint</button>
    </form>`}
    ${created && html`<${SecretOnce} title=${created.title} secret=${created.secret} what="signing secret" onClose=${() => setCreated(null)} />`}
    ${deleting && html`<${Confirm} title=${`Delete endpoint ${deleting.url}?`} message="The endpoint and its deliveries are deleted; waiting deliveries are never sent. This cannot be undone."
      confirmLabel="Delete endpoint" danger=${true} onConfirm=${() => remove(deleting)} onCancel=${() => setDeleting(null)} />`}
    ${data && data.endpoints.length === 0 && html`<p class="muted">No webhook endpoints.</p>`}
    ${data && data.endpoints.length > 0 && html`<table class="stack" data-testid="endpoints">
      <thead><tr><th scope="col">URL</th><th scope="col">Events</th><th scope="col">State</th><th scope="col">Created</th><th scope="col">Actions</th></tr></thead>
      <tbody>${data.endpoints.map((e) => {
        const st = endpointState(e);
        return html`<tr key=${e.id} data-endpoint=${e.id}>
          <th scope="row" data-label="URL"><code>${e.url}</code></th>
          <td data-label="Events">${e.events.map((v) => v.replace('JOB_', '').toLowerCase()).join(', ')}</td>
          <td data-label="State" class=${st.cls} data-testid="endpoint-state">${st.text}</td>
          <td data-label="Created">${time(e.createdAt)}</td>
          <td data-label="Actions" class="actions">
            ${e.enabled
              ? !operator && html`<button type="button" class="secondary" onClick=${() => enable(e, false)} aria-label=${`Disable endpoint ${e.url}`}>Disable</button>`
              : html`<button type="button" class="secondary" onClick=${() => enable(e, true)} aria-label=${`${operator ? 'Re-enable' : 'Enable'} endpoint ${e.url}`}>${operator ? 'Re-enable' : 'Enable'}</button>`}
            ${!operator && html`<button type="button" class="secondary" onClick=${() => setDeleting(e)} aria-label=${`Delete endpoint ${e.url}`}>Delete…</button>`}
          </td>
        </tr>`;
      })}</tbody>
    </table>`}
    ${data && data.endpoints.length > 0 && html`<h4>Recent deliveries</h4>
      ${data.deliveries.length === 0 ? html`<p class="muted">None yet: a delivery is made when a job ends in an event an endpoint asked for.</p>` : html`<table class="stack" data-testid="deliveries">
        <thead><tr><th scope="col">Job</th><th scope="col">Event</th><th scope="col">Endpoint</th><th scope="col">Status</th><th scope="col">Outcome</th><th scope="col">Last attempt</th></tr></thead>
        <tbody>${data.deliveries.map((d) => html`<tr key=${d.id} data-delivery=${d.id} data-job=${d.jobId}>
          <th scope="row" data-label="Job"><code>${d.jobId.slice(0, 8)}…</code></th>
          <td data-label="Event">${d.event.replace('JOB_', '').toLowerCase()}</td>
          <td data-label="Endpoint">${urlOf.get(d.endpointId) ?? d.endpointId}</td>
          <td data-label="Status"><span class=${`state ${d.status}`} data-testid="delivery-status">${d.status}</span></td>
          <td data-label="Outcome">${deliveryText(d)}</td>
          <td data-label="Last attempt">${time(d.lastAttemptAt)}</td>
        </tr>`)}</tbody>
      </table>`}`}
  </section>`;
}
