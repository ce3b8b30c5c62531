/**
 * The statements on breakers: each API's circuit breaker as the workers last published it (for the
 * status views).
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';

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
