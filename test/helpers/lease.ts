/**
 * Driving sluice_lease directly on a test database, without a dispatcher: an unlimited window of
 * its own, waiting STANDARD jobs written with the submit path's own statements, and one lease call
 * that may take all of them.
 */
import { randomUUID } from 'node:crypto';
import type postgres from 'postgres';
import { newJobIds } from '../../src/jobs/ids.ts';
import { insertJobsQueued, type NewJobRow } from '../../src/jobs/store.ts';
import { markManyQueuesReady } from '../../src/scheduler/sql/queues.ts';
import { leaseJobs, type LeaseRow } from '../../src/scheduler/sql/reservations.ts';

/** A window with no rate limit, for leases of its own. */
export async function unlimitedWindow(sql: postgres.Sql, name: string): Promise<void> {
  await sql`insert into windows (name, rate_per_minute, burst, tokens) values (${name}, null, 0, 0) on conflict do nothing`;
}

/**
 * `perTenant` waiting STANDARD dnslookup jobs for each tenant, in one transaction (insertJobsQueued,
 * markManyQueuesReady). Returns the pg-boss jobs stored.
 */
export async function queueJobs(sql: postgres.Sql, tenantIds: readonly string[], perTenant: number, tag: string): Promise<number> {
  const ids = newJobIds(tenantIds.length * perTenant);
  const jobs: NewJobRow[] = tenantIds.flatMap((tenantId, k) =>
    Array.from({ length: perTenant }, (_, i) => ({ id: ids[k * perTenant + i]!, tenantId, state: 'QUEUED' as const, api: 'dnslookup', params: { domain: `${tag}${k}-${i}.example` }, priority: 'STANDARD' as const, idempotencyKey: null })),
  );
  return sql.begin(async (tx) => {
    const stored = await insertJobsQueued(tx, jobs);
    await markManyQueuesReady(tx, tenantIds.map((tenantId) => ({ tenantId, jobClass: 'STANDARD' as const })));
    return stored.queued;
  });
}

/** One lease on `window`: pool 50, up to 256 jobs, every class, no batching, dnslookup at 1 credit. */
export async function leaseOnce(sql: postgres.Sql, window: string): Promise<LeaseRow[]> {
  const { rows } = await leaseJobs(sql, {
    window, nodeId: randomUUID(), pool: 50, max: 256, leaseMax: 8, classes: ['INTERACTIVE', 'STANDARD', 'BULK'], leaseSeconds: 30,
    costs: { dnslookup: 1 }, hold: [], batch: {}, batchMax: 1, batchQuantum: 1,
  });
  return rows;
}
