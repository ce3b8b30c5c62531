/**
 * The scheduler's SQL: every statement that reads or changes the shared
 * dispatch state (sched_tenants, sched_queues, sched_classes, windows,
 * tenant_ledger, reservations, nodes), as named functions.
 *
 * Shared state changes with single conditional statements, never
 * read-then-write: a slot, a token or a credit is taken only `where` it is
 * there, so concurrent nodes cannot oversubscribe. Within a transaction, rows
 * are locked in the one order written in docs/ARCHITECTURE.md ("Lock order"):
 * reservations → sched_tenants (id order) → pgboss.job / jobs → sched_queues
 * → job_results → tenant_ledger → sched_classes → windows → account_state,
 * so lease, settle, sweep, cancel and submit cannot deadlock each other. The
 * lease (sluice_lease, drizzle/functions/sluice_lease.sql) waits only for its first tenant row
 * (holding nothing else) and takes later ones SKIP LOCKED, so it never waits
 * out of id order.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import { finishItem, type FinishedJob } from '../jobs/store.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';
import { effectiveLimits, type TenantRecord } from '../tenants/policy.ts';
import type { BucketState } from './pacer.ts';
import type { WindowSpec } from './windows.ts';

type Tx = Sql | postgres.TransactionSql;

/* ---------- tenants and queues ---------- */

/** Keeps the scheduler's copy of a tenant's limits in step with the tenant (same transaction). */
export async function syncTenant(tx: Tx, t: TenantRecord): Promise<void> {
  const l = effectiveLimits(t);
  await tx`
    insert into sched_tenants (tenant_id, weight, cap, quota, quota_policy, period_anchor)
    values (${t.id}, ${l.weight}, ${l.concurrencyCap}, ${l.monthlyQuota}, ${t.quotaPolicy}, ${t.periodAnchor})
    on conflict (tenant_id) do update set weight = excluded.weight, cap = excluded.cap, quota = excluded.quota,
      quota_policy = excluded.quota_policy, period_anchor = excluded.period_anchor`;
  await tx`
    insert into sched_queues (tenant_id, class)
    select ${t.id}, c from unnest(${CLASSES as unknown as string[]}::text[]) as c
    on conflict do nothing`;
}

/** Tenants with no scheduler row yet (created before the scheduler existed, or mid-creation when a process died). */
export async function unscheduledTenantIds(sql: Tx): Promise<string[]> {
  const rows = await sql`select id from tenants t where not exists (select 1 from sched_tenants s where s.tenant_id = t.id)`;
  return rows.map((r) => r.id as string);
}

export async function ensureClasses(sql: Tx): Promise<void> {
  await sql`insert into sched_classes (class) select c from unnest(${CLASSES as unknown as string[]}::text[]) as c on conflict do nothing`;
}

/**
 * Marks queues as having work ready now. A queue that was idle (or only had
 * delayed work) joins at the class clock: no credit for idle time.
 */
export async function markQueuesReady(tx: Tx, tenantId: string, classes: readonly JobClass[], at: Date | null = null): Promise<void> {
  await markManyQueuesReady(tx, classes.map((jobClass) => ({ tenantId, jobClass })), at);
}

/** markQueuesReady for the queues of many tenants in one statement (a group commit). */
export async function markManyQueuesReady(tx: Tx, queues: ReadonlyArray<{ tenantId: string; jobClass: JobClass }>, at: Date | null = null): Promise<void> {
  if (queues.length === 0) return;
  await tx`
    update sched_queues q set
      vtime = case when q.ready_at is null or q.ready_at > now() then greatest(q.vtime, c.clock) else q.vtime end,
      ready_at = least(coalesce(q.ready_at, 'infinity'), coalesce(${at}::timestamptz, now()))
    from sched_classes c, jsonb_to_recordset(${tx.json(queues.map((x) => ({ t: x.tenantId, c: x.jobClass })) as never)}::jsonb) as r(t uuid, c text)
    where q.tenant_id = r.t and q.class = r.c and c.class = q.class
      -- The queues' tenants by id: an index lookup each, where the join alone reads every queue.
      and q.tenant_id = any(${[...new Set(queues.map((x) => x.tenantId))]}::uuid[])
      -- A queue already ready (by now and by \`at\`) would be rewritten unchanged: skip it. Every
      -- submission group marks its queues, and a busy queue is nearly always ready already, so this
      -- saves a row version (and WAL) per queue per group. An UPDATE evaluates this on the row's
      -- latest version (after waiting for a concurrent writer), so no concurrent change is missed.
      and (q.ready_at is null or q.ready_at > least(now(), coalesce(${at}::timestamptz, now())))`;
}

/**
 * How long each class has waited, for the starvation guard: the age of its
 * oldest ready job, but no more than the time since the class was last
 * served. A long backlog is old for as long as it drains; judged by age alone
 * it would stay "starving" and outrank the classes above it the whole time,
 * instead of getting one turn per maximum wait.
 */
export async function oldestWaitByClass(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`
    select c.class, extract(epoch from now() - greatest(o.created_at, coalesce(k.served_at, '-infinity'))) * 1000 as wait_ms
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)
    left join sched_classes k on k.class = c.class
    cross join lateral (
      select created_at from jobs where priority = c.class and state = 'QUEUED' and run_after <= now()
      order by created_at limit 1
    ) o`;
  return Object.fromEntries(rows.map((r) => [r.class, Math.max(0, Number(r.wait_ms))]));
}

/**
 * Per class: the oldest queued job's age in seconds (null: none queued). One index probe per class
 * (jobs_queued_age_idx), whatever the number of tenants: the sweeper's alerts read it every round.
 */
export async function oldestQueuedAgeByClass(sql: Tx): Promise<Partial<Record<JobClass, number>>> {
  const rows = await sql`
    select c.class, (select extract(epoch from now() - min(created_at)) from (
        select created_at from jobs where priority = c.class and state = 'QUEUED' order by created_at limit 1) o) as oldest
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)`;
  return Object.fromEntries(rows.filter((r) => r.oldest !== null).map((r) => [r.class, Number(r.oldest)]));
}

/**
 * Per class: waiting jobs (exact, from the depth counters), running jobs, and the oldest queued
 * job's age. The sums read every queue's row (O(registered tenants)): for the status page, not
 * for anything that runs every round.
 */
export async function classTotals(sql: Tx): Promise<Array<{ jobClass: JobClass; depth: number; running: number; oldestAgeSeconds: number | null }>> {
  const [rows, oldest] = await Promise.all([
    sql`
      select c.class,
        (select coalesce(sum(depth), 0) from sched_queues q where q.class = c.class)::int as depth,
        ((select coalesce(sum(running), 0) from sched_queues q where q.class = c.class)
          + (select coalesce(sum(n), 0) from sched_running_deltas d where d.class = c.class))::int as running
      from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)`,
    oldestQueuedAgeByClass(sql),
  ]);
  return rows.map((r) => ({ jobClass: r.class as JobClass, depth: r.depth as number, running: r.running as number, oldestAgeSeconds: oldest[r.class as JobClass] ?? null }));
}

/** Per class of one tenant: waiting, running, oldest waiting job's age, quota block, and the tenant's cap state. */
export async function tenantQueues(sql: Tx, tenantId: string): Promise<Array<{ jobClass: JobClass; depth: number; running: number; oldestAgeSeconds: number | null; headApi: string | null }>> {
  return (await tenantsQueues(sql, [tenantId])).get(tenantId) ?? [];
}

/** tenantQueues for many tenants in one statement (the console's tenants table). */
export async function tenantsQueues(sql: Tx, tenantIds: readonly string[]): Promise<Map<string, Awaited<ReturnType<typeof tenantQueues>>>> {
  const rows = await sql`
    select q.tenant_id, q.class, q.depth,
      q.running + coalesce((select sum(n) from sched_running_deltas d where d.tenant_id = q.tenant_id and d.class = q.class), 0)::int as running,
      h.age, h.api
    from sched_queues q
    left join lateral (
      select extract(epoch from now() - created_at) as age, api from jobs j
      where j.tenant_id = q.tenant_id and j.priority = q.class and j.state in ('QUEUED', 'WAITING_QUOTA')
      order by created_at limit 1
    ) h on true
    where q.tenant_id = any(${tenantIds as string[]}::uuid[])`;
  const order = CLASSES as readonly string[];
  const out = new Map<string, Awaited<ReturnType<typeof tenantQueues>>>();
  for (const r of rows) {
    const list = out.get(r.tenant_id as string) ?? [];
    list.push({ jobClass: r.class as JobClass, depth: r.depth as number, running: r.running as number, oldestAgeSeconds: r.age === null ? null : Number(r.age), headApi: (r.api as string | null) ?? null });
    out.set(r.tenant_id as string, list);
  }
  for (const list of out.values()) list.sort((a, b) => order.indexOf(a.jobClass) - order.indexOf(b.jobClass));
  return out;
}

export async function tenantSchedState(sql: Tx, tenantId: string): Promise<{ inFlight: number; cap: number; weight: number; quotaBlocked: boolean; suspended: boolean } | null> {
  const [r] = await sql`select in_flight, cap, weight, quota_blocked, suspended from sched_tenants where tenant_id = ${tenantId}`;
  return r ? { inFlight: r.in_flight as number, cap: r.cap as number, weight: r.weight as number, quotaBlocked: r.quota_blocked as boolean, suspended: r.suspended as boolean } : null;
}

/**
 * Folds the RUNNING deltas the job triggers appended into sched_queues.running
 * (drizzle/functions/sluice_fold_running.sql; the sweeper calls it every round). Returns the deltas folded.
 */
export async function foldRunning(sql: Tx): Promise<number> {
  const [r] = await sql`select sluice_fold_running() as n`;
  return (r?.n as number) ?? 0;
}

/** Per tenant and class: waiting and running (only for METRICS_TENANT_LABELS). */
export async function tenantDepths(sql: Tx): Promise<Array<{ tenant: string; class: string; depth: number; running: number }>> {
  const rows = await sql`
    select q.tenant_id, q.class, q.depth, r.running from sched_queues q
    cross join lateral (select q.running + coalesce((select sum(n) from sched_running_deltas d where d.tenant_id = q.tenant_id and d.class = q.class), 0)::int as running) r
    where q.depth > 0 or r.running > 0`;
  return rows.map((r) => ({ tenant: r.tenant_id as string, class: r.class as string, depth: r.depth as number, running: r.running as number }));
}

/** Sum of the weights of tenants with waiting work in a class (for fair-share estimates). */
export async function busyWeights(sql: Tx, classes: readonly JobClass[]): Promise<number> {
  const [r] = await sql`
    select coalesce(sum(t.weight), 0)::int as w from sched_tenants t
    where exists (select 1 from sched_queues q where q.tenant_id = t.tenant_id and q.depth > 0 and q.class = any(${classes as string[]}::text[]))`;
  return r!.w as number;
}

export async function publishBreakers(sql: Tx, states: ReadonlyArray<{ api: string; state: string; retryAt: Date | null }>): Promise<void> {
  for (const b of states) {
    await sql`
      insert into breakers (api, state, retry_at, opened_at) values (${b.api}, ${b.state}, ${b.retryAt}, case when ${b.state} = 'CLOSED' then null else now() end)
      on conflict (api) do update set state = excluded.state, retry_at = excluded.retry_at,
        opened_at = case when excluded.state = 'CLOSED' then null else coalesce(breakers.opened_at, now()) end, updated_at = now()`;
  }
}

export async function readBreakers(sql: Tx): Promise<Array<{ api: string; state: string; openedAt: Date | null; retryAt: Date | null }>> {
  const rows = await sql`select api, state, opened_at, retry_at from breakers order by api`;
  return rows.map((r) => ({ api: r.api as string, state: r.state as string, openedAt: r.opened_at as Date | null, retryAt: r.retry_at as Date | null }));
}

/* ---------- the lease ---------- */

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
  data: { tenantId: string; api: string; params: Record<string, unknown> };
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
 * The lease in ONE round trip (drizzle/functions/sluice_lease.sql; pure model:
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

/* ---------- settlement ---------- */

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
 * window's slot deltas). Returns the reservations it settled; the
 * others were settled already (a superseded attempt changes nothing). With
 * `sql` outside a transaction this is the whole settlement: one round trip,
 * no transaction held open between round trips.
 */
export async function settleGroup(sql: Tx, items: readonly SettleGroupItem[]): Promise<Set<string>> {
  if (items.length === 0) return new Set();
  const rows = items.map((x) => ({ rid: x.id, tenant: x.tenantId, billed: x.billed, outcome: x.outcome, ...(x.finish ? { finish: finishItem(x.finish) } : {}) }));
  const out = await sql`select sluice_settle_group(${sql.json(rows as never)}::jsonb) as id`;
  return new Set(out.map((r) => r.id as string));
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

/** A late settlement's bill for a reservation the sweeper settled: once (reconciled_at fences a second). */
export async function reconcileReservation(tx: Tx, id: string, billed: number): Promise<void> {
  await tx`update reservations set billed = ${billed}, reconciled_at = clock_timestamp() where id = ${id} and reconciled_at is null`;
}

/** Moves a tenant's billed credits for a period by `delta` (a late settlement's correction); refunds move the other way. */
export async function correctLedger(tx: Tx, tenantId: string, periodStart: Date, delta: number): Promise<void> {
  await tx`
    update tenant_ledger set billed = billed + ${delta}, refunded = refunded - ${delta}
    where tenant_id = ${tenantId} and period_start = ${periodStart}`;
}

/** Locks tenants' scheduler rows in id order (the lock order for any path touching several tenants). */
export async function lockTenants(tx: Tx, tenantIds: readonly string[]): Promise<void> {
  if (tenantIds.length === 0) return;
  await tx`select 1 from sched_tenants where tenant_id = any(${[...new Set(tenantIds)]}::uuid[]) order by tenant_id for update`;
}

/**
 * The attempt lease: extends the leases of this node's open reservations.
 * Returns the ids it extended (`live`) and, among the others, the ones now
 * settled (`settled`): settled by someone else (the sweeper found the lease
 * expired), so their calls must stop. A row locked right now (its settlement
 * or a sweep is under way) is skipped, not waited for: the refresh never
 * queues behind a slow settlement.
 */
export async function refreshLeases(sql: Tx, ids: readonly string[], leaseSeconds: number): Promise<{ live: Set<string>; settled: Set<string> }> {
  if (ids.length === 0) return { live: new Set(), settled: new Set() };
  const rows = await sql`
    with mine as (
      select id from reservations where id = any(${ids as string[]}::uuid[]) and settled_at is null
      for update skip locked
    )
    update reservations r set lease_expires_at = clock_timestamp() + make_interval(secs => ${leaseSeconds})
    from mine where r.id = mine.id
    returning r.id`;
  const live = new Set(rows.map((r) => r.id as string));
  const missing = ids.filter((id) => !live.has(id));
  if (missing.length === 0) return { live, settled: new Set() };
  const gone = await sql`select id from reservations where id = any(${missing}::uuid[]) and settled_at is not null`;
  return { live, settled: new Set(gone.map((r) => r.id as string)) };
}

/**
 * The "sent" mark (migration 0028): ONE statement for all the reservations a
 * lease returned, before their calls are sent. Returns the ids it marked; the
 * node sends only those (one missing was settled meanwhile: its lease
 * expired). All rows of one call share the statement's `now()`, so the
 * distinct marks count the statements. A lease whose rows never reached its
 * node is never marked, and its expiry refunds it. Rows are not locked
 * against a settlement: a mark waits for a sweep holding the row, then finds
 * it settled and leaves it out.
 */
export async function markSent(sql: Tx, ids: readonly string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await sql`
    update reservations set sent_at = now()
    where id = any(${ids as string[]}::uuid[]) and settled_at is null
    returning id`;
  return new Set(rows.map((r) => r.id as string));
}

/** A rate-limit 429: the window sends nothing on any node until the pause ends, and its bucket is emptied. */
export async function pauseWindow(sql: Tx, window: string, seconds: number, reason: string): Promise<void> {
  await sql`
    update windows set tokens = 0, refilled_at = greatest(clock_timestamp(), now() + make_interval(secs => ${seconds})),
      paused_until = greatest(coalesce(paused_until, now()), now() + make_interval(secs => ${seconds})),
      pause_reason = ${reason}, updated_at = now()
    where name = ${window}`;
}

/** An unusable key (401/403): its window stops until an admin resumes it; other windows carry on. */
export async function stopWindow(sql: Tx, window: string, reason: string): Promise<void> {
  // Far in the future rather than 'infinity', which JavaScript Dates cannot hold.
  await sql`update windows set tokens = 0, paused_until = '9999-12-31T00:00:00Z', pause_reason = ${reason}, updated_at = now() where name = ${window}`;
}

/* ---------- the account ---------- */

export interface AccountRow {
  dispatchStoppedUntil: Date | null;
  stopReason: string | null;
  creditsRemaining: number | null;
  maxCredits: number | null;
  renewalAt: Date | null;
  statusAt: Date | null;
}

/** Credits exhausted: every node stops dispatching until `until` (the renewal) or an admin resumes. */
export async function stopAccount(sql: Tx, until: Date, reason: string): Promise<void> {
  await sql`
    insert into account_state (id, dispatch_stopped_until, stop_reason) values (1, ${until}, ${reason})
    on conflict (id) do update set dispatch_stopped_until = greatest(coalesce(account_state.dispatch_stopped_until, ${until}), ${until}),
      stop_reason = ${reason}`;
}

export async function readAccount(sql: Tx): Promise<AccountRow> {
  const [r] = await sql`select * from account_state where id = 1`;
  return {
    dispatchStoppedUntil: r?.dispatch_stopped_until && (r.dispatch_stopped_until as Date) > new Date() ? (r.dispatch_stopped_until as Date) : null,
    stopReason: r?.dispatch_stopped_until && (r.dispatch_stopped_until as Date) > new Date() ? (r.stop_reason as string) : null,
    creditsRemaining: r?.credits_remaining === null || r?.credits_remaining === undefined ? null : Number(r.credits_remaining),
    maxCredits: r?.max_credits === null || r?.max_credits === undefined ? null : Number(r.max_credits),
    renewalAt: (r?.renewal_at as Date | null) ?? null,
    statusAt: (r?.status_at as Date | null) ?? null,
  };
}

/** The newest provider status (x-api-* headers) a worker saw, for the admin view and alerts. */
export async function publishProviderStatus(sql: Tx, s: { remainingCredits: number | null; maxCredits: number | null; renewalAt: Date | null; observedAt: Date }): Promise<void> {
  await sql`
    insert into account_state (id, credits_remaining, max_credits, renewal_at, status_at)
    values (1, ${s.remainingCredits}, ${s.maxCredits}, ${s.renewalAt}, ${s.observedAt})
    on conflict (id) do update set credits_remaining = excluded.credits_remaining, max_credits = excluded.max_credits,
      renewal_at = excluded.renewal_at, status_at = excluded.status_at
    where account_state.status_at is null or account_state.status_at < excluded.status_at`;
}

/** An admin's resumeDispatch: lifts the account stop, and the stop of key-unusable windows (all, or one). */
export async function resumeDispatch(sql: Tx, window: string | null): Promise<void> {
  // Lock order: windows (by name) before account_state, as every other path takes them.
  await sql`
    update windows w set paused_until = null, pause_reason = null, updated_at = now()
    from (select name from windows where pause_reason = 'KEY_UNUSABLE' and (${window}::text is null or name = ${window})
          order by name for update) l
    where w.name = l.name`;
  await sql`update account_state set dispatch_stopped_until = null, stop_reason = null where id = 1`;
}

/* ---------- windows ---------- */

export async function upsertWindows(sql: Tx, specs: readonly WindowSpec[]): Promise<void> {
  for (const w of specs) {
    await sql`
      insert into windows (name, rate_per_minute, burst, tokens)
      values (${w.name}, ${w.pacedPerMinute}, ${w.burst}, ${w.burst})
      on conflict (name) do update set rate_per_minute = excluded.rate_per_minute, burst = excluded.burst,
        tokens = least(windows.tokens, excluded.burst), updated_at = now()`;
  }
}

export interface WindowRow extends BucketState {
  name: string;
  inFlight: number;
  poolSize: number;
  pauseReason: string | null;
  latencyP50Ms: number | null;
  latencyP95Ms: number | null;
  /** The database's clock when read, so waits are computed on one clock. */
  dbNow: number;
  /** All dispatch is stopped until then (credits exhausted), or null. */
  accountStoppedUntil: number | null;
}

export async function readWindows(sql: Tx, names?: readonly string[]): Promise<WindowRow[]> {
  const rows = await sql`
    select w.*, clock_timestamp() as db_now, a.dispatch_stopped_until,
      -- slots settlements gave back that the next lease has not folded yet (window_slot_deltas)
      (w.in_flight + coalesce((select sum(d.n) from window_slot_deltas d where d."window" = w.name), 0))::int as in_flight_now
    from windows w
    left join account_state a on a.id = 1
    where ${names ? sql`w.name = any(${names as string[]}::text[])` : sql`true`} order by w.name`;
  return rows.map((r) => ({
    name: r.name as string,
    ratePerMinute: r.rate_per_minute as number | null,
    burst: r.burst as number,
    tokens: r.tokens as number,
    refilledAt: (r.refilled_at as Date).getTime(),
    pausedUntil: r.paused_until ? (r.paused_until as Date).getTime() : null,
    pauseReason: r.pause_reason as string | null,
    inFlight: r.in_flight_now as number,
    poolSize: r.pool_size as number,
    latencyP50Ms: r.latency_p50_ms as number | null,
    latencyP95Ms: r.latency_p95_ms as number | null,
    dbNow: (r.db_now as Date).getTime(),
    accountStoppedUntil: r.dispatch_stopped_until ? (r.dispatch_stopped_until as Date).getTime() : null,
  }));
}

export async function reportWindowLatency(sql: Tx, window: string, poolSize: number, p50: number, p95: number): Promise<void> {
  await sql`update windows set pool_size = ${poolSize}, latency_p50_ms = ${p50}, latency_p95_ms = ${p95}, updated_at = now() where name = ${window}`;
}

/* ---------- nodes and the sweep ---------- */

export async function heartbeatNode(sql: Tx, id: string, role: string): Promise<void> {
  await sql`
    insert into nodes (id, role, pid) values (${id}, ${role}, ${process.pid})
    on conflict (id) do update set heartbeat_at = now()`;
}

export async function removeNode(sql: Tx, id: string): Promise<void> {
  await sql`delete from nodes where id = ${id}`;
}

export interface ExpiredReservation {
  id: string;
  jobId: string;
  attempt: number;
  tenantId: string;
  credits: number;
  /** Its node marked it sent before calling (markSent); unmarked ones are refunded. */
  sent: boolean;
}

/**
 * Open reservations whose attempt lease expired (the one liveness
 * authority), locked; rows another sweeper holds are skipped. In a short
 * transaction, `limit` at a time.
 */
export async function lockExpiredReservations(tx: Tx, limit: number): Promise<ExpiredReservation[]> {
  const rows = await tx`
    select id, job_id, attempt, tenant_id, credits, sent_at is not null as sent from reservations
    where settled_at is null and lease_expires_at < clock_timestamp()
    order by id limit ${limit} for update skip locked`;
  return rows.map((r) => ({ id: r.id as string, jobId: r.job_id as string, attempt: r.attempt as number, tenantId: r.tenant_id as string, credits: r.credits as number, sent: r.sent as boolean }));
}

/**
 * How long Postgres has been serving, on its own clock: since the postmaster
 * started or, after a crash of one backend, since the crash recovery that
 * restarted its checkpointer (the postmaster's start time does not move then;
 * a role without pg_read_all_stats sees no backend_start there, and greatest()
 * then reads the postmaster's alone).
 */
export async function databaseUpForMs(sql: Tx): Promise<number> {
  const [r] = await sql`
    select extract(epoch from clock_timestamp() - greatest(pg_postmaster_start_time(),
      (select max(backend_start) from pg_stat_activity where backend_type = 'checkpointer'))) * 1000 as ms`;
  return Number(r!.ms);
}

export async function forgetDeadNodes(sql: Tx, timeoutSeconds: number): Promise<void> {
  await sql`
    delete from nodes n where n.heartbeat_at < now() - make_interval(secs => ${timeoutSeconds * 6})
      and not exists (select 1 from reservations r where r.node_id = n.id and r.settled_at is null)`;
}

/** Quota-blocked tenants whose next job now fits (a new period, a raised quota, refunds). */
export async function unblockableTenants(sql: Tx): Promise<Array<{ tenantId: string; periodAnchor: Date; quota: number; cost: number }>> {
  const rows = await sql`select tenant_id, period_anchor, quota, quota_blocked_cost from sched_tenants where quota_blocked`;
  return rows.map((r) => ({ tenantId: r.tenant_id as string, periodAnchor: r.period_anchor as Date, quota: Number(r.quota), cost: r.quota_blocked_cost as number }));
}

export async function ledgerFor(sql: Tx, tenantId: string, periodStart: Date): Promise<{ billed: number; reserved: number; refunded: number }> {
  const [row] = await sql`select billed, reserved, refunded from tenant_ledger where tenant_id = ${tenantId} and period_start = ${periodStart}`;
  return { billed: Number(row?.billed ?? 0), reserved: Number(row?.reserved ?? 0), refunded: Number(row?.refunded ?? 0) };
}

/** Lifts the quota block: WAITING_QUOTA jobs are QUEUED again and their queues ready. */
export async function unblockQuota(tx: Tx, tenantId: string): Promise<number> {
  const [t] = await tx`update sched_tenants set quota_blocked = false, quota_blocked_cost = 0 where tenant_id = ${tenantId} and quota_blocked returning tenant_id`;
  if (!t) return 0;
  const rows = await tx`
    update jobs set state = 'QUEUED', updated_at = now() where tenant_id = ${tenantId} and state = 'WAITING_QUOTA'
    returning priority`;
  const classes = [...new Set(rows.map((r) => r.priority as JobClass))];
  await markQueuesReady(tx, tenantId, classes);
  return rows.length;
}
