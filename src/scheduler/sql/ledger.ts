/**
 * The statements on tenant_ledger: each tenant's credits per quota period, billed and refunded.
 * The lease creates a period's row, sluice_release_settled adds to it on the hot path; a late
 * settlement corrects it here. The credits reserved by open calls are on the tenant's row
 * (sched_tenants.reserved), whatever their period.
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';

/** Moves a tenant's billed credits for a period by `delta` (a late settlement's correction); refunds move the other way. */
export async function correctLedger(tx: Tx, tenantId: string, periodStart: Date, delta: number): Promise<void> {
  await tx`
    update tenant_ledger set billed = billed + ${delta}, refunded = refunded - ${delta}
    where tenant_id = ${tenantId} and period_start = ${periodStart}`;
}

/** A tenant's credits in a period: billed and refunded there, and reserved now (open calls of any period: I4 counts them against this one). */
export async function ledgerFor(sql: Tx, tenantId: string, periodStart: Date): Promise<{ billed: number; reserved: number; refunded: number }> {
  const [row] = await sql`
    select l.billed, t.reserved, l.refunded from sched_tenants t
    left join tenant_ledger l on l.tenant_id = t.tenant_id and l.period_start = ${periodStart}
    where t.tenant_id = ${tenantId}`;
  return { billed: Number(row?.billed ?? 0), reserved: Number(row?.reserved ?? 0), refunded: Number(row?.refunded ?? 0) };
}
