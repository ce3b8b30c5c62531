/**
 * Tenant lifecycle: suspend, resume, delete. Each sends the `sluice_auth`
 * notice in its transaction: the cached TenantRecords (tenants/key-cache.ts)
 * carry the suspension, and delete revokes the keys.
 *
 * - Suspend: submissions are refused (TENANT_SUSPENDED, HTTP 403) and dispatch
 *   skips the tenant (sched_tenants.suspended, read by the candidate query and
 *   the slot claim). Queued jobs stay queued, shown with wait reason
 *   SUSPENDED; calls already in flight finish and settle normally.
 * - Resume: clears both flags and marks the queues ready (joining at the class
 *   clock: no credit for the time suspended).
 * - Delete: first, in one transaction, suspend, revoke every key, cancel the
 *   waiting jobs (they hold no reservation, so nothing is billed or refunded)
 *   and `pg_notify('sluice_auth', {"tenantId"})` so every process closes the
 *   tenant's open subscriptions (4401). Then wait for calls in flight to
 *   settle (they really went upstream: they are billed like any other), drop
 *   the tenant's pg-boss queues and delete its rows. Usage history has no
 *   foreign key to tenants and is kept for the operator.
 */
import type { PgBoss } from 'pg-boss';
import type { Sql, Tx } from '../db/client.ts';
import { SluiceError } from '../errors.ts';
import { publishJobEvents } from '../events/bus.ts';
import { queueName } from '../queue/boss.ts';
import { CLASSES, type JobClass } from '../config/classes.ts';
import { cancelTenantWaitingJobs } from '../jobs/store.ts';
import { deleteTenantReservations } from '../scheduler/sql/reservations.ts';
import { markQueuesReady } from '../scheduler/sql/queues.ts';
import { setTenantSuspended } from '../scheduler/sql/tenants.ts';
import { clearTenantSuspended, deleteTenantRow, markTenantSuspended, revokeTenantKeys } from './store.ts';
import { notifyAuthChanged } from './auth-notice.ts';
import { WORK_CHANNEL } from '../jobs/service.ts';

export interface LifecycleDeps {
  sql: Sql;
  boss: PgBoss;
  /** How long deleteTenant waits for calls in flight to settle before answering TENANT_BUSY. */
  deleteWaitMs?: number;
  /** Called after each commit that changed the tenant's record or keys (this process's key cache forgets it at once). */
  authChanged?: (tenantId: string) => void;
}

async function exists(sql: Sql, id: string): Promise<void> {
  const [row] = await sql`select 1 from tenants where id = ${id}`;
  if (!row) throw new SluiceError('NOT_FOUND', `no tenant with id ${id}`);
}

export async function suspendTenant(deps: LifecycleDeps, id: string): Promise<void> {
  await exists(deps.sql, id);
  await deps.sql.begin(async (tx) => {
    await markTenantSuspended(tx, id);
    await setTenantSuspended(tx, id, true);
    // The cached TenantRecord carries suspendedAt: every node's key cache forgets it (tenants/key-cache.ts).
    await notifyAuthChanged(tx, id);
  });
  deps.authChanged?.(id);
}

export async function resumeTenant(deps: LifecycleDeps, id: string): Promise<void> {
  await exists(deps.sql, id);
  await deps.sql.begin(async (tx) => {
    await clearTenantSuspended(tx, id);
    await setTenantSuspended(tx, id, false);
    const queued = await tx`select distinct priority from jobs where tenant_id = ${id} and state = 'QUEUED'`;
    await markQueuesReady(tx, id, queued.map((r) => r.priority as JobClass));
    await tx`select pg_notify(${WORK_CHANNEL}, ${id})`;
    await notifyAuthChanged(tx, id);
  });
  deps.authChanged?.(id);
}

/** Cancels the tenant's waiting jobs (no reservation is held for them: nothing to bill or refund). */
async function cancelWaiting(tx: Tx, id: string): Promise<number> {
  const cancelled = await cancelTenantWaitingJobs(tx, id);
  await publishJobEvents(tx, cancelled.map((jobId) => ({ jobId, tenantId: id, state: 'CANCELLED' })));
  return cancelled.length;
}

export async function deleteTenant(deps: LifecycleDeps, id: string): Promise<{ cancelledJobs: number }> {
  const { sql, boss } = deps;
  await exists(sql, id);
  let cancelledJobs = await sql.begin(async (tx) => {
    await markTenantSuspended(tx, id);
    await setTenantSuspended(tx, id, true);
    await revokeTenantKeys(tx, id);
    const n = await cancelWaiting(tx, id);
    await notifyAuthChanged(tx, id);
    return n;
  });
  deps.authChanged?.(id);
  // Calls in flight went upstream: let them settle (billed as usual) before their rows go.
  const deadline = Date.now() + (deps.deleteWaitMs ?? 60_000);
  for (;;) {
    const [r] = await sql`
      select coalesce((select in_flight from sched_tenants where tenant_id = ${id}), 0) as in_flight,
        exists (select 1 from jobs where tenant_id = ${id} and state = 'RUNNING') as running`;
    if (Number(r!.in_flight) === 0 && !r!.running) break;
    if (Date.now() > deadline) {
      throw new SluiceError('TENANT_BUSY', `tenant ${id} still has calls in flight; it is suspended and its keys are revoked: try deleteTenant again shortly`);
    }
    await new Promise((res) => setTimeout(res, 200));
  }
  // pg-boss drops each queue and its jobs (in batches, its own transactions).
  for (const c of CLASSES) await boss.deleteQueue(queueName(id, c));
  await sql.begin(async (tx) => {
    // A retry requeued while we waited: cancelled too, never sent.
    cancelledJobs += await cancelWaiting(tx, id);
    await deleteTenantReservations(tx, id);
    // jobs, keys, sched_* rows and the ledger go with the tenant (on delete cascade).
    await deleteTenantRow(tx, id);
  });
  return { cancelledJobs };
}
