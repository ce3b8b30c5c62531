/**
 * The statements on reservations: one per attempt: its credits, its attempt lease and sent mark, how it
 * was settled. Created by the lease (sluice_lease) and settled by sluice_settle_reservations (through
 * sluice_settle and sluice_settle_group), both called from here.
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { QueuedTrace } from '../../tracing/job-trace.ts';
import type { Sql, Tx } from '../../db/client.ts';
import { finishItem, type FinishedJob } from '../../jobs/store.ts';
import type { JobClass } from '../../config/classes.ts';

/**
 * How a lease call ended. `busy`: another lease of the window was under way (sluice_lease does not
 * wait for it): lease again soon. `changed`: the window was paused or stopped, or its tokens taken,
 * while the call ran (a provider signal); the call wrote nothing: decide again. Both are normal
 * contention, returned as results (no statement error, no ERROR line in Postgres's log).
 */
export type LeaseStatus = 'leased' | 'busy' | 'changed';

export interface LeaseResult {
  status: LeaseStatus;
  /** The jobs leased (empty unless `leased`; may be empty then too: nothing eligible). */
  rows: LeaseRow[];
}

export interface LeaseRow {
  /** The turn that took it: one queue's jobs. */
  turn: number;
  reservationId: string;
  jobId: string;
  attempt: number;
  tenantId: string;
  jobClass: JobClass;
  queue: string;
  /** The queued job's data; a traced job's also carries its trace (tracing/job-trace.ts QueuedTrace). */
  data: { tenantId: string; api: string; params: Record<string, unknown> } & Partial<QueuedTrace>;
  credits: number;
  batched: boolean;
  windowSlot: boolean;
  /** A batched job's call (the turn that opened it: one batch call may carry many tenants' turns); null for a single call. */
  call: number | null;
}

export interface LeaseRequest {
  window: string;
  nodeId: string;
  pool: number;
  max: number;
  leaseMax: number;
  /** Classes in the order to serve them (fair.ts classOrder). */
  classes: readonly JobClass[];
  leaseSeconds: number;
  costs: Record<string, number>;
  hold: readonly string[];
  batch: Record<string, [number, number]>;
  batchMax: number;
  batchQuantum: number;
}

/**
 * The lease in ONE round trip (drizzle/functions/sluice_lease.sql and its phases; pure model:
 * lease.ts planPicks): fair order across tenants, caps, quotas, the window's
 * tokens and pool, pg-boss activation, claims and reservations, in one call.
 */
export async function leaseJobs(sql: Tx, r: LeaseRequest): Promise<LeaseResult> {
  const rows = await sql`
    select * from sluice_lease(${r.window}, ${r.nodeId}, ${r.pool}, ${r.max}, ${r.leaseMax}, ${r.classes as string[]}::text[],
      ${r.leaseSeconds}, ${sql.json(r.costs)}::jsonb, ${r.hold as string[]}::text[], ${sql.json(r.batch as never)}::jsonb,
      ${r.batchMax}, ${r.batchQuantum})`;
  // A call that leased nothing because of contention says so in one row without a job.
  const status = rows.length === 1 && rows[0]!.job_id === null ? (rows[0]!.status as LeaseStatus) : 'leased';
  if (status !== 'leased') return { status, rows: [] };
  return { status, rows: rows.map((x) => ({
    turn: x.turn as number,
    reservationId: x.reservation_id as string,
    jobId: x.job_id as string,
    attempt: x.attempt as number,
    tenantId: x.tenant_id as string,
    jobClass: x.class as JobClass,
    queue: x.queue as string,
    data: x.data as LeaseRow['data'],
    credits: x.credits as number,
    batched: x.batched as boolean,
    windowSlot: x.window_slot as boolean,
    call: (x.call as number | null) ?? null,
  })) };
}

export interface SettleRow {
  id: string;
  billed: number;
  outcome: string;
}

/**
 * Settles reservations exactly once (I5), all in one statement
 * (`sluice_settle`, drizzle/functions/sluice_settle.sql): billed or refunded, their tenant and
 * window slots released, hot rows last. Returns the ids it settled; one
 * missing was settled already (the sweeper found its lease expired, or an
 * earlier try committed but its acknowledgement was lost).
 */
export async function settleReservations(tx: Tx, rows: readonly SettleRow[]): Promise<Set<string>> {
  if (rows.length === 0) return new Set();
  const out = await tx`select sluice_settle(${tx.json(rows as never)}::jsonb) as id`;
  return new Set(out.map((r) => r.id as string));
}

/** One attempt of a settlement group: its reservation's bill, and its final state unless the caller requeued it. */
export interface SettleGroupItem extends SettleRow {
  tenantId: string;
  finish?: FinishedJob;
}

/**
 * A settlement group in ONE statement (drizzle/functions/sluice_settle_group.sql):
 * locks the reservations still open, finishes the jobs of those with a final
 * state (result and pg-boss ack with it, I6), queues the events of the jobs
 * it finished, then settles the reservations (sluice_settle: their tenants'
 * rows, taken last so they are held only to the commit; the ledger; the
 * window's slot deltas). Returns the reservations it settled (the
 * others were settled already: a superseded attempt changes nothing) and
 * the NOTIFY payloads of the final states it sent, sent at commit. With
 * `sql` outside a transaction this is the whole settlement: one round trip,
 * no transaction held open between round trips.
 */
export async function settleGroup(sql: Tx, items: readonly SettleGroupItem[]): Promise<{ settled: Set<string>; events: string[] }> {
  if (items.length === 0) return { settled: new Set(), events: [] };
  const rows = items.map((x) => ({ rid: x.id, tenant: x.tenantId, billed: x.billed, outcome: x.outcome, ...(x.finish ? { finish: finishItem(x.finish) } : {}) }));
  const out = await sql`select id, event from sluice_settle_group(${sql.json(rows as never)}::jsonb)`;
  const settled = new Set<string>();
  const events: string[] = [];
  for (const r of out) {
    if (r.id !== null) settled.add(r.id as string);
    else if (r.event !== null) events.push(r.event as string);
  }
  return { settled, events };
}

/**
 * The same statement with no items, on every connection of the pool `sql` (up to `connections`,
 * each reserved for its call so each call lands on its own): settles nothing, but each connection
 * compiles the settlement's functions, plans their statements and opens their tables, indexes and
 * triggers, and postgres.js prepares the statement. A connection's first real settlement otherwise
 * pays all of that inside its own transaction, the cold tail of bench fanout's finishedAt -> commit
 * (126-331 ms p99 cold against 42-44 warm). Not behind a transaction-mode pooler: there a statement
 * may run on any server connection.
 */
export async function warmSettleGroup(sql: Sql, connections: number): Promise<void> {
  await Promise.all(
    Array.from({ length: connections }, async () => {
      const conn = await sql.reserve();
      try {
        await conn`select id, event from sluice_settle_group(${conn.json([] as never)}::jsonb)`;
      } finally {
        conn.release();
      }
    }),
  );
}

/**
 * The first step of a settlement (lock order: reservations first): locks
 * the reservations still open among `ids`, returning them. A settlement
 * changes nothing for the others: their attempt was superseded.
 */
export async function lockOpenReservations(tx: Tx, ids: readonly string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await tx`
    select id from reservations where id = any(${ids as string[]}::uuid[]) and settled_at is null
    order by id for update`;
  return new Set(rows.map((r) => r.id as string));
}

/** A reservation a settlement found settled already, as it was settled (dispatch/late-settlement.ts). */
export interface SettledReservation {
  outcome: string;
  billed: number;
  credits: number;
  reconciled: boolean;
  periodStart: Date;
  /** Its job's API and class (for the usage correction); 'unknown' when the job is gone. */
  api: string;
  jobClass: string;
}

/**
 * The first step of a late settlement (lock order: reservations first): locks
 * those of `ids` that are settled, returning how they were settled.
 */
export async function lockSettledReservations(tx: Tx, ids: readonly string[]): Promise<Map<string, SettledReservation>> {
  if (ids.length === 0) return new Map();
  const rows = await tx`
    select r.id, r.outcome, r.billed, r.credits, r.reconciled_at is not null as reconciled, r.period_start,
      coalesce(j.api, 'unknown') as api, coalesce(j.priority, 'UNKNOWN') as class
    from reservations r left join jobs j on j.id = r.job_id
    where r.id = any(${ids as string[]}::uuid[]) and r.settled_at is not null
    order by r.id for update of r`;
  return new Map(
    rows.map((r) => [
      r.id as string,
      { outcome: r.outcome as string, billed: Number(r.billed ?? 0), credits: r.credits as number, reconciled: r.reconciled as boolean, periodStart: r.period_start as Date, api: r.api as string, jobClass: r.class as string },
    ]),
  );
}

/**
 * A late settlement's bill for a reservation the sweeper settled: once (reconciled_at fences a second).
 * The expiry's bill is kept beside it: usage events serve the charge as it was first settled and
 * the difference as a correction (src/usage/events.ts), so an event read twice is the same event.
 */
export async function reconcileReservation(tx: Tx, id: string, billed: number): Promise<void> {
  await tx`update reservations set billed = ${billed}, expiry_billed = billed, reconciled_at = clock_timestamp() where id = ${id} and reconciled_at is null`;
}

/**
 * The attempt lease: extends the leases of this node's open reservations.
 * Returns the ids it extended (`live`) and, among the others, the ones now
 * settled (`settled`): settled by someone else (the sweeper found the lease
 * expired), so their calls must stop. A row locked right now (its settlement
 * or a sweep is under way) is skipped, not waited for: the refresh never
 * queues behind a slow settlement. A lease is never shortened: a sent call's
 * lease (markSent) may run longer than one refresh's.
 */
export async function refreshLeases(sql: Tx, ids: readonly string[], leaseSeconds: number): Promise<{ live: Set<string>; settled: Set<string> }> {
  if (ids.length === 0) return { live: new Set(), settled: new Set() };
  const rows = await sql`
    with mine as (
      select id from reservations where id = any(${ids as string[]}::uuid[]) and settled_at is null
      for update skip locked
    )
    update reservations r set lease_expires_at = greatest(r.lease_expires_at, clock_timestamp() + make_interval(secs => ${leaseSeconds}))
    from mine where r.id = mine.id
    returning r.id`;
  const live = new Set(rows.map((r) => r.id as string));
  const missing = ids.filter((id) => !live.has(id));
  if (missing.length === 0) return { live, settled: new Set() };
  const gone = await sql`select id from reservations where id = any(${missing}::uuid[]) and settled_at is not null`;
  return { live, settled: new Set(gone.map((r) => r.id as string)) };
}

/**
 * The "sent" mark: ONE statement for all the reservations a
 * lease returned, before their calls are sent (sluice_mark_sent, which also
 * sends their jobs' RUNNING events): one lease_sends row per lease, not an
 * update of each reservation. Returns the ids it marked; the
 * node sends only those (none of a lease the sweeper claimed first: its lease
 * expired). A lease whose rows never reached its
 * node is never marked, and its expiry refunds it. The mark and the sweeper's
 * expiry insert the same key (the lease id), so they cannot both win: a mark
 * waits for a claim under way, then does nothing, and a claim waits for a mark.
 *
 * The same statement makes each lease last at least `sentLeaseSeconds` from
 * the mark (dispatch/liveness.ts sentLeaseMs: the call's own timeout and a
 * margin), so no sweeper can take an attempt while its call may still run,
 * whether or not its node can still reach Postgres to refresh it.
 *
 * `riders` are among `ids` but ride on another attempt's call (a batch's duplicate inputs: only the
 * item's first attempt is sent and billed). They are fenced the same way (returned when still open)
 * but not marked: if their node dies, their expiry refunds them, and only the attempt that went
 * upstream is billed by the timeout rule.
 */
export async function markSent(sql: Tx, ids: readonly string[], riders: readonly string[] = [], sentLeaseSeconds = 0): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await sql`
    select id from sluice_mark_sent(${ids as string[]}::uuid[], ${riders as string[]}::uuid[], ${sentLeaseSeconds}::float8) as id`;
  return new Set(rows.map((r) => r.id as string));
}

export interface ExpiredReservation {
  id: string;
  jobId: string;
  attempt: number;
  tenantId: string;
  /** The job's class (its pg-boss queue, with the tenant). */
  jobClass: JobClass;
  credits: number;
  /** Its node marked its lease sent before calling (markSent) and it was not a rider; unmarked ones are refunded. */
  sent: boolean;
}

/**
 * Whether the lease's sent mark, if it has one (lease_sends `s`, left-joined), no longer extends it:
 * no mark, a claim that it was never sent, or a mark whose lease is over.
 */
const markLapsed = (sql: Tx) => sql`(s.lease_expires_at is null or s.lease_expires_at < clock_timestamp())`;
/** An open reservation `r` whose attempt lease is over, its own and its mark's (`s`). */
const leaseLapsed = (sql: Tx) => sql`r.settled_at is null and r.lease_expires_at < clock_timestamp() and ${markLapsed(sql)}`;

/**
 * Open reservations whose attempt lease expired (the one liveness authority), up to `limit`, in id
 * order, without locking: the sweeper locks them by id (lockExpiredReservations), so a batch whose
 * settlement fails can be split and retried by halves. One whose expiry failed on its own is left
 * out until `retrySeconds` after its failure (recordExpiryFailure). The open rows are read through
 * reservations_open_idx (the calls in flight) and filtered by their lease: no index on the lease,
 * so the lease refresh stays a HOT update (schema.ts). A lease its node marked sent lasts at least
 * to its lease_sends row's `lease_expires_at` (the mark's).
 */
export async function expiredReservationIds(sql: Tx, limit: number, retrySeconds: number): Promise<string[]> {
  const rows = await sql`
    select r.id from reservations r left join lease_sends s on s.lease_id = r.lease_id
    where ${leaseLapsed(sql)}
      and (r.expiry_failed_at is null or r.expiry_failed_at < now() - make_interval(secs => ${retrySeconds}))
    order by r.id limit ${limit}`;
  return rows.map((r) => r.id as string);
}

/**
 * These reservations, locked, while still open and expired; rows another sweeper holds are skipped.
 * In a short transaction. Whether each was sent is its lease's lease_sends row: a lease with no row
 * yet is claimed here as never sent (the same key the node's sent mark inserts: a mark under way
 * makes the claim wait for its commit and then do nothing), and the rows are read again after the
 * claim, so a lease whose mark committed meanwhile, with its longer lease, is left out.
 */
export async function lockExpiredReservations(tx: Tx, ids: readonly string[]): Promise<ExpiredReservation[]> {
  if (ids.length === 0) return [];
  const locked = await tx`
    select r.id, r.lease_id, s.lease_id is null as unclaimed
    from reservations r left join lease_sends s on s.lease_id = r.lease_id
    where r.id = any(${ids as string[]}::uuid[]) and ${leaseLapsed(tx)}
    order by r.id for update of r skip locked`;
  if (locked.length === 0) return [];
  const unclaimed = [...new Set(locked.filter((r) => r.unclaimed).map((r) => r.lease_id as string))];
  if (unclaimed.length > 0) await tx`insert into lease_sends (lease_id) select unnest(${unclaimed}::uuid[]) order by 1 on conflict (lease_id) do nothing`;
  const rows = await tx`
    select r.id, r.job_id, r.attempt, r.tenant_id, j.priority, r.credits,
      (s.sent_at is not null and r.id <> all(coalesce(s.riders, '{}'))) as sent
    from reservations r join jobs j on j.id = r.job_id join lease_sends s on s.lease_id = r.lease_id
    where r.id = any(${locked.map((r) => r.id as string)}::uuid[]) and ${markLapsed(tx)}
    order by r.id`;
  return rows.map((r) => ({
    id: r.id as string,
    jobId: r.job_id as string,
    attempt: r.attempt as number,
    tenantId: r.tenant_id as string,
    jobClass: r.priority as JobClass,
    credits: r.credits as number,
    sent: r.sent as boolean,
  }));
}

/** An expiry that failed alone: why and when, so the sweep skips it for a while and an alert names it. */
export async function recordExpiryFailure(sql: Tx, id: string, reason: string): Promise<void> {
  await sql`update reservations set expiry_error = ${reason.slice(0, 500)}, expiry_failed_at = now() where id = ${id} and settled_at is null`;
}

/** Open reservations whose expiry failed on its own (the alert's facts): how many, and the first few ids. */
export async function failedExpiries(sql: Tx, limit = 5): Promise<{ count: number; ids: string[] }> {
  const rows = await sql`
    select id, count(*) over ()::int as n from reservations
    where settled_at is null and expiry_failed_at is not null order by id limit ${limit}`;
  return { count: (rows[0]?.n as number | undefined) ?? 0, ids: rows.map((r) => r.id as string) };
}

/**
 * Retention: one batch of settled reservations made more than `seconds` ago (by
 * reservations_created_idx: a reservation settles within its lease, so its making is its age for
 * retention, and no index of settled_at costs every settlement an entry; rows another pass holds
 * are skipped), and one of lease_sends rows as old whose lease has no open reservation left (an open
 * one's row says whether its call was sent: it stays). Returns how many reservations went.
 */
export async function deleteSettledReservations(sql: Tx, seconds: number, n: number): Promise<number> {
  const deleted = await sql`
    with doomed as (
      select id from reservations
      where created_at < now() - make_interval(secs => ${seconds}) and settled_at is not null
      order by created_at limit ${n} for update skip locked)
    delete from reservations r using doomed where r.id = doomed.id`;
  await sql`
    with doomed as (
      select s.lease_id from lease_sends s
      where s.at < now() - make_interval(secs => ${seconds})
        and not exists (select 1 from reservations r where r.settled_at is null and r.lease_id = s.lease_id)
      order by s.at limit ${n} for update skip locked)
    delete from lease_sends s using doomed where s.lease_id = doomed.lease_id`;
  return deleted.count;
}

/** A deleted tenant's settled reservations (none is open: its calls in flight have settled first). */
export async function deleteTenantReservations(tx: Tx, tenantId: string): Promise<void> {
  await tx`delete from reservations where tenant_id = ${tenantId} and settled_at is not null`;
}
