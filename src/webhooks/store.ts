/**
 * Owns webhook_endpoints and webhook_deliveries (the trigger sluice_jobs_webhooks creates the
 * deliveries; every other write is here). Every tenant-facing statement is scoped by tenant id,
 * so one tenant never reads, changes or deletes another's endpoints or deliveries.
 */
import type postgres from 'postgres';
import type { Sql, Tx } from '../db/client.ts';
import type { DeliveryStatus, JobJson, WebhookEvent } from './policy.ts';

export interface EndpointRow {
  id: string;
  tenantId: string;
  url: string;
  events: WebhookEvent[];
  enabled: boolean;
  disabledReason: string | null;
  disabledAt: Date | null;
  failingSince: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

export interface DeliveryRow {
  id: string;
  tenantId: string;
  endpointId: string;
  jobId: string;
  event: WebhookEvent;
  status: DeliveryStatus;
  attempts: number;
  nextAttemptAt: Date;
  lastAttemptAt: Date | null;
  responseStatus: number | null;
  lastError: string | null;
  createdAt: Date;
  /** created_at in microseconds, as text: the page cursor (a Date would lose the microseconds). */
  createdAtMicros: string;
}

const ENDPOINT_COLUMNS = 'id, tenant_id, url, events, enabled, disabled_reason, disabled_at, failing_since, created_at, updated_at';

function endpointOf(r: postgres.Row): EndpointRow {
  return {
    id: r.id,
    tenantId: r.tenant_id,
    url: r.url,
    events: r.events,
    enabled: r.enabled,
    disabledReason: r.disabled_reason,
    disabledAt: r.disabled_at,
    failingSince: r.failing_since,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

function deliveryOf(r: postgres.Row): DeliveryRow {
  return {
    id: r.id,
    tenantId: r.tenant_id,
    endpointId: r.endpoint_id,
    jobId: r.job_id,
    event: r.event,
    status: r.status,
    attempts: r.attempts,
    nextAttemptAt: r.next_attempt_at,
    lastAttemptAt: r.last_attempt_at,
    responseStatus: r.response_status,
    lastError: r.last_error,
    createdAt: r.created_at,
    createdAtMicros: r.created_at_micros,
  };
}

/* ---- Endpoints ---- */

/**
 * Inserts the endpoint unless the tenant has `max` already (null: it had). The count and the insert
 * run in one transaction under a lock on the tenant's endpoints (an advisory transaction lock), so
 * parallel creates are counted one after another: no two see the same count. `secret` is stored as
 * given (sealed by the caller, secret-box.ts).
 */
export async function insertEndpoint(sql: Sql, e: { tenantId: string; url: string; events: readonly string[]; secret: string }, max: number): Promise<EndpointRow | null> {
  return sql.begin(async (tx) => {
    // Its own statement: a statement's snapshot is taken before it runs, so a count in the lock's own
    // statement could miss an insert committed while it waited.
    await tx`select pg_advisory_xact_lock(hashtext('sluice_webhook_endpoints'), hashtext(${e.tenantId}))`;
    const [row] = await tx.unsafe(
      `insert into webhook_endpoints (tenant_id, url, events, secret)
       select $1, $2, $3::text[], $4
       where (select count(*) from webhook_endpoints where tenant_id = $1) < $5
       returning ${ENDPOINT_COLUMNS}`,
      [e.tenantId, e.url, e.events as string[], e.secret, max],
    );
    return row ? endpointOf(row) : null;
  }) as Promise<EndpointRow | null>;
}

/** Deliveries waiting (PENDING or SENDING) per endpoint, and the oldest one's event time. */
export async function endpointBacklogs(sql: Tx, endpointIds: readonly string[]): Promise<Map<string, { pending: number; oldestAt: Date | null }>> {
  const rows = await sql`
    select endpoint_id, count(*)::int as n, min(created_at) as oldest from webhook_deliveries
    where endpoint_id = any(${endpointIds as string[]}::uuid[]) and status in ('PENDING', 'SENDING')
    group by endpoint_id`;
  return new Map(rows.map((r) => [r.endpoint_id as string, { pending: r.n as number, oldestAt: r.oldest as Date | null }]));
}

/**
 * Seals every secret not sealed under the sealing key (legacy plaintext, or an older key), a page at
 * a time; each update is fenced on the values it read, so nodes doing this at once (or a rotation
 * meanwhile) never overwrite each other. Returns how many rows changed and how many could not be
 * opened (their key is not configured: they are left as they are).
 */
export async function resealSecrets(sql: Sql, box: { isCurrent(s: string): boolean; open(s: string): string; seal(s: string): string }, sealingKeyId: string): Promise<{ resealed: number; unreadable: number }> {
  const current = `v1:${sealingKeyId}:%`;
  let after = '00000000-0000-0000-0000-000000000000';
  let resealed = 0;
  let unreadable = 0;
  for (;;) {
    const rows = await sql`
      select id, secret, previous_secret from webhook_endpoints
      where id > ${after}::uuid and (secret not like ${current} or previous_secret not like ${current})
      order by id limit 200`;
    if (rows.length === 0) return { resealed, unreadable };
    after = rows.at(-1)!.id;
    for (const r of rows) {
      let secret: string;
      let previous: string | null;
      try {
        secret = box.isCurrent(r.secret) ? r.secret : box.seal(box.open(r.secret));
        previous = r.previous_secret === null || box.isCurrent(r.previous_secret) ? r.previous_secret : box.seal(box.open(r.previous_secret));
      } catch {
        unreadable++;
        continue;
      }
      const changed = await sql`
        update webhook_endpoints set secret = ${secret}, previous_secret = ${previous}
        where id = ${r.id} and secret = ${r.secret} and previous_secret is not distinct from ${r.previous_secret}`;
      resealed += changed.count;
    }
  }
}

export async function listEndpoints(sql: Tx, tenantId: string): Promise<EndpointRow[]> {
  const rows = await sql.unsafe(`select ${ENDPOINT_COLUMNS} from webhook_endpoints where tenant_id = $1 order by created_at, id`, [tenantId]);
  return rows.map(endpointOf);
}

export async function getEndpoint(sql: Tx, tenantId: string, id: string): Promise<EndpointRow | null> {
  const [row] = await sql.unsafe(`select ${ENDPOINT_COLUMNS} from webhook_endpoints where tenant_id = $1 and id = $2`, [tenantId, id]);
  return row ? endpointOf(row) : null;
}

/**
 * Changes what is given (undefined: unchanged). Enabling clears the disabled mark and the failure
 * run, and makes the deliveries it kept waiting due now; disabling by hand says who did
 * (`disabledBy`). `tenantId` null: any tenant's endpoint (the admin's path).
 */
export async function updateEndpoint(
  sql: Tx,
  tenantId: string | null,
  id: string,
  change: { url?: string | undefined; events?: readonly string[] | undefined; enabled?: boolean | undefined },
  disabledBy: 'DISABLED_BY_TENANT' | 'DISABLED_BY_OPERATOR' = 'DISABLED_BY_TENANT',
): Promise<EndpointRow | null> {
  const enabled = change.enabled ?? null;
  const [row] = await sql.unsafe(
    `update webhook_endpoints set
       url = coalesce($3, url),
       events = coalesce($4::text[], events),
       enabled = coalesce($5, enabled),
       disabled_reason = case when $5 is true then null when $5 is false and enabled then $6 else disabled_reason end,
       disabled_at = case when $5 is true then null when $5 is false and enabled then now() else disabled_at end,
       failing_since = case when $5 is true then null else failing_since end,
       updated_at = now()
     where ($1::uuid is null or tenant_id = $1::uuid) and id = $2
     returning ${ENDPOINT_COLUMNS}`,
    [tenantId, id, change.url ?? null, (change.events as string[] | undefined) ?? null, enabled, disabledBy],
  );
  if (row && enabled === true) {
    await sql`update webhook_deliveries set next_attempt_at = now(), updated_at = now() where endpoint_id = ${id} and status = 'PENDING' and next_attempt_at > now()`;
  }
  return row ? endpointOf(row) : null;
}

/** Deletes the endpoint and (cascade) its deliveries; false when the tenant has no such endpoint. */
export async function deleteEndpoint(sql: Tx, tenantId: string, id: string): Promise<boolean> {
  const r = await sql`delete from webhook_endpoints where tenant_id = ${tenantId} and id = ${id}`;
  return r.count > 0;
}

/** A new secret; the old one is still signed with until `overlapSeconds` from now. */
export async function rotateSecret(sql: Tx, tenantId: string, id: string, secret: string, overlapSeconds: number): Promise<EndpointRow | null> {
  const [row] = await sql.unsafe(
    `update webhook_endpoints set previous_secret = secret, previous_secret_until = now() + make_interval(secs => $4),
       secret = $3, updated_at = now()
     where tenant_id = $1 and id = $2 returning ${ENDPOINT_COLUMNS}`,
    [tenantId, id, secret, overlapSeconds],
  );
  return row ? endpointOf(row) : null;
}

/* ---- Deliveries: the tenant's view ---- */

export interface DeliveryFilter {
  endpointId?: string | undefined;
  status?: DeliveryStatus | undefined;
  jobId?: string | undefined;
}

/** A page of the tenant's deliveries, newest first, after the cursor (created_at micros, id). */
export async function listDeliveries(sql: Tx, tenantId: string, filter: DeliveryFilter, limit: number, after: { createdAtMicros: string; id: string } | null): Promise<DeliveryRow[]> {
  const rows = await sql`
    select d.*, (extract(epoch from d.created_at) * 1000000)::bigint::text as created_at_micros
    from webhook_deliveries d
    where d.tenant_id = ${tenantId}
      ${filter.endpointId ? sql`and d.endpoint_id = ${filter.endpointId}` : sql``}
      ${filter.status ? sql`and d.status = ${filter.status}` : sql``}
      ${filter.jobId ? sql`and d.job_id = ${filter.jobId}` : sql``}
      ${after ? sql`and (d.created_at, d.id) < (to_timestamp(${after.createdAtMicros}::bigint / 1000000.0), ${after.id}::uuid)` : sql``}
    order by d.created_at desc, d.id desc
    limit ${limit}`;
  return rows.map(deliveryOf);
}

/* ---- Deliveries: the sender ---- */

export interface ClaimedDelivery {
  id: string;
  endpointId: string;
  tenantId: string;
  event: WebhookEvent;
  attempts: number;
  createdAt: Date;
  url: string;
  /** The current secret first, then the previous one while its overlap lasts (as stored: sealed). */
  secrets: string[];
  /** The job's row as first sent; null when the job is gone (deleted before its first attempt). */
  payload: JobJson | null;
  /** Postgres's clock at the claim (for the timestamp header and the retry schedule). */
  now: Date;
}

/**
 * Claims up to `limit` due deliveries of enabled endpoints, at most `perEndpoint` sending at once
 * per endpoint (rows SENDING with a live claim count), and at most each tenant's allowance
 * (budget.ts: `allowances.limited[tenant]`, else `allowances.fallback`). Each endpoint offers its
 * oldest due deliveries up to its free slots; the slots are handed out round-robin across tenants
 * first (every tenant's first, then every second, ...) and across each tenant's endpoints within
 * that, so neither a tenant with many endpoints nor one with a backlog of thousands holds back
 * another tenant's deliveries, and one busy or slow endpoint cannot take every slot. A tenant whose
 * allowance is 0 is not looked at. One statement: the endpoints with due work are locked
 * (`for no key update skip locked`: no wait on the trigger's KEY SHARE, and a claim running on
 * another node skips them), so two nodes never count one endpoint's slots at once.
 * Claimed rows are SENDING until now + claimSeconds: a node that dies mid-send leaves them due
 * again then (at least once). `finished`: this node's attempts that ended but are not recorded
 * yet; their slots are free (they stay SENDING, so no one claims them meanwhile), which lets a
 * claim run beside the recording instead of after it. The first claim stores the job's row: every
 * retry sends the same body. Secrets come back as stored (sealed: secret-box.ts opens them).
 */
export async function claimDue(
  sql: Tx,
  o: { limit: number; perEndpoint: number; claimSeconds: number; finished: readonly string[]; allowances?: { fallback: number; limited: Record<string, number> } },
): Promise<ClaimedDelivery[]> {
  if (o.limit <= 0) return [];
  const fallback = o.allowances?.fallback ?? o.limit;
  const limited = sql.json((o.allowances?.limited ?? {}) as never);
  const exhausted = Object.entries(o.allowances?.limited ?? {}).filter(([, n]) => n <= 0).map(([t]) => t);
  const rows = await sql`
    with endpoints as (
      select e.id, e.tenant_id from webhook_endpoints e
      where e.enabled and not (e.tenant_id = any(${exhausted}::uuid[])) and exists (
        select 1 from webhook_deliveries d
        where d.endpoint_id = e.id and d.status in ('PENDING', 'SENDING') and d.next_attempt_at <= now()
          and (d.status = 'PENDING' or d.locked_until < now()))
      for no key update of e skip locked
    ),
    busy as (
      select endpoint_id, count(*)::int as n from webhook_deliveries
      where status = 'SENDING' and locked_until >= now() and endpoint_id in (select id from endpoints)
        and not (id = any(${o.finished as string[]}::uuid[]))
      group by endpoint_id
    ),
    candidates as (
      select x.id, x.next_attempt_at, e.tenant_id, x.rn + coalesce(b.n, 0) as slot
      from endpoints e
      left join busy b on b.endpoint_id = e.id
      cross join lateral (
        select d.id, d.next_attempt_at, row_number() over (order by d.next_attempt_at, d.id) as rn
        from webhook_deliveries d
        where d.endpoint_id = e.id and d.status in ('PENDING', 'SENDING') and d.next_attempt_at <= now()
          and (d.status = 'PENDING' or d.locked_until < now())
        order by d.next_attempt_at, d.id
        limit greatest(0, ${o.perEndpoint}::int - coalesce(b.n, 0))
      ) x
    ),
    turns as (
      select c.*, row_number() over (partition by c.tenant_id order by c.slot, c.next_attempt_at, c.id) as turn
      from candidates c
    ),
    picked as (
      select d.id from webhook_deliveries d join turns c on c.id = d.id
      where c.turn <= coalesce((${limited}::jsonb ->> c.tenant_id::text)::int, ${fallback}::int)
      order by c.turn, c.slot, c.next_attempt_at
      limit ${o.limit}
      for update of d skip locked
    )
    update webhook_deliveries d set
      status = 'SENDING', locked_until = now() + make_interval(secs => ${o.claimSeconds}),
      attempts = d.attempts + 1, last_attempt_at = now(), updated_at = now(),
      payload = coalesce(d.payload, sluice_job_json(d.job_id))
    from picked, webhook_endpoints e
    where d.id = picked.id and e.id = d.endpoint_id
    returning d.id, d.endpoint_id, d.tenant_id, d.event, d.attempts, d.created_at, d.payload, e.url,
      e.secret, case when e.previous_secret_until > now() then e.previous_secret end as previous_secret, now() as now`;
  return rows.map((r) => ({
    id: r.id,
    endpointId: r.endpoint_id,
    tenantId: r.tenant_id,
    event: r.event,
    attempts: r.attempts,
    createdAt: r.created_at,
    url: r.url,
    secrets: r.previous_secret ? [r.secret, r.previous_secret] : [r.secret],
    payload: r.payload,
    now: r.now,
  }));
}

export interface AttemptOutcome {
  id: string;
  endpointId: string;
  status: 'SUCCEEDED' | 'FAILED' | 'PENDING';
  /** A PENDING outcome's next attempt, from now (Postgres's clock). */
  retryInMs: number | null;
  responseStatus: number | null;
  lastError: string | null;
  /** Whether the endpoint took it (null: the endpoint is not judged, e.g. the job was gone). */
  delivered: boolean | null;
}

/**
 * Records finished attempts in one statement (fenced: only rows still SENDING change), and the
 * endpoints' failure runs: a 2xx ends the run, a failure starts it if none is open.
 * Returns the endpoints still failing, with the start of their run.
 */
export async function recordAttempts(sql: Tx, outcomes: readonly AttemptOutcome[]): Promise<Array<{ id: string; tenantId: string; url: string; failingSince: Date }>> {
  if (outcomes.length === 0) return [];
  const items = sql.json(
    outcomes.map((o) => ({ id: o.id, endpoint_id: o.endpointId, status: o.status, retry_in_ms: o.retryInMs, response_status: o.responseStatus, last_error: o.lastError, delivered: o.delivered })) as never,
  );
  const rows = await sql`
    with x as (
      select * from jsonb_to_recordset(${items}::jsonb) as x(id uuid, endpoint_id uuid, status text, retry_in_ms double precision,
        response_status int, last_error text, delivered boolean)
    ),
    d as (
      update webhook_deliveries d set status = x.status, next_attempt_at = coalesce(now() + make_interval(secs => x.retry_in_ms / 1000), d.next_attempt_at),
        locked_until = null, response_status = x.response_status, last_error = x.last_error, updated_at = now()
      from x where d.id = x.id and d.status = 'SENDING'
      returning d.id
    ),
    runs as (
      select endpoint_id, bool_or(delivered) as any_ok, bool_and(not delivered) as all_failed from x where delivered is not null group by endpoint_id
    )
    update webhook_endpoints e set
      failing_since = case when runs.any_ok then null else coalesce(e.failing_since, now()) end
    from runs where e.id = runs.endpoint_id
      and (runs.any_ok and e.failing_since is not null or runs.all_failed)
    returning e.id, e.tenant_id, e.url, e.failing_since`;
  return rows.filter((r) => r.failing_since !== null).map((r) => ({ id: r.id, tenantId: r.tenant_id, url: r.url, failingSince: r.failing_since }));
}

/** Disables an endpoint that has failed too long (if still enabled and still failing). */
export async function disableFailing(sql: Tx, id: string, reason: string): Promise<boolean> {
  const r = await sql`
    update webhook_endpoints set enabled = false, disabled_reason = ${reason}, disabled_at = now(), updated_at = now()
    where id = ${id} and enabled and failing_since is not null`;
  return r.count > 0;
}

/** Retention: one batch of deliveries that ended (SUCCEEDED, FAILED) more than `seconds` ago. Returns how many went. */
export async function deleteEndedDeliveries(sql: Tx, seconds: number, n: number): Promise<number> {
  const deleted = await sql`
    with doomed as (
      select id from webhook_deliveries
      where status in ('SUCCEEDED', 'FAILED') and updated_at < now() - make_interval(secs => ${seconds})
      order by updated_at limit ${n} for update skip locked)
    delete from webhook_deliveries d using doomed where d.id = doomed.id`;
  return deleted.count;
}
