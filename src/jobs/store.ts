/**
 * Owns the jobs table (a job's result is on its row): all its SQL lives here, as named
 * functions, so the database contract reads in one place.
 *
 * State changes are conditional updates (`where state = ...`), so when two
 * actors race (a cancel and a dispatch, a crashed worker's redelivery and a
 * late finisher) exactly one wins and the loser sees zero rows.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import { queueName } from '../queue/boss.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';
import type { ValidJob } from './validate.ts';
import type { ResultRecord } from '../dispatch/retry.ts';
import { BOSS_QUEUE_DEFAULTS } from '../queue/insert.ts';
import { FAIR_RANK_MAX } from '../scheduler/fair-keys.ts';
import { isUuid } from '../uuid.ts';

export const JOB_STATES = ['QUEUED', 'WAITING_QUOTA', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED'] as const;
export type JobState = (typeof JOB_STATES)[number];
export const FINAL_STATES: readonly JobState[] = ['SUCCEEDED', 'FAILED', 'CANCELLED'];
/** States a waiting job shows (QUEUED, or WAITING_QUOTA while its tenant is quota-blocked). */
export const WAITING_STATES: readonly JobState[] = ['QUEUED', 'WAITING_QUOTA'];

/**
 * The state a job shows, from its stored state and whether its tenant is quota-blocked: a quota
 * wait sets the tenant's flag (sched_tenants.quota_blocked) and leaves its jobs QUEUED, so the
 * lease blocks a tenant in O(1) whatever its backlog; a QUEUED job of a blocked tenant shows
 * WAITING_QUOTA. The same mapping as sluice_job_state (drizzle/functions/), which every read of
 * this module applies (JOB_COLUMNS, the filters by state): TypeScript uses this one.
 */
export function visibleJobState(stored: JobState, quotaBlocked: boolean): JobState {
  return stored === 'QUEUED' && quotaBlocked ? 'WAITING_QUOTA' : stored;
}

/** A job's state as it shows (visibleJobState) in SQL, for `jobs j` joined with QUOTA_JOIN. */
const VISIBLE_STATE = 'sluice_job_state(j.state, qt.quota_blocked)';
/** The join VISIBLE_STATE reads the tenant's quota block through (one row per tenant). */
const QUOTA_JOIN = 'left join sched_tenants qt on qt.tenant_id = j.tenant_id';

type Tx = Sql | postgres.TransactionSql;

export interface JobRow {
  id: string;
  tenantId: string;
  api: string;
  params: Record<string, unknown>;
  priority: JobClass;
  state: JobState;
  idempotencyKey: string | null;
  /** null: the tenant's default key. */
  fairnessKey: string | null;
  attempts: number;
  createdAt: Date;
  /** created_at in epoch microseconds: a Date keeps only milliseconds, too coarse for a keyset cursor. */
  createdAtMicros: string;
  /** A waiting job is not handed out before this (runAt, a retry's delay). */
  runAfter?: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  result: unknown;
  errorCode: string | null;
  errorMessage: string | null;
  httpStatus: number | null;
  creditsBilled: number;
  /** The W3C traceparent it was submitted under (tracing on, trace sampled); null otherwise. */
  traceParent?: string | null;
}

/** A job row as reads return it (its state as it shows: from jobs j, its result on the row, and QUOTA_JOIN); sluice_job_json (drizzle/functions/sluice_job_json.sql) gives the same shape for events. */
const JOB_COLUMNS = `
  j.id, j.tenant_id as "tenantId", j.api, j.params, j.priority, ${VISIBLE_STATE} as state,
  j.idempotency_key as "idempotencyKey", j.fairness_key as "fairnessKey", j.attempts, j.created_at as "createdAt",
  (extract(epoch from j.created_at) * 1000000)::bigint::text as "createdAtMicros", j.run_after as "runAfter",
  j.started_at as "startedAt", j.finished_at as "finishedAt",
  j.result, j.error_code as "errorCode", j.error_message as "errorMessage",
  j.http_status as "httpStatus", coalesce(j.credits_billed, 0) as "creditsBilled", j.trace_parent as "traceParent"`;

export interface NewJob extends ValidJob {
  id: string;
  /** The submit span's traceparent (tracing on, sampled): stored on the row and in the queued job's data. */
  traceParent?: string | null;
}

/** A job row to insert: any tenant, so one statement can carry a whole group commit. */
export interface NewJobRow extends NewJob {
  tenantId: string;
  /** Always QUEUED: a quota-blocked tenant's jobs show WAITING_QUOTA by visibleJobState. */
  state: 'QUEUED';
}

/**
 * Accepted jobs of any tenants into BOTH tables in ONE statement: our `jobs`
 * rows and their pg-boss jobs (`pgboss.job`, as `boss.insert()` writes them:
 * the queue's policies, pg-boss's clock; queue/insert.ts), from one JSON
 * parameter. The pg-boss row is built in SQL from the jobs row just inserted
 * (queue name `t.<tenant>.<class>`, data `{tenantId, api, params}`), so the
 * jobs are serialised, sent and parsed once, not twice; a job whose idempotency
 * key its tenant already used is skipped in both. The statement-level triggers
 * on `jobs` fire at the end of the statement, after both inserts: the depth
 * trigger adds the jobs to their queues' depth and records the default key's
 * newest rank on the same queue row (sluice_queues_add_jobs).
 * Returns how many jobs rows and how many pg-boss rows were written: the
 * caller refuses to commit unless both are every job (a missing queue must not
 * be acknowledged).
 */
export async function insertJobsQueued(tx: Tx, jobs: readonly NewJobRow[]): Promise<{ jobs: number; queued: number }> {
  if (jobs.length === 0) return { jobs: 0, queued: 0 };
  // trace_parent only when traced: an untraced submission's payload is what it always was.
  const payload = jobs.map((j) => ({ id: j.id, tenant_id: j.tenantId, api: j.api, params: j.params, priority: j.priority, state: j.state, idempotency_key: j.idempotencyKey, fairness_key: j.fairnessKey ?? null, run_at: j.runAt?.toISOString() ?? null, retry_of: j.retryOf ?? null, ...(j.traceParent ? { trace_parent: j.traceParent } : {}) }));
  const d = BOSS_QUEUE_DEFAULTS;
  const names = [...new Set(jobs.map((j) => queueName(j.tenantId, j.priority)))];
  // Ranks (scheduler/fair-keys.ts, the same rule): per (tenant, class, fairness key), the key's
  // jobs follow its last waiting job's rank, and a key with nothing waiting starts the round after
  // the queue's head (joining the head's round let new keys hold it open forever). The pg-boss
  // priority is the rank negated, so the lease's own order (priority desc, created_on) serves the
  // keys round robin. Jobs without a key share the default key '' (FIFO, as before).
  const [row] = await tx`
    with x as (
      select x.* from jsonb_to_recordset(${tx.json(payload as never)}::jsonb)
        as x(id uuid, tenant_id uuid, api text, params jsonb, priority text, state text, idempotency_key text, fairness_key text, run_at timestamptz, retry_of uuid, trace_parent text)
    ), j as (
      insert into jobs (id, tenant_id, api, params, priority, state, idempotency_key, fairness_key, run_after, retry_of, trace_parent)
      select x.id, x.tenant_id, x.api, x.params, x.priority, x.state, x.idempotency_key, x.fairness_key, greatest(now(), coalesce(x.run_at, now())), x.retry_of, x.trace_parent
      from x
      on conflict (tenant_id, idempotency_key) where idempotency_key is not null do nothing
      returning id, tenant_id, api, params, priority, run_after, fairness_key, state, trace_parent
    ), kb as (
      -- Each key of this insert once, with its base rank: the round after the head's (the head:
      -- the lowest rank still waiting and ready, pg-boss's fetch index, job_i11, answers it with
      -- one probe; 0 for an empty queue) or after the key's last waiting job, whichever is later
      -- (the statement's snapshot: blind to its own rows). In bigint: the head may be at the cap.
      -- Per key, not per job: a 10,000-job submission of one key makes two probes, not 20,000.
      select d.tenant_id, d.priority, d.fk, greatest(
          coalesce(-(select p.priority from pgboss.job p
            where p.name = 't.' || d.tenant_id || '.' || lower(d.priority) and p.state < 'active' and not p.blocked and p.start_after <= now()
            order by p.priority desc, p.created_on limit 1)::bigint + 1, 0),
          case when d.fk = '' then
            -- The default key's state is on its queue's row (sluice_queues_add_jobs writes it).
            (select q.fair_last_rank::bigint + 1 from sched_queues q
              where q.tenant_id = d.tenant_id and q.class = d.priority
                and (select lj.started_at is null from jobs lj where lj.id = q.fair_last_job))
          else
            (select f.last_rank::bigint + 1 from sched_fair_keys f
              where f.tenant_id = d.tenant_id and f.class = d.priority and f.fairness_key = d.fk
                and (select lj.started_at is null from jobs lj where lj.id = f.last_job)) end) as base
      from (select distinct j.tenant_id, j.priority, coalesce(j.fairness_key, '') as fk from j) d
    ), r as (
      -- Each job with its rank: its key's base plus its place among its key's jobs here, in id
      -- order (ids are time-ordered: submission order). The bases ride in the same stream as the
      -- jobs, first in each key's partition, so a window hands them on without a join (joining
      -- the insert's rows to anything left the planner guessing one row and probing once per job).
      select ranked.id, ranked.tenant_id, ranked.api, ranked.params, ranked.priority, ranked.run_after, ranked.fk, ranked.rank, ranked.state, ranked.tp from (
        select u.*, least(max(u.base) over w + row_number() over w - 2, ${FAIR_RANK_MAX})::int as rank
        from (
          select j.id, j.tenant_id, j.api, j.params, j.priority, j.run_after, coalesce(j.fairness_key, '') as fk, null::bigint as base, j.state, j.trace_parent as tp from j
          union all
          select null::uuid, kb.tenant_id, null::text, null::jsonb, kb.priority, null::timestamptz, kb.fk, kb.base, null::text, null::text from kb) u
        window w as (partition by u.tenant_id, u.priority, u.fk order by u.id nulls first)) ranked
      where ranked.id is not null
    ), b as (
      insert into pgboss.job (id, name, data, priority, start_after, created_on, expire_seconds, deletion_seconds, keep_until,
        retry_limit, retry_delay, retry_backoff, retry_delay_max, policy, dead_letter, heartbeat_seconds)
      select r.id, q.name,
        -- A traced job's data also carries its trace (tracing/job-trace.ts reads it back at lease
        -- time, on whichever node): its traceparent, its fairness key, when it entered the queue
        -- (epoch ms) and why it waits from the start (its quota, or a runAt ahead: [reason, since, until]).
        case when r.tp is null then jsonb_build_object('tenantId', r.tenant_id, 'api', r.api, 'params', r.params)
        else jsonb_build_object('tenantId', r.tenant_id, 'api', r.api, 'params', r.params, 'tp', r.tp, 'fk', r.fk,
          'ta', floor(extract(epoch from now()) * 1000)::bigint,
          'tw', case
            when r.state = 'WAITING_QUOTA' then jsonb_build_array(jsonb_build_array('QUOTA', floor(extract(epoch from now()) * 1000)::bigint))
            when r.run_after > now() then jsonb_build_array(jsonb_build_array('SCHEDULED', floor(extract(epoch from now()) * 1000)::bigint, floor(extract(epoch from r.run_after) * 1000)::bigint))
            else '[]'::jsonb end) end,
        -r.rank,
        greatest(pgboss.job_now(), r.run_after), pgboss.job_now(),
        coalesce(q.expire_seconds, ${d.expireSeconds}), coalesce(q.deletion_seconds, ${d.deletionSeconds}),
        greatest(pgboss.job_now(), r.run_after) + coalesce(q.retention_seconds, ${d.retentionSeconds}) * interval '1s',
        coalesce(q.retry_limit, ${d.retryLimit}), coalesce(q.retry_delay, ${d.retryDelay}), coalesce(q.retry_backoff, false),
        q.retry_delay_max, q.policy, q.dead_letter, q.heartbeat_seconds
      from r join pgboss.queue q on q.name = 't.' || r.tenant_id || '.' || lower(r.priority)
      -- The group's queues by name (an index lookup each): without it the join reads every queue.
      where q.name = any(${names}::text[])
      on conflict do nothing
      returning 1
    ), k as (
      -- Each key's newest job and rank, in key order (concurrent submissions lock the rows in one
      -- order). Not the default key's: the depth trigger keeps it on the queue's row.
      insert into sched_fair_keys (tenant_id, class, fairness_key, last_rank, last_job)
      select distinct on (r.tenant_id, r.priority, r.fk) r.tenant_id, r.priority, r.fk, r.rank, r.id
      from r where r.fk <> ''
      order by r.tenant_id, r.priority, r.fk, r.rank desc, r.id desc
      on conflict (tenant_id, class, fairness_key) do update set last_rank = excluded.last_rank, last_job = excluded.last_job
      returning 1
    )
    select (select count(*) from j)::int as jobs, (select count(*) from b)::int as queued, (select count(*) from k)::int as keys`;
  return { jobs: row!.jobs as number, queued: row!.queued as number };
}

/**
 * One batch of sched_fair_keys rows that no longer count (their key's newest job started, or
 * retention deleted it: nothing of the key waits behind that rank), so a tenant's rows stay
 * bounded by its keys with jobs waiting. Retention's pass (the signature of its other deletes; no
 * age applies). This module owns the table: its rows are written by insertJobsQueued's statement.
 */
export async function deleteStaleFairKeys(sql: Tx, _seconds: number, n: number): Promise<number> {
  const deleted = await sql`
    with doomed as (
      select f.tenant_id, f.class, f.fairness_key from sched_fair_keys f
      where not exists (select 1 from jobs j where j.id = f.last_job and j.started_at is null)
      limit ${n} for update of f skip locked)
    delete from sched_fair_keys f using doomed d
    where f.tenant_id = d.tenant_id and f.class = d.class and f.fairness_key = d.fairness_key`;
  return deleted.count;
}

export interface OriginalJob {
  id: string;
  state: JobState;
  api: string;
  params: Record<string, unknown>;
}

/** `${tenantId}:${key}` → the job first submitted under it, with what it asked for (to tell a replay from a conflict). */
export async function originalsByIdempotencyKey(tx: Tx, pairs: ReadonlyArray<{ tenantId: string; key: string }>): Promise<Map<string, OriginalJob>> {
  if (pairs.length === 0) return new Map();
  const rows = await tx`
    select j.id, ${tx.unsafe(VISIBLE_STATE)} as state, j.api, j.params, j.tenant_id, j.idempotency_key from jobs j ${tx.unsafe(QUOTA_JOIN)}
    join jsonb_to_recordset(${tx.json(pairs.map((p) => ({ t: p.tenantId, k: p.key })) as never)}::jsonb) as x(t uuid, k text)
      on j.tenant_id = x.t and j.idempotency_key = x.k`;
  return new Map(
    rows.map((r) => [`${r.tenant_id}:${r.idempotency_key}`, { id: r.id as string, state: r.state as JobState, api: r.api as string, params: r.params as Record<string, unknown> }]),
  );
}

export async function getJob(sql: Tx, tenantId: string | null, id: string): Promise<JobRow | null> {
  const rows = await sql.unsafe(
    `select ${JOB_COLUMNS} from jobs j ${QUOTA_JOIN}
     where j.id = $1 and ($2::uuid is null or j.tenant_id = $2::uuid)`,
    [id, tenantId],
  );
  return (rows[0] as unknown as JobRow) ?? null;
}

export interface JobFilter {
  state?: JobState | null | undefined;
  api?: string | null | undefined;
  priority?: JobClass | null | undefined;
  idempotencyKey?: string | null | undefined;
}

/** Keyset page of a tenant's jobs, newest first. `after` is the (createdAtMicros, id) of the last row seen. */
export async function listJobs(
  sql: Tx,
  tenantId: string,
  filter: JobFilter,
  limit: number,
  after: { createdAtMicros: string; id: string } | null,
): Promise<JobRow[]> {
  const rows = await sql.unsafe(
    `select ${JOB_COLUMNS} from jobs j ${QUOTA_JOIN}
     where j.tenant_id = $1
       and ($2::text is null or ${VISIBLE_STATE} = $2) and ($3::text is null or j.api = $3) and ($4::text is null or j.priority = $4)
       and ($8::text is null or j.idempotency_key = $8)
       and ($5::bigint is null or (j.created_at, j.id) < (to_timestamp($5::bigint / 1000000.0), $6::uuid))
     order by j.created_at desc, j.id desc
     limit $7`,
    [tenantId, filter.state ?? null, filter.api ?? null, filter.priority ?? null, after?.createdAtMicros ?? null, after?.id ?? null, limit, filter.idempotencyKey ?? null],
  );
  return rows as unknown as JobRow[];
}

export async function countJobs(sql: Tx, tenantId: string, filter: JobFilter): Promise<number> {
  const [row] = await sql`
    select count(*)::int as n from jobs j ${sql.unsafe(QUOTA_JOIN)}
    where j.tenant_id = ${tenantId}
      and (${filter.state ?? null}::text is null or ${sql.unsafe(VISIBLE_STATE)} = ${filter.state ?? null})
      and (${filter.api ?? null}::text is null or j.api = ${filter.api ?? null})
      and (${filter.priority ?? null}::text is null or j.priority = ${filter.priority ?? null})
      and (${filter.idempotencyKey ?? null}::text is null or j.idempotency_key = ${filter.idempotencyKey ?? null})`;
  return row!.n as number;
}

/** Per class, when the tenant's earliest QUEUED job is due (runAt, a retry's delay): one index probe per class. */
export async function earliestRunAfter(sql: Tx, tenantId: string): Promise<Map<JobClass, Date>> {
  const rows = await sql`
    select c.class, (select run_after from jobs where tenant_id = ${tenantId} and priority = c.class and state = 'QUEUED' order by run_after limit 1) as at
    from unnest(${CLASSES as unknown as string[]}::text[]) as c(class)`;
  return new Map(rows.filter((r) => r.at !== null).map((r) => [r.class as JobClass, r.at as Date]));
}

/** The tenant's waiting jobs (QUEUED, WAITING_QUOTA) matching the filter, oldest first, at most `limit` (cancelJobs' pick). */
export async function waitingJobsMatching(tx: Tx, tenantId: string, filter: JobFilter, limit: number): Promise<Array<{ id: string; priority: JobClass }>> {
  const rows = await tx`
    select j.id, j.priority from jobs j ${tx.unsafe(QUOTA_JOIN)}
    where j.tenant_id = ${tenantId} and j.state in ('QUEUED', 'WAITING_QUOTA')
      and (${filter.state ?? null}::text is null or ${tx.unsafe(VISIBLE_STATE)} = ${filter.state ?? null})
      and (${filter.api ?? null}::text is null or j.api = ${filter.api ?? null})
      and (${filter.priority ?? null}::text is null or j.priority = ${filter.priority ?? null})
      and (${filter.idempotencyKey ?? null}::text is null or j.idempotency_key = ${filter.idempotencyKey ?? null})
    order by j.created_at, j.id limit ${limit}`;
  return rows.map((r) => ({ id: r.id as string, priority: r.priority as JobClass }));
}

/** QUEUED or WAITING_QUOTA → CANCELLED for these jobs of the tenant (those still waiting); returns them with their class. */
export async function cancelQueuedJobs(tx: Tx, tenantId: string, ids: readonly string[]): Promise<Array<{ id: string; priority: JobClass }>> {
  if (ids.length === 0) return [];
  const rows = await tx`
    update jobs set state = 'CANCELLED', finished_at = now(), updated_at = now()
    where id = any(${ids as string[]}::uuid[]) and tenant_id = ${tenantId} and state in ('QUEUED', 'WAITING_QUOTA')
    returning id, priority`;
  return rows.map((r) => ({ id: r.id as string, priority: r.priority as JobClass }));
}

/**
 * Jobs of any tenant (the operator's job search): the job with this id, and
 * the jobs submitted under this idempotency key, newest first. The key is
 * looked up without its tenant through the (tenant_id, idempotency_key)
 * index, which Postgres 18 skip-scans.
 */
export async function findJobs(sql: Tx, text: string, limit: number): Promise<JobRow[]> {
  const id = isUuid(text) ? text : null;
  const rows = await sql.unsafe(
    `select ${JOB_COLUMNS} from jobs j ${QUOTA_JOIN}
     where ($1::uuid is not null and j.id = $1::uuid) or j.idempotency_key = $2
     order by j.created_at desc, j.id desc
     limit $3`,
    [id, text, limit],
  );
  return rows as unknown as JobRow[];
}

/** Each of these jobs' `retry_of` (the job it was submitted again from), where set. */
export async function retriedFrom(sql: Tx, ids: readonly string[]): Promise<Map<string, string>> {
  if (ids.length === 0) return new Map();
  const rows = await sql`select id, retry_of from jobs where id = any(${ids as string[]}::uuid[]) and retry_of is not null`;
  return new Map(rows.map((r) => [r.id as string, r.retry_of as string]));
}

/** The class of a tenant's job (it never changes), or null when there is no such job. */
export async function jobClassOf(tx: Tx, tenantId: string, id: string): Promise<JobClass | null> {
  const [row] = await tx`select priority from jobs where id = ${id} and tenant_id = ${tenantId}`;
  return (row?.priority as JobClass | undefined) ?? null;
}

/** QUEUED or WAITING_QUOTA → CANCELLED for the tenant's job; returns its class, or null when it was not waiting. */
export async function cancelQueuedJob(tx: Tx, tenantId: string, id: string): Promise<JobClass | null> {
  const rows = await tx`
    update jobs set state = 'CANCELLED', finished_at = now(), updated_at = now()
    where id = ${id} and tenant_id = ${tenantId} and state in ('QUEUED', 'WAITING_QUOTA')
    returning priority`;
  return (rows[0]?.priority as JobClass) ?? null;
}

/**
 * A deleted tenant's waiting jobs → CANCELLED (they hold no reservation: nothing to bill or
 * refund); returns their ids.
 */
export async function cancelTenantWaitingJobs(tx: Tx, tenantId: string): Promise<string[]> {
  const rows = await tx`
    update jobs set state = 'CANCELLED', finished_at = now(), updated_at = now()
    where tenant_id = ${tenantId} and state in ('QUEUED', 'WAITING_QUOTA') returning id`;
  return rows.map((r) => r.id as string);
}

/**
 * A lifted quota block: the tenant's jobs stored WAITING_QUOTA (by a version that wrote the wait
 * into each job; a block now leaves them QUEUED) → QUEUED; returns each one's class.
 */
export async function queueQuotaWaitingJobs(tx: Tx, tenantId: string): Promise<JobClass[]> {
  const rows = await tx`
    update jobs set state = 'QUEUED', updated_at = now() where tenant_id = ${tenantId} and state = 'WAITING_QUOTA'
    returning priority`;
  return rows.map((r) => r.priority as JobClass);
}

/**
 * Retention: one batch of jobs finished more than `seconds` ago (their results go with them, on
 * delete cascade); rows another pass holds are skipped. Returns how many went.
 */
export async function deleteFinishedJobs(sql: Tx, seconds: number, n: number): Promise<number> {
  const deleted = await sql`
    with doomed as (
      select id from jobs
      where state in ('SUCCEEDED', 'FAILED', 'CANCELLED') and finished_at < now() - make_interval(secs => ${seconds})
      order by finished_at limit ${n} for update skip locked)
    delete from jobs j using doomed where j.id = doomed.id`;
  return deleted.count;
}

export type { ResultRecord };

/**
 * The SET columns of a job's result, for the update that changes its state outside a settlement
 * group's finish (a put-back keeping its attempt's outcome, a late settlement, the reconciler), so
 * the row is written once (invariant I6: one result per job id). Its credits_billed is not written
 * here: the settling statement adds every credit it bills to the job's row, whoever settles (I11:
 * sluice_bill_jobs, or sluice_finish_jobs with the bill of a settlement group), and nothing else
 * does. The job's own attempts column counts its attempts.
 */
const resultColumns = (tx: Tx, r: ResultRecord) =>
  tx`result = ${r.data === null || r.data === undefined ? null : tx.json(r.data as never)}, error_code = ${r.errorCode},
    error_message = ${r.errorMessage}, http_status = ${r.httpStatus}`;

/**
 * Adds a correction to the job's creditsBilled (a late settlement that knew
 * better than the expiry's guess, dispatch/late-settlement.ts), on its row.
 * The ledger moves by the same amount in the same transaction.
 */
export async function addJobCredits(tx: Tx, jobId: string, delta: number): Promise<void> {
  await tx`update jobs set credits_billed = coalesce(credits_billed, 0) + ${delta}, updated_at = now() where id = ${jobId}`;
}

/** A job's state and attempt count, or null when it is gone. */
export async function jobStateOf(tx: Tx, id: string): Promise<{ state: JobState; attempts: number } | null> {
  const [row] = await tx`select state, attempts from jobs where id = ${id}`;
  return row ? { state: row.state as JobState, attempts: row.attempts as number } : null;
}

/**
 * QUEUED or WAITING_QUOTA on this attempt (not leased again) → SUCCEEDED or
 * FAILED, with its result: a late settlement brought the outcome of the attempt the sweeper
 * had given up on. The caller locked its pg-boss row first and deletes it.
 */
export async function finishWaitingJob(tx: Tx, id: string, attempt: number, state: 'SUCCEEDED' | 'FAILED', result: ResultRecord): Promise<boolean> {
  const rows = await tx`
    update jobs set state = ${state}, finished_at = now(), updated_at = now(), ${resultColumns(tx, result)}
    where id = ${id} and state in ('QUEUED', 'WAITING_QUOTA') and attempts = ${attempt} returning id`;
  return rows.length > 0;
}

export interface FinishedJob {
  id: string;
  attempt: number;
  state: 'SUCCEEDED' | 'FAILED';
  /** The pg-boss queue it was fetched from (its ack). */
  queue: string;
  result: ResultRecord;
}

/**
 * A final state as sluice_finish_jobs (drizzle/functions/) takes it: the job
 * finished, its result stored and its pg-boss ack, fenced by its attempt, for
 * many jobs in one statement (the settlement calls it through
 * sluice_settle_group).
 */
export function finishItem(j: FinishedJob) {
  return {
    id: j.id,
    attempt: j.attempt,
    state: j.state,
    queue: j.queue,
    data: j.result.data ?? null,
    error_code: j.result.errorCode,
    error_message: j.result.errorMessage,
    http_status: j.result.httpStatus,
  };
}

/**
 * Final states outside a settlement (an attempt lost past the job's attempt limit): sluice_finish_jobs
 * for many jobs in one statement, each fenced by its attempt. Returns the ids it finished.
 */
export async function finishJobs(tx: Tx, jobs: readonly FinishedJob[]): Promise<Set<string>> {
  if (jobs.length === 0) return new Set();
  const rows = await tx`select sluice_finish_jobs(${tx.json(jobs.map(finishItem) as never)}::jsonb) as id`;
  return new Set(rows.map((r) => r.id as string));
}

/** Jobs that failed with ATTEMPT_LOST within the last `seconds` (the alert's facts; a partial index holds only them). */
export async function recentAttemptLost(sql: Tx, seconds: number, limit = 5): Promise<{ count: number; jobIds: string[] }> {
  const rows = await sql`
    select id, count(*) over ()::int as n from jobs
    where error_code = 'ATTEMPT_LOST' and finished_at > now() - make_interval(secs => ${seconds})
    order by finished_at desc limit ${limit}`;
  return { count: (rows[0]?.n as number | undefined) ?? 0, jobIds: rows.map((r) => r.id as string) };
}

/**
 * RUNNING (on this attempt) → QUEUED, ready after `delaySeconds`, with the attempt's result. A
 * put-back gives back the attempt it claimed: it was not the job's fault.
 */
export async function requeueJob(tx: Tx, id: string, attempt: number, countsAsAttempt: boolean, delaySeconds: number, result: ResultRecord): Promise<boolean> {
  const rows = await tx`
    update jobs set state = 'QUEUED', updated_at = now(), ${resultColumns(tx, result)},
      run_after = now() + make_interval(secs => ${delaySeconds}),
      attempts = case when ${countsAsAttempt}::boolean then attempts else greatest(attempts - 1, 0) end
    where id = ${id} and state = 'RUNNING' and attempts = ${attempt} returning id`;
  return rows.length > 0;
}

/**
 * Jobs whose attempt lease expired (their reservations just settled) go
 * back to QUEUED, each only while still on that attempt. The caller puts
 * their pg-boss jobs back.
 */
export async function releaseLostJobs(tx: Tx, attempts: ReadonlyArray<{ jobId: string; attempt: number }>): Promise<Array<{ id: string; tenantId: string; priority: JobClass; api: string; params: Record<string, unknown>; traceParent: string | null }>> {
  if (attempts.length === 0) return [];
  const rows = await tx`
    update jobs j set state = 'QUEUED', run_after = now(), updated_at = now()
    from jsonb_to_recordset(${tx.json(attempts.map((a) => ({ job_id: a.jobId, attempt: a.attempt })) as never)}::jsonb) as x(job_id uuid, attempt int)
    where j.id = x.job_id and j.state = 'RUNNING' and j.attempts = x.attempt
    returning j.id, j.tenant_id, j.priority, j.api, j.params, j.trace_parent`;
  return rows.map((r) => ({ id: r.id as string, tenantId: r.tenant_id as string, priority: r.priority as JobClass, api: r.api as string, params: r.params as Record<string, unknown>, traceParent: (r.trace_parent as string | null) ?? null }));
}

/** QUEUED or WAITING_QUOTA → FAILED with its result (the reconciler: its queue is gone); false when it was not waiting. */
export async function failWaitingJob(tx: Tx, id: string, result: ResultRecord): Promise<boolean> {
  const rows = await tx`
    update jobs set state = 'FAILED', finished_at = now(), updated_at = now(), ${resultColumns(tx, result)}
    where id = ${id} and state in ('QUEUED', 'WAITING_QUOTA')`;
  return rows.count > 0;
}

/**
 * A tenant's jobs that reached a final state at or after `since` (the
 * database's clock), oldest first, with the database's time of the read: a
 * jobsCompleted subscription re-reads them after missing events (re-LISTEN).
 */
export async function finishedSince(sql: Tx, tenantId: string, since: Date, limit = 10_000): Promise<{ rows: JobRow[]; dbNow: Date }> {
  const rows = await sql.unsafe(
    `select ${JOB_COLUMNS}, now() as "dbNow" from jobs j ${QUOTA_JOIN}
     where j.tenant_id = $1 and j.state in ('SUCCEEDED', 'FAILED', 'CANCELLED') and j.finished_at >= $2
     order by j.finished_at, j.id
     limit $3`,
    [tenantId, since, limit],
  );
  const [now] = rows.length > 0 ? [{ dbNow: rows[0]!.dbNow as Date }] : await sql`select now() as "dbNow"`;
  return { rows: rows as unknown as JobRow[], dbNow: now!.dbNow as Date };
}
