// Talking to Sluice: GraphQL over HTTP for queries and mutations, graphql-ws for live updates.
import { createClient } from 'graphql-ws';

export const TOKEN_KEY = 'sluice.token';

/** A GraphQL error with the server's extensions.code, and Retry-After when the server sent one. */
export class ApiError extends Error {
  constructor(message, code, extra = {}) {
    super(message);
    this.code = code;
    Object.assign(this, extra);
  }
}

export async function gql(token, query, variables = {}) {
  const res = await fetch('/graphql', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify({ query, variables }),
  });
  const body = await res.json().catch(() => ({ errors: [{ message: `HTTP ${res.status}`, extensions: { code: 'HTTP_' + res.status } }] }));
  if (body.errors?.length) {
    const e = body.errors[0];
    throw new ApiError(e.message, e.extensions?.code ?? 'ERROR', { status: res.status, retryAfter: res.headers.get('retry-after'), extensions: e.extensions });
  }
  return body.data;
}

/**
 * One graphql-ws connection for the signed-in session. It retries for ever
 * (with backoff capped at 5 s) unless the server refuses the credential;
 * `onState` hears 'connecting', 'connected', 'closed' (with the close event).
 */
export function connect(token, onState) {
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/graphql`;
  return createClient({
    url,
    connectionParams: { authorization: `Bearer ${token}` },
    lazy: false,
    keepAlive: 10_000,
    retryAttempts: Number.MAX_SAFE_INTEGER,
    shouldRetry: (e) => !(e && typeof e.code === 'number' && (e.code === 4401 || e.code === 4403)),
    retryWait: (retries) => new Promise((r) => setTimeout(r, Math.min(5000, 500 * 2 ** retries))),
    onNonLazyError: () => {},
    on: {
      connecting: () => onState('connecting'),
      connected: () => onState('connected'),
      closed: (event) => onState('closed', event),
    },
  });
}

/** Subscribes; returns the function that stops it. */
export function subscribe(client, query, variables, onData, onError = () => {}) {
  return client.subscribe(
    { query, variables },
    {
      next: (msg) => (msg.errors ? onError(new ApiError(msg.errors[0].message, msg.errors[0].extensions?.code ?? 'ERROR')) : onData(msg.data)),
      error: (err) => onError(Array.isArray(err) ? new ApiError(err[0]?.message ?? 'subscription error', err[0]?.extensions?.code ?? 'ERROR') : err),
      complete: () => {},
    },
  );
}
