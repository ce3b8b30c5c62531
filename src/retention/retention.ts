/**
 * Retention: keeps Sluice's own tables in bounds. Every pass deletes, in
 * small batches (each its own short transaction, `for update skip locked`,
 * so nothing waits on it and it waits on nothing for long):
 *  - finished jobs (SUCCEEDED, FAILED, CANCELLED) whose finished_at is older
 *    than JOB_RETENTION_SECONDS, and their results (cascade);
 *  - settled reservations older than that (usage history already holds them);
 *  - alerts cleared longer ago than that;
 *  - webhook deliveries that ended (SUCCEEDED, FAILED) longer ago than that;
 *  - fairness keys' last ranks that no longer count (their newest job started or is gone).
 * It also folds usage deltas into hourly history. pg-boss deletes its own
 * finished jobs after the same retention (the queues' deleteAfterSeconds,
 * src/queue/boss.ts). Usage history is never deleted here: it is what
 * billing reads after the jobs are gone.
 *
 * Called from the sweeper's round; one process at a time (advisory lock),
 * at most once per RETENTION_INTERVAL_SECONDS.
 */
import type { Logger } from 'pino';
import type { Sql } from '../db/client.ts';
import { deleteClearedAlerts } from '../alerts/store.ts';
import { deleteFinishedJobs, deleteStaleFairKeys } from '../jobs/store.ts';
import { deleteSettledReservations } from '../scheduler/sql/reservations.ts';
import { foldDeltas } from '../usage/store.ts';
import { deleteEndedDeliveries } from '../webhooks/store.ts';

/** Arbitrary, fixed: only one process runs retention at a time. */
const RETENTION_LOCK = 0x736c7265;

export interface RetentionOptions {
  sql: Sql;
  /** Where the pass's session lock is taken: Postgres itself (DATABASE_DIRECT_URL). Unset: `sql`. */
  lockSql?: Sql;
  /** Finished jobs, settled reservations and cleared alerts older than this are deleted. */
  retentionSeconds: number;
  /** Rows per delete statement: small, so locks are short. */
  batchSize: number;
  /** Batches per table per pass: bounds one pass's work; the next pass continues. */
  maxBatches: number;
  /** Least time between passes. */
  intervalSeconds: number;
  log?: Logger;
}

export interface RetentionPass {
  jobs: number;
  reservations: number;
  alerts: number;
  webhookDeliveries: number;
  fairKeys: number;
  foldedDeltas: number;
}

/** Deletes one batch of each kind, by each table's owning module. */
const DELETE_BATCH = {
  jobs: deleteFinishedJobs,
  reservations: deleteSettledReservations,
  alerts: deleteClearedAlerts,
  webhookDeliveries: deleteEndedDeliveries,
  fairKeys: deleteStaleFairKeys,
} as const;

export class Retention {
  private readonly o: RetentionOptions;
  private lastRunAt = 0;

  constructor(o: RetentionOptions) {
    this.o = o;
  }

  /** Runs a pass when the interval has passed since the last one (the sweeper calls this every round). */
  async maybeRun(now = Date.now()): Promise<RetentionPass | null> {
    if (now - this.lastRunAt < this.o.intervalSeconds * 1000) return null;
    this.lastRunAt = now;
    return this.runOnce();
  }

  /** One pass, whatever the interval; null when another process holds the lock. */
  async runOnce(): Promise<RetentionPass | null> {
    const { sql } = this.o;
    // A session-level lock on one reserved connection, so the batches can be separate short
    // transactions; the session is Postgres's own (lockSql), never a pooler's borrowed one.
    const reserved = await (this.o.lockSql ?? sql).reserve();
    try {
      const [lock] = await reserved`select pg_try_advisory_lock(${RETENTION_LOCK}) as ok`;
      if (!lock!.ok) return null;
      try {
        const pass: RetentionPass = { jobs: 0, reservations: 0, alerts: 0, webhookDeliveries: 0, fairKeys: 0, foldedDeltas: 0 };
        // fairKeys after jobs: a key whose newest job was just deleted goes in the same pass.
        for (const kind of ['jobs', 'reservations', 'alerts', 'webhookDeliveries', 'fairKeys'] as const) {
          for (let i = 0; i < this.o.maxBatches; i++) {
            const deleted = await DELETE_BATCH[kind](sql, this.o.retentionSeconds, this.o.batchSize);
            pass[kind] += deleted;
            if (deleted < this.o.batchSize) break;
          }
        }
        for (let i = 0; i < this.o.maxBatches; i++) {
          const folded = await foldDeltas(sql, this.o.batchSize);
          pass.foldedDeltas += folded;
          if (folded < this.o.batchSize) break;
        }
        if (pass.jobs + pass.reservations + pass.alerts + pass.webhookDeliveries + pass.fairKeys > 0) this.o.log?.info(pass, 'retention deleted old rows');
        return pass;
      } finally {
        await reserved`select pg_advisory_unlock(${RETENTION_LOCK})`;
      }
    } finally {
      reserved.release();
    }
  }
}
