/**
 * Owns the alerts table: active alerts are rows with cleared_at null, one
 * per key (a partial unique index), so every node sees the same set.
 */
import { randomUUID } from 'node:crypto';
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import type { DesiredAlert } from './rules.ts';

type Tx = Sql | postgres.TransactionSql;

export interface AlertRow extends DesiredAlert {
  id: string;
  raisedAt: Date;
  clearedAt: Date | null;
}

function toRow(r: postgres.Row): AlertRow {
  return { id: r.id, key: r.key, severity: r.severity, message: r.message, raisedAt: r.raised_at, clearedAt: r.cleared_at };
}

export async function activeAlerts(sql: Tx): Promise<AlertRow[]> {
  const rows = await sql`select * from alerts where cleared_at is null order by raised_at, key`;
  return rows.map(toRow);
}

/** Makes the active set equal `desired`: returns what was raised and what was cleared. */
export async function syncAlerts(tx: Tx, desired: readonly DesiredAlert[]): Promise<{ raised: AlertRow[]; cleared: AlertRow[] }> {
  const keys = desired.map((d) => d.key);
  const cleared = await tx`
    update alerts set cleared_at = now() where cleared_at is null and not (key = any(${keys}::text[])) returning *`;
  const raised: AlertRow[] = [];
  for (const d of desired) {
    const rows = await tx`
      insert into alerts (id, key, severity, message) values (${randomUUID()}, ${d.key}, ${d.severity}, ${d.message})
      on conflict (key) where cleared_at is null do update set message = excluded.message
      returning *, (xmax = 0) as inserted`;
    if (rows[0]?.inserted) raised.push(toRow(rows[0]));
  }
  return { raised, cleared: cleared.map(toRow) };
}

/** Retention: one batch of alerts cleared more than `seconds` ago (rows another pass holds are skipped). Returns how many went. */
export async function deleteClearedAlerts(sql: Tx, seconds: number, n: number): Promise<number> {
  const deleted = await sql`
    with doomed as (
      select id from alerts
      where cleared_at is not null and cleared_at < now() - make_interval(secs => ${seconds})
      order by cleared_at limit ${n} for update skip locked)
    delete from alerts a using doomed where a.id = doomed.id`;
  return deleted.count;
}
