/**
 * Sluice's own tables (pg-boss owns the `pgboss` schema). Each table has one
 * owning TypeScript module that writes it (tenants and tenant_api_keys →
 * src/tenants/store.ts, jobs → src/jobs/store.ts, settings →
 * src/db/settings.ts, the scheduler's tables → src/scheduler/sql/<table>.ts, ...),
 * and the SQL functions that write it own their own statements: the whole map
 * is docs/ARCHITECTURE.md "Who writes each table" (test/table-owners.test.ts).
 * A change of a table here becomes a migration with `npm run db:generate` (drizzle-kit compares
 * this file with the newest snapshot in drizzle/meta, which matches it). Triggers, partial indexes
 * and data steps are written into a custom migration (`drizzle-kit generate --custom`); SQL
 * functions live in drizzle/functions/ and are installed with `npm run db:function`.
 */
import { sql } from 'drizzle-orm';
import { bigint, bigserial, boolean, check, doublePrecision, index, integer, jsonb, numeric, pgTable, primaryKey, text, timestamp, uniqueIndex, uuid } from 'drizzle-orm/pg-core';

const timestamps = {
  createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
};

export const tenants = pgTable(
  'tenants',
  {
    id: uuid('id').primaryKey(),
    name: text('name').notNull(),
    tier: text('tier').notNull(),
    /** Per-tenant overrides of the tier's defaults; null means "use the tier's". */
    weight: integer('weight'),
    concurrencyCap: integer('concurrency_cap'),
    monthlyQuota: integer('monthly_quota'),
    queueBound: integer('queue_bound'),
    /** Request budget overrides in cost points (burst) and points per second (rate); null: the tier's. */
    requestBurst: integer('request_burst'),
    requestRate: integer('request_rate'),
    /** What happens when the next job would pass the quota: WAIT (visible) or FAIL (QUOTA_EXCEEDED). */
    quotaPolicy: text('quota_policy').notNull().default('WAIT'),
    /** The quota period starts on this instant's monthly anniversary. */
    periodAnchor: timestamp('period_anchor', { withTimezone: true }).notNull().defaultNow(),
    /** Set while the tenant is suspended: submissions refused, dispatch skips it. */
    suspendedAt: timestamp('suspended_at', { withTimezone: true }),
    /**
     * The fraction (0 to 1) of a window's dispatches guaranteed while the tenant is backlogged, lent
     * to others while it is idle; null: none. The sum over tenants stays <= 0.8 (tenants/store.ts).
     */
    reservedShare: doublePrecision('reserved_share'),
    ...timestamps,
  },
  (t) => [
    uniqueIndex('tenants_name_key').on(t.name),
    check('tenants_reserved_share_check', sql`${t.reservedShare} is null or (${t.reservedShare} >= 0 and ${t.reservedShare} <= 1)`),
    check('tenants_tier_check', sql`${t.tier} in ('FREE', 'PRO', 'ENTERPRISE')`),
    check('tenants_quota_policy_check', sql`${t.quotaPolicy} in ('WAIT', 'FAIL')`),
  ],
);

/**
 * Each tenant's request budget (a token bucket of cost points), shared by every API node; owned by
 * src/tenants/budget-store.ts. The bucket's size and rate are not stored here: they are the tenant's
 * effective limits, passed in by each statement, so an override applies at the next request.
 */
export const tenantRequestBudgets = pgTable('tenant_request_budgets', {
  tenantId: uuid('tenant_id')
    .primaryKey()
    .references(() => tenants.id, { onDelete: 'cascade' }),
  /** Points left at `updated_at` (restored lazily: rate × elapsed, capped at the burst). */
  tokens: doublePrecision('tokens').notNull(),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull(),
});

export const tenantApiKeys = pgTable(
  'tenant_api_keys',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    /** SHA-256 of the key: the key itself is shown once and never stored. */
    keyHash: text('key_hash').notNull(),
    /** The first characters of the key, to tell keys apart in listings. */
    keyPrefix: text('key_prefix').notNull(),
    /** What the tenant calls it ("ci", "dashboard"); keys from before named keys are "default". */
    name: text('name').notNull().default('default'),
    /** What the key may do: SUBMIT (submit and cancel), READ (queries and subscriptions). */
    scopes: text('scopes').array().notNull().default(sql`'{SUBMIT,READ}'::text[]`),
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
    /** The key stops authenticating at this instant (set by the tenant, or by a rotation's overlap). */
    expiresAt: timestamp('expires_at', { withTimezone: true }),
    /** When the key last authenticated, to within a minute: each process writes it at most once a minute per key. */
    lastUsedAt: timestamp('last_used_at', { withTimezone: true }),
    revokedAt: timestamp('revoked_at', { withTimezone: true }),
  },
  (t) => [
    uniqueIndex('tenant_api_keys_hash_key').on(t.keyHash),
    index('tenant_api_keys_tenant_idx').on(t.tenantId),
    check('tenant_api_keys_scopes_check', sql`cardinality(${t.scopes}) > 0 and ${t.scopes} <@ '{SUBMIT,READ}'::text[]`),
  ],
);

/**
 * A job: its state, its attempts and, once finished, its result and bill. Its heap keeps 30 % of
 * every page free (fillfactor 70, set by its migration: drizzle does not model it): a job is
 * written twice after its insert (claim, finish), both non-HOT, and a new version that fits on the
 * old one's page saves a WAL record per write (the lock Postgres logs before it moves a row to
 * another page) and most of the new version's bytes (logged as a change of the old).
 */
export const jobs = pgTable(
  'jobs',
  {
    /** Same id as the pg-boss job, so the two records join without a mapping table. */
    id: uuid('id').primaryKey(),
    /**
     * The tenant's id. No foreign key: statement-level triggers check it once per
     * insert statement (the tenants locked FOR KEY SHARE, as the key's check did per row) and
     * delete a deleted tenant's jobs (the key's ON DELETE CASCADE).
     */
    tenantId: uuid('tenant_id').notNull(),
    api: text('api').notNull(),
    params: jsonb('params').notNull(),
    priority: text('priority').notNull(),
    state: text('state').notNull(),
    idempotencyKey: text('idempotency_key'),
    /**
     * The FAILED or CANCELLED job this one was submitted again from (`retryJob`). No foreign key:
     * the original may be deleted by retention first, and the link is only shown, never followed.
     */
    retryOf: uuid('retry_of'),
    /** Who inside the tenant the job is for (JobInput.fairnessKey); null: the tenant's default key. */
    fairnessKey: text('fairness_key'),
    /**
     * The W3C traceparent of the request that submitted the job (its submit span), when tracing
     * was on and the trace sampled: the console shows its trace id and events carry it so a
     * webhook or a subscriber's push joins the job's trace. Null otherwise (src/tracing/).
     */
    traceParent: text('trace_parent'),
    /** Upstream attempts made so far; also the fencing token of the current attempt. */
    attempts: integer('attempts').notNull().default(0),
    /** A queued job is ready from this instant (retries and put-backs wait). */
    runAfter: timestamp('run_after', { withTimezone: true }).notNull().defaultNow(),
    startedAt: timestamp('started_at', { withTimezone: true }),
    finishedAt: timestamp('finished_at', { withTimezone: true }),
    /**
     * Its result (invariant I6: one per job id), on its own row: written by the update that
     * finishes it (sluice_finish_jobs), or by a put-back that keeps the last attempt's outcome, not
     * by a row of another table inserted per finished job.
     */
    result: jsonb('result'),
    errorCode: text('error_code'),
    errorMessage: text('error_message'),
    httpStatus: integer('http_status'),
    /** What its attempts were billed (I11), added by the statement that settles each; null: 0. */
    creditsBilled: integer('credits_billed'),
    ...timestamps,
  },
  (t) => [
    uniqueIndex('jobs_tenant_idempotency_key').on(t.tenantId, t.idempotencyKey).where(sql`${t.idempotencyKey} is not null`),
    index('jobs_tenant_created_idx').on(t.tenantId, t.createdAt.desc(), t.id.desc()),
    index('jobs_queued_idx').on(t.tenantId, t.priority, t.runAfter).where(sql`${t.state} = 'QUEUED'`),
    index('jobs_queued_age_idx').on(t.priority, t.createdAt).where(sql`${t.state} = 'QUEUED'`),
    index('jobs_tenant_queued_age_idx').on(t.tenantId, t.priority, t.createdAt).where(sql`${t.state} in ('QUEUED', 'WAITING_QUOTA')`),
    // The reconciler's keyset walk over waiting jobs: an index range in its order, never a sort of the backlog.
    index('jobs_waiting_created_idx').on(t.createdAt, t.id).where(sql`${t.state} in ('QUEUED', 'WAITING_QUOTA')`),
    // The running jobs per queue (visibility's counts): no counter to keep, in the claim and the
    // finish, for figures only the status reads want; the index holds only the calls in flight.
    index('jobs_running_idx').on(t.tenantId, t.priority).where(sql`${t.state} = 'RUNNING'`),
    // Retention's walk over finished jobs.
    index('jobs_finished_idx').on(t.finishedAt).where(sql`${t.state} in ('SUCCEEDED', 'FAILED', 'CANCELLED')`),
    // The alert on jobs whose attempts kept being lost reads the last hour of them: a tiny index.
    index('jobs_attempt_lost_idx').on(t.finishedAt).where(sql`${t.errorCode} = 'ATTEMPT_LOST'`),
    check('jobs_priority_check', sql`${t.priority} in ('INTERACTIVE', 'STANDARD', 'BULK')`),
    check('jobs_state_check', sql`${t.state} in ('QUEUED', 'WAITING_QUOTA', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')`),
  ],
);

/** Small process-wide values that must survive restarts (e.g. the admin token's hash). */
export const settings = pgTable('settings', {
  key: text('key').primaryKey(),
  value: text('value').notNull(),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
});

/* ---- The scheduler's shared state (one module per table in src/scheduler/sql/) ---- */

/** A tenant's effective limits and live counters, as the scheduler needs them in one row. */
export const schedTenants = pgTable(
  'sched_tenants',
  {
    tenantId: uuid('tenant_id')
      .primaryKey()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    weight: integer('weight').notNull(),
    cap: integer('cap').notNull(),
    quota: bigint('quota', { mode: 'number' }).notNull(),
    quotaPolicy: text('quota_policy').notNull(),
    periodAnchor: timestamp('period_anchor', { withTimezone: true }).notNull(),
    /** Calls in flight across all nodes (I3: never above cap). */
    inFlight: integer('in_flight').notNull().default(0),
    /**
     * Credits held by the tenant's open reservations, whatever their period: the lease adds them in
     * the write that takes the cap slots, the settlement takes them off in the one that gives them
     * back (I4: the current period's billed + this <= quota; across a period's turn a call still
     * open from the last period counts against the new one until it settles, never the other way).
     */
    reserved: bigint('reserved', { mode: 'number' }).notNull().default(0),
    /** Set when the tenant's next job would pass its quota (policy WAIT); cleared by the sweeper. */
    quotaBlocked: boolean('quota_blocked').notNull().default(false),
    quotaBlockedCost: integer('quota_blocked_cost').notNull().default(0),
    /** The tenant is suspended: dispatch skips it, its queued jobs wait (reason SUSPENDED). */
    suspended: boolean('suspended').notNull().default(false),
    /** The tenant's reserved share (0: none); the lease raises its weight by it while it is backlogged. */
    reservedShare: doublePrecision('reserved_share').notNull().default(0),
  },
  // The sweeper's round reads only the blocked tenants.
  // Counters are never clamped: releasing a slot not taken raises here instead of hiding.
  // The lease looks for reserved tenants through their own index: with none, it costs one probe.
  (t) => [
    index('sched_tenants_quota_blocked_idx').on(t.tenantId).where(sql`${t.quotaBlocked}`),
    index('sched_tenants_reserved_idx').on(t.tenantId).where(sql`${t.reservedShare} > 0`),
    check('sched_tenants_in_flight_check', sql`${t.inFlight} >= 0`),
    check('sched_tenants_reserved_check', sql`${t.reserved} >= 0`),
  ],
);

/** One row per (tenant, class) queue: its virtual time and when it next has ready work. */
export const schedQueues = pgTable(
  'sched_queues',
  {
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    jobClass: text('class').notNull(),
    vtime: doublePrecision('vtime').notNull().default(0),
    /** null: nothing queued. Otherwise the queue has work ready from this instant. */
    readyAt: timestamp('ready_at', { withTimezone: true }),
    /** Jobs waiting (QUEUED or WAITING_QUOTA), kept exact by triggers on jobs. */
    depth: integer('depth').notNull().default(0),
    /**
     * Dormant work, out of the fair index until the event that changes it (docs/ARCHITECTURE.md
     * "Dormant work"). tenantDormant: the tenant's copy of (suspended or quota-blocked), written
     * with it; scheduled: every job waiting is due later, ready_at says when (the lease's due
     * check wakes it); heldApi: every due job is for this API, whose breaker was open for the lease
     * that looked (a lease not holding it, or a submission, wakes it).
     */
    tenantDormant: boolean('tenant_dormant').notNull().default(false),
    scheduled: boolean('scheduled').notNull().default(false),
    heldApi: text('held_api'),
    /**
     * The default key's state (jobs without a fairness key), the row sched_fair_keys keeps for the
     * others: the rank of its newest job and that job. On the queue's row because the depth
     * trigger writes that row for every insert anyway (sluice_queues_add_jobs), so a group of
     * submissions from many tenants writes one row per tenant, not two. Counts only while its job
     * has not started, as in sched_fair_keys; null before the queue's first job without a key.
     */
    fairLastRank: integer('fair_last_rank'),
    fairLastJob: uuid('fair_last_job'),
  },
  (t) => [
    primaryKey({ columns: [t.tenantId, t.jobClass] }),
    // Busy queues by virtual time, ties by tenant id: the lease's fair order (sluice_lease_pick)
    // walks it, so a decision never reads idle tenants (it is the only index on that prefix)
    // nor dormant ones (suspended, quota-blocked, scheduled later, held by a breaker).
    index('sched_queues_fair_idx')
      .on(t.jobClass, t.vtime, t.tenantId)
      .where(sql`${t.readyAt} is not null and not ${t.tenantDormant} and not ${t.scheduled} and ${t.heldApi} is null`),
    // The lease's due check: scheduled queues by when they are due (one probe when none is).
    index('sched_queues_due_idx').on(t.readyAt).where(sql`${t.scheduled}`),
    // Queues held by a breaker, by API: a lease not holding the API wakes them (one probe per held API).
    index('sched_queues_held_idx').on(t.heldApi).where(sql`${t.heldApi} is not null`),
    // Counters are never clamped: a delta below zero raises.
    check('sched_queues_depth_check', sql`${t.depth} >= 0`),
  ],
);

/**
 * Fairness keys inside a queue: each (tenant, class, key)'s last rank, so the next job of the key
 * is ranked after it (start-time fair queueing among a queue's keys, src/scheduler/fair-keys.ts;
 * the rank is the job's pg-boss priority, negated). The default key (jobs without one) is kept on
 * the queue's row instead (sched_queues.fair_last_rank, fair_last_job). A row counts only while
 * its last job has not started (a key whose jobs were all served starts the round after the
 * queue's head); retention deletes the rows whose last job is gone or started, so the rows are
 * bounded by the keys with jobs waiting, per tenant.
 */
export const schedFairKeys = pgTable(
  'sched_fair_keys',
  {
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    jobClass: text('class').notNull(),
    fairnessKey: text('fairness_key').notNull(),
    lastRank: integer('last_rank').notNull(),
    /** The key's newest job (no foreign key: retention deletes jobs first, then prunes the row). */
    lastJob: uuid('last_job').notNull(),
  },
  (t) => [primaryKey({ columns: [t.tenantId, t.jobClass, t.fairnessKey] })],
);

/** Each class's virtual clock: the virtual time of the last queue served. */
export const schedClasses = pgTable('sched_classes', {
  jobClass: text('class').primaryKey(),
  clock: doublePrecision('clock').notNull().default(0),
  /** When a job of this class was last dispatched (the starvation guard's turn counter). */
  servedAt: timestamp('served_at', { withTimezone: true }),
  /**
   * The reserved-shares totals of the class's queues in the fair index (backlogged): R, the
   * reserved shares, and W, the unreserved weight (W + reserved_weight: the whole backlogged weight). Folded from sched_share_deltas (appended by
   * triggers on sched_queues and sched_tenants); readers add the unfolded deltas. Numeric: a
   * share added and taken away again leaves exactly 0.
   */
  reservedSum: numeric('reserved_sum').notNull().default('0'),
  unreservedWeight: numeric('unreserved_weight').notNull().default('0'),
  /** The backlogged reserved tenants' weight: with W, the whole backlogged weight the rest of the pace is shared by. */
  reservedWeight: numeric('reserved_weight').notNull().default('0'),
});

/**
 * Changes of the reserved-shares totals (sched_classes.reserved_sum, unreserved_weight, reserved_weight), appended
 * by triggers when a queue enters or leaves the fair index or a backlogged tenant's weight or share
 * changes; insert-only, so no writer waits on another. The sweeper folds them (sluice_fold_shares).
 */
export const schedShareDeltas = pgTable(
  'sched_share_deltas',
  { jobClass: text('class').notNull(), r: numeric('r').notNull(), w: numeric('w').notNull(), rw: numeric('rw').notNull().default('0') },
  (t) => [index('sched_share_deltas_idx').on(t.jobClass)],
);

/**
 * The front door's global gate: one row per class, locked by every submitting
 * transaction before anything else, so admissions are serialized and the global bound is exact.
 * `depth` is an upper estimate of waiting jobs kept by submissions only, reconciled from
 * sched_queues.depth when a check would refuse.
 */
export const admissionTotals = pgTable('admission_totals', {
  jobClass: text('class').primaryKey(),
  depth: bigint('depth', { mode: 'number' }).notNull().default(0),
  reconciledAt: timestamp('reconciled_at', { withTimezone: true }).notNull().defaultNow(),
});

/** Room a large keyless submission was admitted into, until its jobs are written or it expires. */
export const admissionReservations = pgTable(
  'admission_reservations',
  {
    id: uuid('id').notNull(),
    jobClass: text('class').notNull(),
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    jobs: integer('jobs').notNull(),
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
    expiresAt: timestamp('expires_at', { withTimezone: true }).notNull(),
  },
  (t) => [primaryKey({ columns: [t.id, t.jobClass] }), index('admission_reservations_tenant_idx').on(t.tenantId), index('admission_reservations_expires_idx').on(t.expiresAt)],
);

/** One upstream rate window (key): its pacer bucket, pause and in-flight count, shared by every node. */
export const windows = pgTable(
  'windows',
  {
  name: text('name').primaryKey(),
  /**
   * Paced calls per minute now, the rate leases refill by; null = unlimited (no pacer). With a
   * learned pace (scheduler/learned-pace.ts) it is lowered below the configured rate when the
   * provider's answers show a smaller window, and climbs back towards it.
   */
  ratePerMinute: doublePrecision('rate_per_minute'),
  /** Bucket size now: the configured burst scaled with the learned rate (the same seconds' worth). */
  burst: doublePrecision('burst').notNull(),
  /** What configuration says: limit × PACE_FRACTION, and its burst; the learned rate never goes above it. */
  configuredRatePerMinute: doublePrecision('configured_rate_per_minute'),
  configuredBurst: doublePrecision('configured_burst'),
  /** The provider's x-rate-limit-limit as last written by a node that learned from it. */
  observedLimitPerMinute: doublePrecision('observed_limit_per_minute'),
  /** Why the rate last changed (LIMIT, DRAIN, RATE_LIMITED, CLIMB), and when. */
  paceReason: text('pace_reason'),
  pacedAt: timestamp('paced_at', { withTimezone: true }),
  tokens: doublePrecision('tokens').notNull(),
  refilledAt: timestamp('refilled_at', { withTimezone: true }).notNull().defaultNow(),
  pausedUntil: timestamp('paused_until', { withTimezone: true }),
  pauseReason: text('pause_reason'),
  /**
   * The last pause the provider asked for beyond RETRY_AFTER_MAX_SECONDS (the seconds asked, and
   * when): the pause was capped, and an alert names the window and the value while it is recent.
   */
  cappedAskSeconds: doublePrecision('capped_ask_seconds'),
  cappedAskAt: timestamp('capped_ask_at', { withTimezone: true }),
  inFlight: integer('in_flight').notNull().default(0),
  poolSize: integer('pool_size').notNull().default(1),
  latencyP50Ms: doublePrecision('latency_p50_ms'),
  latencyP95Ms: doublePrecision('latency_p95_ms'),
  /** p95 of how long a call held its pool slot (lease to settlement commit): the pool's W in Little's law. */
  slotHoldP95Ms: doublePrecision('slot_hold_p95_ms'),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
  },
  // Folded in_flight is never clamped: more slots released than taken raises.
  (t) => [check('windows_in_flight_check', sql`${t.inFlight} >= 0`)],
);

/**
 * Billed and refunded credits per tenant and quota period (I4: billed + the tenant's reserved
 * credits, sched_tenants.reserved, <= quota). The lease creates the period's row (never updates
 * it); settlements add to it.
 */
export const tenantLedger = pgTable(
  'tenant_ledger',
  {
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    periodStart: timestamp('period_start', { withTimezone: true }).notNull(),
    billed: bigint('billed', { mode: 'number' }).notNull().default(0),
    refunded: bigint('refunded', { mode: 'number' }).notNull().default(0),
  },
  (t) => [
    primaryKey({ columns: [t.tenantId, t.periodStart] }),
    check('tenant_ledger_counts_check', sql`${t.billed} >= 0 and ${t.refunded} >= 0`),
  ],
);

/**
 * Credits held for one dispatched attempt, and the in-flight slots it occupies; settled exactly once (I5).
 * Whether its call was sent is not on the row: the sent mark is one `lease_sends` row per lease.
 * Its heap keeps room on every page (fillfactor 50, set by its migration: drizzle does not model it)
 * so a lease refresh's update is HOT.
 */
export const reservations = pgTable(
  'reservations',
  {
    id: uuid('id').primaryKey(),
    jobId: uuid('job_id').notNull(),
    attempt: integer('attempt').notNull(),
    tenantId: uuid('tenant_id').notNull(),
    periodStart: timestamp('period_start', { withTimezone: true }).notNull(),
    window: text('window').notNull(),
    nodeId: uuid('node_id').notNull(),
    credits: integer('credits').notNull(),
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
    settledAt: timestamp('settled_at', { withTimezone: true }),
    billed: integer('billed'),
    outcome: text('outcome'),
    /** Whether settling it releases a window pool slot (a batch's items share one slot: only one carries it). */
    windowSlot: boolean('window_slot').notNull().default(true),
    /** The attempt lease (the one liveness authority): refreshed by the attempt's node; once past, the sweeper settles it. */
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }).notNull().defaultNow(),
    /**
     * The lease call that made it (one id per sluice_lease call): its sent mark, or its expiry's claim
     * that it was never sent, is that lease's `lease_sends` row. The default makes a row inserted
     * any other way a lease of its own.
     */
    leaseId: uuid('lease_id').notNull().default(sql`gen_random_uuid()`),
    /** A late settlement corrected the expiry's settlement: at most once. */
    reconciledAt: timestamp('reconciled_at', { withTimezone: true }),
    /** The expiry's bill a late settlement replaced (usage events: the charge as first served, then the correction). */
    expiryBilled: integer('expiry_billed'),
    /**
     * Its expiry failed on its own (the sweeper isolates a bad row: split, then one by one): why, and
     * when. The sweep skips it until EXPIRY_RETRY_SECONDS have passed, an alert names it, and the
     * rest of the batch goes on.
     */
    expiryError: text('expiry_error'),
    expiryFailedAt: timestamp('expiry_failed_at', { withTimezone: true }),
  },
  (t) => [
    // Open reservations: a node's (dead-node sweep), and the sweeper's expired leases (the open rows
    // are the calls in flight, a few thousand at most: read here, not through an index on the lease,
    // so the lease refresh, which changes only lease_expires_at, is HOT).
    index('reservations_open_idx').on(t.nodeId).where(sql`${t.settledAt} is null`),
    // No index by job: nothing reads reservations by job id, and every lease's insert and every
    // settlement's (non-HOT) update would maintain one.
    // The console's calls/s per window reads the last seconds of reservations.
    index('reservations_created_idx').on(t.createdAt),
    // Usage events' corrections, in reconciliation order (rare rows: an update that does not reconcile adds nothing to it).
    index('reservations_reconciled_idx').on(t.reconciledAt, t.id).where(sql`${t.reconciledAt} is not null`),
  ],
);

/**
 * One row per lease call whose fate is decided: its node's sent mark (`sent_at` set: every
 * reservation of the lease but its `riders` was sent, and the lease lasts at least to
 * `lease_expires_at`), or the sweeper's claim that it was never sent (`sent_at` null: its expiry
 * found no mark). Both insert the same key, so a mark and an expiry cannot both win: whichever
 * inserts first decides, and the other's insert waits for it and then does nothing. One row per
 * lease instead of an update of every reservation (a lease carries up to a few hundred).
 */
export const leaseSends = pgTable(
  'lease_sends',
  {
    leaseId: uuid('lease_id').primaryKey(),
    /** The mark's time; null: claimed by an expiry, nothing of the lease was sent. */
    sentAt: timestamp('sent_at', { withTimezone: true }),
    /** The mark makes every reservation of the lease last at least this long (the call's own timeout and a margin). */
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }),
    /** A batch's duplicate inputs: fenced by the mark but not sent (they ride on another attempt's call). */
    riders: uuid('riders').array(),
    /** When it was written: retention deletes old rows whose lease has no open reservation. */
    at: timestamp('at', { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [index('lease_sends_at_idx').on(t.at)],
);

/** Live processes: a worker that stops heartbeating is dead, and its open reservations are swept. */
export const nodes = pgTable('nodes', {
  id: uuid('id').primaryKey(),
  role: text('role').notNull(),
  pid: integer('pid').notNull(),
  startedAt: timestamp('started_at', { withTimezone: true }).notNull().defaultNow(),
  heartbeatAt: timestamp('heartbeat_at', { withTimezone: true }).notNull().defaultNow(),
});

/** The account as a whole: one row. A credits-exhausted signal stops all dispatch until renewal or an admin resumes. */
export const accountState = pgTable('account_state', {
  id: integer('id').primaryKey().default(1),
  dispatchStoppedUntil: timestamp('dispatch_stopped_until', { withTimezone: true }),
  stopReason: text('stop_reason'),
  /** The newest provider status any worker saw (x-api-* headers). */
  creditsRemaining: bigint('credits_remaining', { mode: 'number' }),
  maxCredits: bigint('max_credits', { mode: 'number' }),
  renewalAt: timestamp('renewal_at', { withTimezone: true }),
  statusAt: timestamp('status_at', { withTimezone: true }),
});

/** Active and past alerts, shared by every node (the sweeper raises and clears them). */
export const alerts = pgTable(
  'alerts',
  {
    id: uuid('id').primaryKey(),
    /** e.g. AGE_PROMISE:BULK, CREDITS_EXHAUSTED, KEY_UNUSABLE:sub1, BREAKER_OPEN:dnslookup */
    key: text('key').notNull(),
    severity: text('severity').notNull(),
    message: text('message').notNull(),
    raisedAt: timestamp('raised_at', { withTimezone: true }).notNull().defaultNow(),
    clearedAt: timestamp('cleared_at', { withTimezone: true }),
  },
  (t) => [uniqueIndex('alerts_active_key').on(t.key).where(sql`${t.clearedAt} is null`)],
);

/** Circuit breakers per API, shared by every node. */
export const breakers = pgTable('breakers', {
  api: text('api').primaryKey(),
  /** CLOSED, OPEN or HALF_OPEN */
  state: text('state').notNull().default('CLOSED'),
  openedAt: timestamp('opened_at', { withTimezone: true }),
  /** While OPEN: when a half-open probe may go. */
  retryAt: timestamp('retry_at', { withTimezone: true }),
  failures: integer('failures').notNull().default(0),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
});

/* ---- Usage history (owned by src/usage/store.ts; written by a trigger on reservations) ---- */

const usageColumns = {
  tenantId: uuid('tenant_id').notNull(),
  /** The ledger period the reservation was charged to, so history sums per period equal the ledger. */
  periodStart: timestamp('period_start', { withTimezone: true }).notNull(),
  /** The settlement's hour (UTC). */
  hour: timestamp('hour', { withTimezone: true }).notNull(),
  api: text('api').notNull(),
  jobClass: text('class').notNull(),
  calls: integer('calls').notNull().default(0),
  succeeded: integer('succeeded').notNull().default(0),
  failed: integer('failed').notNull().default(0),
  creditsBilled: bigint('credits_billed', { mode: 'number' }).notNull().default(0),
  creditsRefunded: bigint('credits_refunded', { mode: 'number' }).notNull().default(0),
  /** Settled attempts per latency bucket (bounds in src/usage/histogram.ts). */
  latencyHist: integer('latency_hist').array().notNull(),
};

/** Hourly aggregates per tenant, period, API and class; no foreign key: history outlives the tenant. */
export const usageHourly = pgTable('usage_hourly', usageColumns, (t) => [
  primaryKey({ name: 'usage_hourly_pk', columns: [t.tenantId, t.hour, t.periodStart, t.api, t.jobClass] }),
]);

/**
 * Appended by each settling statement (insert only, no lock contention); folded into usage_hourly
 * by the retention pass. One row carries up to 32 of the statement's aggregates (one per tenant,
 * period, hour, API and class), column by column: element i of every array is aggregate i, and
 * `latency_hists` is n × 11 (row i: aggregate i's histogram). A settlement group touching ten
 * tenants writes one row, not ten. Read through src/usage/store.ts (`deltaItems`), which unnests
 * them into usage_hourly's shape; readers of one tenant skip the rows without it (`tenant_ids`).
 * The table's toast_tuple_target (8160, set by its migration) keeps such a row inline.
 */
export const usageDeltas = pgTable('usage_deltas', {
  id: bigserial('id', { mode: 'number' }).primaryKey(),
  tenantIds: uuid('tenant_ids').array().notNull(),
  periodStarts: timestamp('period_starts', { withTimezone: true }).array().notNull(),
  hours: timestamp('hours', { withTimezone: true }).array().notNull(),
  apis: text('apis').array().notNull(),
  classes: text('classes').array().notNull(),
  calls: integer('calls').array().notNull(),
  succeeded: integer('succeeded').array().notNull(),
  failed: integer('failed').array().notNull(),
  creditsBilled: bigint('credits_billed', { mode: 'number' }).array().notNull(),
  creditsRefunded: bigint('credits_refunded', { mode: 'number' }).array().notNull(),
  latencyHists: integer('latency_hists').array().notNull(),
});

/** Pool slots settlements gave back (negative n), appended instead of updating the window's hot row; the lease folds them. */
export const windowSlotDeltas = pgTable(
  'window_slot_deltas',
  { window: text('window').notNull(), n: integer('n').notNull() },
  (t) => [index('window_slot_deltas_idx').on(t.window)],
);

/* ---- Completion webhooks (owned by src/webhooks/store.ts; deliveries created by a trigger on jobs) ---- */

/** A tenant's webhook endpoints: where its jobs' final states are POSTed (Standard Webhooks). */
export const webhookEndpoints = pgTable(
  'webhook_endpoints',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    url: text('url').notNull(),
    /** JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED: the trigger compares 'JOB_' || jobs.state. */
    events: text('events').array().notNull(),
    /** The signing secret (`whsec_` + base64 of the key), sealed (webhooks/secret-box.ts: `v1:<keyId>:…`); a legacy plaintext row is sealed at start. */
    secret: text('secret').notNull(),
    /** The key before the last rotation, still signed with (a second signature) until previous_secret_until. */
    previousSecret: text('previous_secret'),
    previousSecretUntil: timestamp('previous_secret_until', { withTimezone: true }),
    enabled: boolean('enabled').notNull().default(true),
    /** Why and when it was disabled (null while enabled): failing for WEBHOOK_DISABLE_AFTER_SECONDS, or by the tenant. */
    disabledReason: text('disabled_reason'),
    disabledAt: timestamp('disabled_at', { withTimezone: true }),
    /** Start of the current run of failed attempts; cleared by any 2xx. */
    failingSince: timestamp('failing_since', { withTimezone: true }),
    ...timestamps,
  },
  (t) => [index('webhook_endpoints_tenant_idx').on(t.tenantId)],
);

/**
 * One row per (endpoint, job event): the durable outbox the sender drains, and the record a tenant
 * reads (webhookDeliveries). Written in the transaction that makes the job final (the trigger), so
 * no event of an endpoint's tenant is lost; its id is the `webhook-id` of every attempt.
 * No foreign key to jobs: a delivery outlives its job's retention.
 */
export const webhookDeliveries = pgTable(
  'webhook_deliveries',
  {
    id: uuid('id').primaryKey().defaultRandom(),
    tenantId: uuid('tenant_id').notNull(),
    endpointId: uuid('endpoint_id')
      .notNull()
      .references(() => webhookEndpoints.id, { onDelete: 'cascade' }),
    jobId: uuid('job_id').notNull(),
    event: text('event').notNull(),
    /** PENDING (waiting for its next attempt), SENDING (claimed until locked_until), SUCCEEDED, FAILED. */
    status: text('status').notNull().default('PENDING'),
    attempts: integer('attempts').notNull().default(0),
    nextAttemptAt: timestamp('next_attempt_at', { withTimezone: true }).notNull().defaultNow(),
    /** A SENDING row whose claim passed this instant (its node died) is due again. */
    lockedUntil: timestamp('locked_until', { withTimezone: true }),
    lastAttemptAt: timestamp('last_attempt_at', { withTimezone: true }),
    responseStatus: integer('response_status'),
    lastError: text('last_error'),
    /** The job's row (sluice_job_json) as first sent: every retry sends the same body. */
    payload: jsonb('payload'),
    ...timestamps,
  },
  (t) => [
    uniqueIndex('webhook_deliveries_event_key').on(t.endpointId, t.jobId, t.event),
    index('webhook_deliveries_tenant_idx').on(t.tenantId, t.createdAt.desc(), t.id.desc()),
    index('webhook_deliveries_due_idx').on(t.endpointId, t.nextAttemptAt).where(sql`${t.status} in ('PENDING', 'SENDING')`),
    index('webhook_deliveries_sending_idx').on(t.endpointId).where(sql`${t.status} = 'SENDING'`),
    // An endpoint's backlog (WebhookEndpoint.pendingDeliveries, oldestPendingAt) from the index alone.
    index('webhook_deliveries_backlog_idx').on(t.endpointId, t.createdAt).where(sql`${t.status} in ('PENDING', 'SENDING')`),
    // Retention deletes the ended ones oldest first.
    index('webhook_deliveries_ended_idx').on(t.updatedAt).where(sql`${t.status} in ('SUCCEEDED', 'FAILED')`),
    check('webhook_deliveries_status_check', sql`${t.status} in ('PENDING', 'SENDING', 'SUCCEEDED', 'FAILED')`),
  ],
);
