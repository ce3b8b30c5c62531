/**
 * The statements on nodes: the processes that run against this database, and their heartbeats; and how
 * long the database has been up (the sweeper's liveness reads both).
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';

export async function heartbeatNode(sql: Tx, id: string, role: string): Promise<void> {
  await sql`
    insert into nodes (id, role, pid) values (${id}, ${role}, ${process.pid})
    on conflict (id) do update set heartbeat_at = now()`;
}

export async function removeNode(sql: Tx, id: string): Promise<void> {
  await sql`delete from nodes where id = ${id}`;
}

export async function forgetDeadNodes(sql: Tx, timeoutSeconds: number): Promise<void> {
  await sql`
    delete from nodes n where n.heartbeat_at < now() - make_interval(secs => ${timeoutSeconds * 6})
      and not exists (select 1 from reservations r where r.node_id = n.id and r.settled_at is null)`;
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
