/**
 * Usage events: one CloudEvents 1.0 event per settled charge, for a billing
 * system to ingest exactly once (OpenMeter takes them as they are; each maps
 * one-to-one onto a Stripe meter event, `id` as its `identifier`).
 *
 * Nothing is written for them: they are read from the reservations, the
 * durable record of every settled attempt (one row per attempt, settled
 * exactly once, I5). A reservation settled with a bill is a
 * `com.sluice.usage.charged` event whose id is the reservation's id. A late
 * settlement that changed an expiry's bill (src/dispatch/late-settlement.ts)
 * adds a `com.sluice.usage.corrected` event (id `<reservation id>:corrected`,
 * credits = the difference, negative when credits went back); the charge keeps
 * the bill it was first served with (reservations.expiry_billed). So the sum of
 * a tenant's events' credits is its ledger's billed credits and its usage
 * history's creditsBilled, and an event read again is the same event.
 *
 * Order and the cursor: events are served in (position, id) order, a charge's
 * position being its reservation's creation and a correction's its
 * reconciliation. Only events below a horizon are served: the earliest of the
 * oldest open reservation and the start of the oldest transaction running in
 * Postgres (a lease or settlement in flight may yet commit rows below any later
 * instant). Every row that will ever exist below the horizon is committed and
 * final when it is read, so a cursor never skips an event that commits later;
 * a long transaction holds the horizon back (events come late, never lost).
 * Events go when retention deletes their reservations (JOB_RETENTION_SECONDS).
 */
import type { Sql } from '../db/client.ts';
import { SluiceError } from '../errors.ts';

export const USAGE_EVENT_TYPES = { charged: 'com.sluice.usage.charged', corrected: 'com.sluice.usage.corrected' } as const;
/** The CloudEvents `source` of every usage event. */
export const USAGE_EVENT_SOURCE = '/sluice/usage';
export const MAX_USAGE_EVENTS_PAGE = 10_000;

export interface UsageEventRow {
  kind: 'charged' | 'corrected';
  reservationId: string;
  tenantId: string;
  jobId: string;
  attempt: number;
  /** Microseconds since the epoch of the event's position (its reservation's creation, or its reconciliation), as text. */
  positionMicros: string;
  time: Date;
  credits: number;
  api: string;
  priority: string;
  window: string;
  periodStart: Date;
}

export interface CloudEvent {
  specversion: '1.0';
  type: string;
  source: string;
  id: string;
  time: string;
  subject: string;
  datacontenttype: 'application/json';
  data: { tenantId: string; api: string; priority: string; credits: number; jobId: string; attempt: number; window: string; periodStart: string };
}

export interface UsageCursor {
  positionMicros: string;
  id: string;
}

/** The CloudEvents id of a row: the reservation's id for its charge, with `:corrected` for its correction. Pure. */
export function usageEventId(r: Pick<UsageEventRow, 'kind' | 'reservationId'>): string {
  return r.kind === 'charged' ? r.reservationId : `${r.reservationId}:corrected`;
}

/** The row as a CloudEvents 1.0 event (structured JSON). Pure. */
export function toCloudEvent(r: UsageEventRow): CloudEvent {
  return {
    specversion: '1.0',
    type: USAGE_EVENT_TYPES[r.kind],
    source: USAGE_EVENT_SOURCE,
    id: usageEventId(r),
    time: r.time.toISOString(),
    subject: r.tenantId,
    datacontenttype: 'application/json',
    data: { tenantId: r.tenantId, api: r.api, priority: r.priority, credits: r.credits, jobId: r.jobId, attempt: r.attempt, window: r.window, periodStart: r.periodStart.toISOString() },
  };
}

/** The opaque cursor after this event. Pure. */
export function encodeUsageCursor(r: Pick<UsageEventRow, 'kind' | 'reservationId' | 'positionMicros'>): string {
  return Buffer.from(JSON.stringify([r.positionMicros, usageEventId(r)])).toString('base64url');
}

const EVENT_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(:corrected)?$/;

/** A cursor back into its position; a cursor not made here is BAD_USER_INPUT (field `after`). Pure. */
export function decodeUsageCursor(cursor: string): UsageCursor {
  try {
    const [micros, id] = JSON.parse(Buffer.from(cursor, 'base64url').toString()) as [unknown, unknown];
    if (typeof micros !== 'string' || !/^\d{1,19}$/.test(micros) || BigInt(micros) > 9_223_372_036_854_775_807n) throw new Error('bad position');
    if (typeof id !== 'string' || !EVENT_ID.test(id)) throw new Error('bad id');
    return { positionMicros: micros, id };
  } catch {
    throw new SluiceError('BAD_USER_INPUT', 'invalid cursor: pass back an endCursor (or a line\'s sluicecursor) as given', { field: 'after' });
  }
}

/**
 * The instant below which every usage event is committed and final (header). Two statements, in
 * this order, each with its own snapshot: the running transactions first, then the open
 * reservations (a transaction not running at the first either committed before it, so the second
 * sees its rows, or began after it, so its rows are above the horizon).
 */
async function horizon(sql: Sql): Promise<Date> {
  const [running] = await sql`
    select least(clock_timestamp(), min(xact_start)) as at from pg_stat_activity
    where xact_start is not null and pid <> pg_backend_pid() and backend_type = 'client backend'`;
  const [open] = await sql`select min(created_at) as at from reservations where settled_at is null`;
  const a = running!.at as Date;
  const b = open!.at as Date | null;
  return b !== null && b < a ? b : a;
}

/** One page of usage events after `after` (null: from the oldest kept), the tenant's or (null) everyone's. */
export async function readUsageEvents(sql: Sql, q: { tenantId: string | null; after: UsageCursor | null; limit: number }): Promise<{ rows: UsageEventRow[]; horizon: Date }> {
  const until = await horizon(sql);
  const afterMicros = q.after?.positionMicros ?? '0';
  const afterId = q.after?.id ?? '';
  const tenant = q.tenantId;
  // Positions compare in microseconds (a JavaScript Date holds milliseconds); ids in byte order (collate "C").
  const after = sql`('epoch'::timestamptz + ${afterMicros}::bigint * interval '1 microsecond', ${afterId}::text collate "C")`;
  const rows = await sql`
    select *, (extract(epoch from pos) * 1000000)::bigint::text as pos_micros from (
      (select 'charged' as kind, r.id::text collate "C" as eid, r.id as rid, r.tenant_id, r.job_id, r.attempt, r.created_at as pos,
          r.settled_at as time, coalesce(r.expiry_billed, r.billed) as credits, r."window", r.period_start, j.api, j.priority
        from reservations r left join jobs j on j.id = r.job_id
        where r.created_at < ${until} and r.settled_at is not null and coalesce(r.expiry_billed, r.billed) > 0
          and (${tenant}::uuid is null or r.tenant_id = ${tenant}::uuid)
          and (r.created_at, r.id::text collate "C") > ${after}
        order by r.created_at, 2 limit ${q.limit})
      union all
      (select 'corrected', (r.id::text || ':corrected') collate "C", r.id, r.tenant_id, r.job_id, r.attempt, r.reconciled_at,
          r.reconciled_at, r.billed - r.expiry_billed, r."window", r.period_start, j.api, j.priority
        from reservations r left join jobs j on j.id = r.job_id
        where r.reconciled_at is not null and r.reconciled_at < ${until} and r.billed <> r.expiry_billed
          and (${tenant}::uuid is null or r.tenant_id = ${tenant}::uuid)
          and (r.reconciled_at, (r.id::text || ':corrected') collate "C") > ${after}
        order by r.reconciled_at, 2 limit ${q.limit})
    ) e
    order by pos, eid
    limit ${q.limit}`;
  return {
    horizon: until,
    rows: rows.map((r) => ({
      kind: r.kind as 'charged' | 'corrected',
      reservationId: r.rid as string,
      tenantId: r.tenant_id as string,
      jobId: r.job_id as string,
      attempt: r.attempt as number,
      positionMicros: r.pos_micros as string,
      time: r.time as Date,
      credits: Number(r.credits),
      api: (r.api as string | null) ?? 'unknown',
      priority: (r.priority as string | null) ?? 'UNKNOWN',
      window: r.window as string,
      periodStart: r.period_start as Date,
    })),
  };
}
