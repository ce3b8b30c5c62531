// The Sluice console: sign-in, the live connection, and the view for the caller's role.
// The server enforces every rule; the page only reflects what the token may see.
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { connect, gql, TOKEN_KEY } from './api.js';
import { OperatorView } from './operator.js';
import { TenantView } from './tenant.js';

/** Admin token or tenant key? `me` answers a tenant, and refuses the admin with FORBIDDEN. */
async function whoIs(token) {
  try {
    const data = await gql(token, '{ me { tenant { id name tier } } }');
    return { role: 'tenant', tenant: data.me.tenant };
  } catch (e) {
    if (e.code === 'FORBIDDEN') return { role: 'admin' };
    throw e;
  }
}

function SignIn({ onSignIn, message }) {
  const [token, setToken] = useState('');
  const [error, setError] = useState(message ?? null);
  const [busy, setBusy] = useState(false);
  const submit = async (ev) => {
    ev.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const who = await whoIs(token.trim());
      onSignIn(token.trim(), who);
    } catch (e) {
      setError(e.code === 'UNAUTHENTICATED' ? 'That token is not valid: paste the admin token or a tenant key.' : e.message);
    } finally {
      setBusy(false);
    }
  };
  return html`<main class="signin">
    <h1>Sluice console</h1>
    <p>Sign in with the admin token (operators) or a tenant API key (tenants).</p>
    <form onSubmit=${submit}>
      <label for="token">Token</label>
      <input id="token" name="token" type="password" autocomplete="off" required value=${token} onInput=${(e) => setToken(e.currentTarget.value)} />
      <button type="submit" disabled=${busy}>${busy ? 'Signing in…' : 'Sign in'}</button>
      ${error && html`<p class="error" role="alert">${error}</p>`}
    </form>
    <p class="muted">The token stays in this tab only (sessionStorage). GraphiQL is at <a href="/graphql">/graphql</a>.</p>
  </main>`;
}

// graphql-ws gives up after these close codes (a bug on one side, not the network): say so rather than spin.
const FATAL = new Set([4400, 4004, 4005, 4406, 4409, 4429, 4500]);

function Banner({ state }) {
  if (state === 'connected' || state === 'idle') return null;
  if (state === 'stopped') {
    return html`<div class="banner" role="alert" data-testid="stopped">Live updates stopped: reload the page to reconnect.</div>`;
  }
  return html`<div class="banner" role="status" aria-live="polite" data-testid="reconnecting">
    ${state === 'first' ? 'Connecting to live updates…' : 'Live updates interrupted: reconnecting…'}
  </div>`;
}

function App() {
  const [session, setSession] = useState(null); // { token, role, tenant }
  const [client, setClient] = useState(null);
  const [conn, setConn] = useState('idle');
  const [message, setMessage] = useState(null);
  const [checking, setChecking] = useState(Boolean(sessionStorage.getItem(TOKEN_KEY)));

  const signOut = (why = null) => {
    sessionStorage.removeItem(TOKEN_KEY);
    setSession(null);
    setMessage(why);
  };

  // A token from earlier in this tab: check it again rather than trust it.
  useEffect(() => {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) return;
    whoIs(token)
      .then((who) => setSession({ token, ...who }))
      .catch(() => sessionStorage.removeItem(TOKEN_KEY))
      .finally(() => setChecking(false));
  }, []);

  useEffect(() => {
    if (!session) return;
    let everConnected = false;
    const c = connect(session.token, (state, event) => {
      if (state === 'connected') everConnected = true;
      if (state === 'closed' && event && (event.code === 4401 || event.code === 4403)) {
        signOut('The server no longer accepts this token (revoked or rotated). Sign in again.');
        return;
      }
      if (state === 'closed' && event && FATAL.has(event.code)) {
        setConn('stopped');
        return;
      }
      setConn(state === 'connected' ? 'connected' : everConnected ? 'reconnecting' : 'first');
    });
    setClient(c);
    return () => {
      c.dispose();
      setClient(null);
      setConn('idle');
    };
  }, [session?.token]);

  if (checking) return html`<p class="loading">Checking your session…</p>`;
  if (!session) {
    return html`<${SignIn}
      message=${message}
      onSignIn=${(token, who) => {
        sessionStorage.setItem(TOKEN_KEY, token);
        setMessage(null);
        setSession({ token, ...who });
      }}
    />`;
  }
  return html`<div class="shell">
    <header class="top">
      <span class="brand">Sluice</span>
      <span class="who">${session.role === 'admin' ? 'Operator' : `Tenant: ${session.tenant.name}`}</span>
      <span class=${`live ${conn}`} aria-hidden="true">${conn === 'connected' ? '● live' : '○ offline'}</span>
      <a href="/graphql" class="link">GraphiQL</a>
      <button type="button" class="secondary" onClick=${() => signOut()}>Sign out</button>
    </header>
    <${Banner} state=${conn} />
    ${client &&
    (session.role === 'admin'
      ? html`<${OperatorView} token=${session.token} client=${client} />`
      : html`<${TenantView} token=${session.token} client=${client} tenant=${session.tenant} />`)}
  </div>`;
}

const root = document.getElementById('root');
root.textContent = ''; // the loading note goes; Preact owns the element from here
render(html`<${App} />`, root);
