// A tenant's API keys, for both views: the list (name, prefix, scopes, expiry, last use, revoked),
// a form that creates a key (its secret shown once) and revoke with an inline confirmation.
// `tenantId` set: the operator managing that tenant's keys; unset: a tenant managing its own
// (which needs a key with both SUBMIT and READ: the server says FORBIDDEN otherwise).
import { useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { gql } from './api.js';
import { errorText, time } from './format.js';
import { Confirm, SecretOnce, usePoll } from './ui.js';

const KEY_FIELDS = 'id name prefix scopes createdAt expiresAt lastUsedAt revokedAt';
const LIST = `query Keys($t: ID) { apiKeys(tenantId: $t) { ${KEY_FIELDS} } }`;
const CREATE = `mutation CreateKey($i: CreateApiKeyInput!) { createApiKey(input: $i) { key { ${KEY_FIELDS} } secret } }`;
const REVOKE = `mutation RevokeKey($id: ID!) { revokeApiKey(id: $id) { ${KEY_FIELDS} } }`;
const EXPIRIES = [
  ['', 'never (until revoked)'],
  ['1', 'in 1 day'],
  ['30', 'in 30 days'],
  ['90', 'in 90 days'],
  ['365', 'in 1 year'],
];

/** A key's state in words: revoked, expired, expiring, or active. */
export function keyState(k, now = Date.now()) {
  if (k.revokedAt) return { text: `revoked ${time(k.revokedAt)}`, cls: 'bad', live: false };
  if (k.expiresAt && Date.parse(k.expiresAt) <= now) return { text: `expired ${time(k.expiresAt)}`, cls: 'bad', live: false };
  if (k.expiresAt) return { text: `active, expires ${time(k.expiresAt)}`, cls: 'warn', live: true };
  return { text: 'active', cls: 'good', live: true };
}

export function ApiKeys({ token, tenantId = null, tenantName = null }) {
  const [keys, setKeys] = useState(null);
  const [error, setError] = useState(null);
  const [reload, setReload] = useState(0);
  const [name, setName] = useState('');
  const [scopes, setScopes] = useState({ SUBMIT: true, READ: true });
  const [expiry, setExpiry] = useState('');
  const [created, setCreated] = useState(null);
  const [revoking, setRevoking] = useState(null);
  const [note, setNote] = useState(null);
  usePoll(() => gql(token, LIST, { t: tenantId }), (d) => setKeys(d.apiKeys), setError, [token, tenantId, reload], 10_000);

  const create = async (ev) => {
    ev.preventDefault();
    setError(null);
    setNote(null);
    try {
      const chosen = Object.keys(scopes).filter((s) => scopes[s]);
      const expiresAt = expiry ? new Date(Date.now() + Number(expiry) * 86_400_000).toISOString() : null;
      const d = await gql(token, CREATE, { i: { name: name.trim(), scopes: chosen, expiresAt, ...(tenantId ? { tenantId } : {}) } });
      setCreated({ title: `Key ${d.createApiKey.key.name} created.`, secret: d.createApiKey.secret });
      setName('');
      setReload((n) => n + 1);
    } catch (e) {
      setError(e);
    }
  };
  const revoke = async (k) => {
    setError(null);
    try {
      await gql(token, REVOKE, { id: k.id });
      setNote(`Key ${k.name} (${k.prefix}…) revoked: requests with it are refused and its live connections closed.`);
      setReload((n) => n + 1);
    } catch (e) {
      setError(e);
    } finally {
      setRevoking(null);
    }
  };
  const label = tenantName ? `API keys of ${tenantName}` : 'API keys';
  // A section of the operator's tenant page, or a card of its own in the tenant view.
  const H = tenantId ? 'h3' : 'h2';
  return html`<section aria-labelledby="keys-h" class="card wide" data-testid="api-keys">
    <${H} id="keys-h">${label}</${H}>
    ${error && html`<p class="error" role="alert">${errorText(error)}</p>`}
    ${note && html`<p class="good" role="status">${note}</p>`}
    <form class="inline" onSubmit=${create} aria-label="Create an API key">
      <label>Key name<input required maxlength="100" value=${name} onInput=${(e) => setName(e.currentTarget.value)} /></label>
      <fieldset class="checks"><legend>Scopes</legend>
        ${['SUBMIT', 'READ'].map((s) => html`<label class="check"><input type="checkbox" checked=${scopes[s]} onChange=${(e) => setScopes({ ...scopes, [s]: e.currentTarget.checked })} /> ${s}</label>`)}
      </fieldset>
      <label>Expires<select value=${expiry} onChange=${(e) => setExpiry(e.currentTarget.value)}>${EXPIRIES.map(([v, text]) => html`<option value=${v}>${text}</option>`)}</select></label>
      <button type="submit">Create key</button>
    </form>
    ${created && html`<${SecretOnce} title=${created.title} secret=${created.secret} onClose=${() => setCreated(null)} />`}
    ${revoking && html`<${Confirm} title=${`Revoke key ${revoking.name}?`} message=${`Every request with the key ${revoking.prefix}… is refused from now on and its live connections are closed${tenantId ? '' : ' (if this console signed in with it, you are signed out)'}. This cannot be undone.`}
      confirmLabel=${`Revoke ${revoking.name}`} danger=${true} onConfirm=${() => revoke(revoking)} onCancel=${() => setRevoking(null)} />`}
    ${keys && keys.length === 0 && html`<p class="muted">No keys.</p>`}
    ${keys && keys.length > 0 && html`<table class="stack" data-testid="keys">
      <thead><tr><th scope="col">Name</th><th scope="col">Prefix</th><th scope="col">Scopes</th><th scope="col">State</th><th scope="col">Last used</th><th scope="col">Created</th><th scope="col">Actions</th></tr></thead>
      <tbody>${keys.map((k) => {
        const st = keyState(k);
        return html`<tr key=${k.id} data-key=${k.id}>
          <th scope="row" data-label="Name">${k.name}</th>
          <td data-label="Prefix"><code>${k.prefix}…</code></td>
          <td data-label="Scopes">${k.scopes.join(', ')}</td>
          <td data-label="State" class=${st.cls} data-testid="key-state">${st.text}</td>
          <td data-label="Last used">${k.lastUsedAt ? time(k.lastUsedAt) : 'never'}</td>
          <td data-label="Created">${time(k.createdAt)}</td>
          <td data-label="Actions">${st.live ? html`<button type="button" class="secondary" onClick=${() => setRevoking(k)} aria-label=${`Revoke key ${k.name}`}>Revoke…</button>` : '—'}</td>
        </tr>`;
      })}</tbody>
    </table>`}
  </section>`;
}
