/**
 * The one front door: every path this server answers, and with which
 * methods. Anything else is 404 NOT_FOUND (or 405 METHOD_NOT_ALLOWED on a
 * known path) from the request line alone, before any credential is looked
 * up or any body is read. Yoga would otherwise also serve `/graphql/` and
 * `/<anything>/graphql`, where the limits of the front door did not apply.
 * Pure.
 */
import { CONSOLE_PATH } from './console.ts';
import { USAGE_CSV_PATH } from './usage-csv.ts';
import { USAGE_EVENTS_PATH } from './usage-events.ts';

export const GRAPHQL_PATH = '/graphql';

export type RouteKind = 'graphql' | 'usage-csv' | 'usage-events' | 'ops' | 'console' | 'root';

export type Route = { kind: RouteKind } | { kind: 'not-found' } | { kind: 'method-not-allowed'; allow: readonly string[] };

const READ = ['GET', 'HEAD'] as const;

/** Exact paths → what serves them and the methods it takes. */
const EXACT: Record<string, { kind: RouteKind; methods: readonly string[] }> = {
  // OPTIONS: CORS preflights, answered by Yoga.
  [GRAPHQL_PATH]: { kind: 'graphql', methods: ['GET', 'POST', 'OPTIONS'] },
  [USAGE_CSV_PATH]: { kind: 'usage-csv', methods: ['GET'] },
  [USAGE_EVENTS_PATH]: { kind: 'usage-events', methods: ['GET'] },
  '/healthz': { kind: 'ops', methods: READ },
  '/readyz': { kind: 'ops', methods: READ },
  '/metrics': { kind: 'ops', methods: READ },
  '/': { kind: 'root', methods: READ },
};

/** Which documented door a request line names. */
export function route(method: string | undefined, pathname: string): Route {
  const m = (method ?? 'GET').toUpperCase();
  const exact = EXACT[pathname];
  const entry = exact ?? (pathname === CONSOLE_PATH || pathname.startsWith(`${CONSOLE_PATH}/`) ? { kind: 'console' as const, methods: READ } : undefined);
  if (!entry) return { kind: 'not-found' };
  if (!entry.methods.includes(m)) return { kind: 'method-not-allowed', allow: entry.methods };
  return { kind: entry.kind };
}

/** The documented paths, for the 404's message. */
export const DOCUMENTED_PATHS = [GRAPHQL_PATH, USAGE_CSV_PATH, USAGE_EVENTS_PATH, '/healthz', '/readyz', '/metrics', `${CONSOLE_PATH}/`] as const;

export function notFound(method: string | undefined, pathname: string): { message: string; extensions: Record<string, unknown> } {
  return {
    message: `nothing is served at ${(method ?? 'GET').toUpperCase()} ${pathname.slice(0, 200)}: the API is at ${GRAPHQL_PATH} (also ${DOCUMENTED_PATHS.slice(1).join(', ')})`,
    extensions: { code: 'NOT_FOUND' },
  };
}

export function methodNotAllowed(method: string | undefined, pathname: string, allow: readonly string[]): { message: string; extensions: Record<string, unknown> } {
  return {
    message: `${pathname} does not take ${(method ?? 'GET').toUpperCase()}: use ${allow.filter((m) => m !== 'OPTIONS').join(' or ')}`,
    extensions: { code: 'METHOD_NOT_ALLOWED', allow: [...allow] },
  };
}
