/**
 * A graphql-ws connection watched from outside: whether it was acknowledged,
 * what it received, and how it was closed (a revocation closes it with 4401).
 */
import assert from 'node:assert/strict';
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { eventually } from './app.ts';

export interface Watched {
  client: Client;
  closed: { code: number; reason: string } | null;
  acknowledged: boolean;
  events: unknown[];
  errors: unknown[];
}

export function watch(url: string, token: string | null, query: string): Watched {
  const w: Watched = { client: null as unknown as Client, closed: null, acknowledged: false, events: [], errors: [] };
  w.client = createClient({
    url: url.replace(/^http/, 'ws'),
    webSocketImpl: WebSocket,
    connectionParams: token ? { authorization: `Bearer ${token}` } : {},
    retryAttempts: 0,
    lazy: true,
    on: {
      connected: () => void (w.acknowledged = true),
      closed: (e) => {
        const ev = e as { code: number; reason: string };
        w.closed ??= { code: ev.code, reason: String(ev.reason) };
      },
    },
  });
  w.client.subscribe({ query }, { next: (v) => void w.events.push(v), error: (e) => void w.errors.push(e), complete: () => {} });
  return w;
}

/** Connected, acknowledged, and its subscription running (a tenantUsage push arrives at once; jobsCompleted waits quietly). */
export async function connected(w: Watched): Promise<void> {
  await eventually(async () => (w.acknowledged && w.events.length > 0) || w.closed !== null, 20_000, 20).catch((err: Error) => {
    throw new Error(`${err.message}: acknowledged ${w.acknowledged}, ${w.events.length} events, errors ${JSON.stringify(w.errors)}`);
  });
  assert.equal(w.closed, null, `connection closed early: ${JSON.stringify(w.closed)} ${JSON.stringify(w.errors)}`);
}
