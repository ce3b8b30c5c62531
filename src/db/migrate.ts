/**
 * Applies drizzle-kit's migrations in drizzle/ under a Postgres advisory lock,
 * so two processes starting together do not both run them.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { migrate } from 'drizzle-orm/postgres-js/migrator';
import { drizzle } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';

const MIGRATIONS = fileURLToPath(new URL('../../drizzle', import.meta.url));
/** Arbitrary but fixed: "sluice" in ASCII, so it cannot collide with pg-boss's lock. */
const MIGRATION_LOCK = 0x736c756963;

/** How many migrations this build ships (readiness checks that they are all applied). */
export function shippedMigrations(): number {
  const journal = JSON.parse(readFileSync(`${MIGRATIONS}/meta/_journal.json`, 'utf8')) as { entries: unknown[] };
  return journal.entries.length;
}

export async function runMigrations(url: string): Promise<void> {
  // A dedicated single connection: an advisory lock belongs to the session that took it.
  const sql = postgres(url, { max: 1, onnotice: () => {} });
  try {
    await sql`select pg_advisory_lock(${MIGRATION_LOCK})`;
    try {
      await migrate(drizzle(sql), { migrationsFolder: MIGRATIONS });
    } finally {
      await sql`select pg_advisory_unlock(${MIGRATION_LOCK})`;
    }
  } finally {
    await sql.end();
  }
}
