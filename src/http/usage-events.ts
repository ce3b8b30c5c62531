/**
 * GET /usage/events: usage events as NDJSON (one CloudEvents 1.0 event per
 * line, application/x-ndjson), for a billing pipeline to poll (src/usage/events.ts).
 * Same credentials as GraphQL: the admin token reads every tenant's events (or
 * one tenant's with `tenantId`), a tenant key with the READ scope its own,
 * charged to its request budget (usageEventsCost; RateLimit headers, 429
 * THROTTLED over budget).
 * Query: `after` (a cursor), `limit` (1 to 10,000; default 1,000). Each line
 * carries its own cursor as the CloudEvents extension attribute `sluicecursor`;
 * the response's `Sluice-Next-Cursor` header is the cursor to ask with next
 * (the `after` given when no event is new yet), and `Link: <…>; rel="next"` the URL.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { SluiceError } from '../errors.ts';
import { authenticate, type Services } from '../graphql/context.ts';
import { usageEventsTenant } from '../graphql/schema/usage.ts';
import { missingScopes } from '../tenants/api-keys.ts';
import { chargeRoute } from './budget.ts';
import { decodeUsageCursor, encodeUsageCursor, MAX_USAGE_EVENTS_PAGE, readUsageEvents, toCloudEvent, type UsageEventRow } from '../usage/events.ts';

export const USAGE_EVENTS_PATH = '/usage/events';
const DEFAULT_LIMIT = 1_000;

function refuse(res: ServerResponse, status: number, code: string, message: string, extensions: Record<string, unknown> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ message, extensions: { code, ...extensions } }] }));
}

/**
 * What one page costs a tenant's request budget: its one statement, and a point per 100 events
 * asked for (`limit`), as a bulk submission pays a point per 100 items: a billing pipeline's
 * default page of 1,000 costs 11 points, the largest (10,000) 101. Lines are serialized rows, not
 * objects resolved one by one, so they are priced below GraphQL's point per object. Pure.
 */
export function usageEventsCost(limit: number): number {
  return 1 + Math.ceil(limit / 100);
}

/** The query string's arguments, checked; pure. */
export function parseUsageEventsQuery(params: URLSearchParams): { after: string | null; limit: number; tenantId: string | null } {
  const rawLimit = params.get('limit');
  const limit = rawLimit === null ? DEFAULT_LIMIT : Number(rawLimit);
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_USAGE_EVENTS_PAGE) {
    throw new SluiceError('BAD_USER_INPUT', `\`limit\` must be an integer from 1 to ${MAX_USAGE_EVENTS_PAGE}`, { field: 'limit' });
  }
  const after = params.get('after') || null;
  if (after !== null) decodeUsageCursor(after);
  return { after, limit, tenantId: params.get('tenantId') || null };
}

/** The NDJSON body: each event with its cursor as the `sluicecursor` extension attribute; pure. */
export function toNdjson(rows: readonly UsageEventRow[]): string {
  return rows.map((r) => JSON.stringify({ ...toCloudEvent(r), sluicecursor: encodeUsageCursor(r) }) + '\n').join('');
}

export async function serveUsageEvents(req: IncomingMessage, res: ServerResponse, services: Services): Promise<void> {
  const auth = await authenticate(services, req.headers.authorization);
  if (auth.kind === 'anonymous' || auth.kind === 'invalid') return refuse(res, 401, 'UNAUTHENTICATED', 'send Authorization: Bearer <api key>');
  if (auth.kind === 'tenant' && missingScopes(auth.key, ['READ']).length > 0) return refuse(res, 403, 'FORBIDDEN', 'this API key lacks the READ scope usage events need');
  let q: ReturnType<typeof parseUsageEventsQuery>;
  let tenantId: string | null;
  try {
    q = parseUsageEventsQuery(new URL(req.url ?? '/', 'http://localhost').searchParams);
    tenantId = usageEventsTenant({ auth }, q.tenantId);
  } catch (err) {
    if (err instanceof SluiceError) return refuse(res, err.code === 'FORBIDDEN' ? 403 : err.code === 'NOT_FOUND' ? 404 : 400, err.code, err.message, err.extensions);
    throw err;
  }
  const charge = await chargeRoute(services.budget, auth.kind === 'tenant' ? auth.tenant : null, usageEventsCost(q.limit));
  if (charge.refused) {
    res.writeHead(charge.refused.status, { ...charge.refused.headers, 'content-type': 'application/json' }).end(JSON.stringify(charge.refused.body));
    return;
  }
  const { rows } = await readUsageEvents(services.sql, { tenantId, after: q.after ? decodeUsageCursor(q.after) : null, limit: q.limit });
  const next = rows.length > 0 ? encodeUsageCursor(rows.at(-1)!) : q.after;
  const headers: Record<string, string> = { ...charge.headers, 'content-type': 'application/x-ndjson; charset=utf-8', 'cache-control': 'no-store' };
  if (next !== null) {
    const link = new URLSearchParams({ after: next, limit: String(q.limit), ...(q.tenantId ? { tenantId: q.tenantId } : {}) });
    headers['sluice-next-cursor'] = next;
    headers.link = `<${USAGE_EVENTS_PATH}?${link}>; rel="next"`;
  }
  res.writeHead(200, headers).end(toNdjson(rows));
}
