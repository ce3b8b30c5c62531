/**
 * GET /usage.csv: usage history as CSV, for billing systems and spreadsheets.
 * Same credentials and rules as GraphQL (Authorization: Bearer): a tenant key
 * with the READ scope gets its own history, charged to its request budget like
 * the GraphQL query it mirrors (USAGE_CSV_COST; RateLimit headers, 429
 * THROTTLED over budget); the admin token names the tenant with `tenantId`
 * (deleted tenants included). Query: from, to (ISO-8601), granularity (HOUR,
 * DAY, MONTH; default DAY), groupBy (comma-separated API, PRIORITY).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { parse } from 'graphql';
import { SluiceError } from '../errors.ts';
import { authenticate, type Services } from '../graphql/context.ts';
import { requestedCost } from '../graphql/cost.ts';
import { asId } from '../graphql/ids.ts';
import { schema } from '../graphql/schema.ts';
import { usageArgs } from '../graphql/schema/usage.ts';
import { missingScopes } from '../tenants/api-keys.ts';
import { MAX_USAGE_ROWS, usageHistory, type Granularity, type UsageGroup, type UsageRow } from '../usage/store.ts';
import { chargeRoute } from './budget.ts';

export const USAGE_CSV_PATH = '/usage.csv';

const COLUMNS = ['start', 'api', 'priority', 'calls', 'succeeded', 'failed', 'creditsBilled', 'creditsRefunded', 'latencyP95Ms'] as const;

function cell(v: unknown): string {
  if (v === null || v === undefined) return '';
  const s = v instanceof Date ? v.toISOString() : String(v);
  return /[",\n\r]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
}

/** The CSV text of history rows (RFC 4180, header line first); pure. */
export function toCsv(rows: readonly UsageRow[]): string {
  return [COLUMNS.join(','), ...rows.map((r) => COLUMNS.map((c) => cell(r[c])).join(','))].join('\r\n') + '\r\n';
}

/** The query string's arguments, checked; pure. */
export function parseUsageQuery(params: URLSearchParams): { from: Date; to: Date; granularity: Granularity; groupBy: UsageGroup[]; tenantId: string | null } {
  const date = (name: string) => {
    const raw = params.get(name);
    const d = raw ? new Date(raw) : null;
    if (!d || Number.isNaN(d.getTime())) throw new SluiceError('BAD_USER_INPUT', `\`${name}\` must be an ISO-8601 timestamp`, { field: name });
    return d;
  };
  const granularity = (params.get('granularity') ?? 'DAY').toUpperCase();
  if (!['HOUR', 'DAY', 'MONTH'].includes(granularity)) throw new SluiceError('BAD_USER_INPUT', '`granularity` must be HOUR, DAY or MONTH', { field: 'granularity' });
  const groupBy = (params.get('groupBy') ?? '').split(',').map((s) => s.trim().toUpperCase()).filter(Boolean);
  for (const g of groupBy) if (g !== 'API' && g !== 'PRIORITY') throw new SluiceError('BAD_USER_INPUT', '`groupBy` takes API and PRIORITY', { field: 'groupBy' });
  const args = usageArgs({ from: date('from'), to: date('to'), granularity: granularity as Granularity, groupBy: groupBy as UsageGroup[] });
  return { ...args, tenantId: params.get('tenantId') };
}

/**
 * What one download costs a tenant's request budget: what the GraphQL query it mirrors,
 * `{ me { usageHistory(from, to) { … } } }`, is priced (graphql/cost.ts: the tenant, one statement,
 * a list of 50 rows: 52 points), so neither door is the cheaper way to the same rows.
 */
export const USAGE_CSV_COST: number = requestedCost(schema, parse('query($from: DateTime!, $to: DateTime!) { me { usageHistory(from: $from, to: $to) { start } } }'), null, null)!.total;

function refuse(res: ServerResponse, status: number, code: string, message: string, extensions: Record<string, unknown> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ message, extensions: { code, ...extensions } }] }));
}

export async function serveUsageCsv(req: IncomingMessage, res: ServerResponse, services: Services): Promise<void> {
  const auth = await authenticate(services, req.headers.authorization);
  if (auth.kind === 'anonymous' || auth.kind === 'invalid') return refuse(res, 401, 'UNAUTHENTICATED', 'send Authorization: Bearer <api key>');
  if (auth.kind === 'tenant' && missingScopes(auth.key, ['READ']).length > 0) return refuse(res, 403, 'FORBIDDEN', 'this API key lacks the READ scope usage history needs');
  let q: ReturnType<typeof parseUsageQuery>;
  let tenantId: string;
  try {
    q = parseUsageQuery(new URL(req.url ?? '/', 'http://localhost').searchParams);
    if (auth.kind === 'tenant') tenantId = auth.tenant.id;
    else if (q.tenantId) tenantId = asId(q.tenantId, 'tenant', 'tenantId');
    else throw new SluiceError('BAD_USER_INPUT', 'the admin token names the tenant: ?tenantId=<id>', { field: 'tenantId' });
  } catch (err) {
    if (err instanceof SluiceError) return refuse(res, 400, err.code, err.message, err.extensions);
    throw err;
  }
  const charge = await chargeRoute(services.budget, auth.kind === 'tenant' ? auth.tenant : null, USAGE_CSV_COST);
  if (charge.refused) {
    res.writeHead(charge.refused.status, { ...charge.refused.headers, 'content-type': 'application/json' }).end(JSON.stringify(charge.refused.body));
    return;
  }
  const rows = await usageHistory(services.sql, { tenantId, from: q.from, to: q.to, granularity: q.granularity, groupBy: q.groupBy });
  if (rows.length > MAX_USAGE_ROWS) return refuse(res, 400, 'BAD_USER_INPUT', `more than ${MAX_USAGE_ROWS} rows: ask for a shorter period or a coarser granularity`);
  const name = `usage-${tenantId}-${q.from.toISOString().slice(0, 10)}-${q.to.toISOString().slice(0, 10)}.csv`;
  res.writeHead(200, { ...charge.headers, 'content-type': 'text/csv; charset=utf-8', 'content-disposition': `attachment; filename="${name}"` }).end(toCsv(rows));
}
