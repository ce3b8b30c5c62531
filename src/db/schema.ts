/**
 * Sluice's own tables (pg-boss owns the `pgboss` schema). Each table has one
 * owning module that writes it: tenants and tenant_api_keys → src/tenants,
 * jobs and job_results → src/jobs/store.ts, settings → src/db/settings.ts.
 * Migrations in drizzle/ are generated from this file with `npm run db:generate`.
 */
import { sql } from 'drizzle-orm';
import { check, index, integer, jsonb, pgTable, text, timestamp, uniqueIndex, uuid } from 'drizzle-orm/pg-core';

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
    /** What happens when the next job would pass the quota: WAIT (visible) or FAIL (QUOTA_EXCEEDED). */
    quotaPolicy: text('quota_policy').notNull().default('WAIT'),
    /** The quota period starts on this instant's monthly anniversary. */
    periodAnchor: timestamp('period_anchor', { withTimezone: true }).notNull().defaultNow(),
    ...timestamps,
  },
  (t) => [
    uniqueIndex('tenants_name_key').on(t.name),
    check('tenants_tier_check', sql`${t.tier} in ('FREE', 'PRO', 'ENTERPRISE')`),
    check('tenants_quota_policy_check', sql`${t.quotaPolicy} in ('WAIT', 'FAIL')`),
  ],
);

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
    createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
    revokedAt: timestamp('revoked_at', { withTimezone: true }),
  },
  (t) => [uniqueIndex('tenant_api_keys_hash_key').on(t.keyHash), index('tenant_api_keys_tenant_idx').on(t.tenantId)],
);

export const jobs = pgTable(
  'jobs',
  {
    /** Same id as the pg-boss job, so the two records join without a mapping table. */
    id: uuid('id').primaryKey(),
    tenantId: uuid('tenant_id')
      .notNull()
      .references(() => tenants.id, { onDelete: 'cascade' }),
    api: text('api').notNull(),
    params: jsonb('params').notNull(),
    priority: text('priority').notNull(),
    state: text('state').notNull(),
    idempotencyKey: text('idempotency_key'),
    /** Upstream attempts made so far. */
    attempts: integer('attempts').notNull().default(0),
    startedAt: timestamp('started_at', { withTimezone: true }),
    finishedAt: timestamp('finished_at', { withTimezone: true }),
    ...timestamps,
  },
  (t) => [
    uniqueIndex('jobs_tenant_idempotency_key').on(t.tenantId, t.idempotencyKey),
    index('jobs_tenant_created_idx').on(t.tenantId, t.createdAt.desc(), t.id.desc()),
    index('jobs_queued_idx').on(t.tenantId, t.priority).where(sql`${t.state} = 'QUEUED'`),
    check('jobs_priority_check', sql`${t.priority} in ('INTERACTIVE', 'STANDARD', 'BULK')`),
    check('jobs_state_check', sql`${t.state} in ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')`),
  ],
);

/** One row per job, written with an upsert keyed by job id (invariant I6). */
export const jobResults = pgTable('job_results', {
  jobId: uuid('job_id')
    .primaryKey()
    .references(() => jobs.id, { onDelete: 'cascade' }),
  data: jsonb('data'),
  errorCode: text('error_code'),
  errorMessage: text('error_message'),
  httpStatus: integer('http_status'),
  creditsBilled: integer('credits_billed').notNull().default(0),
  attempts: integer('attempts').notNull().default(0),
  ...timestamps,
});

/** Small process-wide values that must survive restarts (e.g. the admin token's hash). */
export const settings = pgTable('settings', {
  key: text('key').primaryKey(),
  value: text('value').notNull(),
  updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
});
