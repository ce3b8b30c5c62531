/**
 * `npm run db:generate -- --name <migration_name>`: drizzle-kit's migration for a change of
 * src/db/schema.ts, numbered after the newest migration without touching the older snapshots
 * (scripts/numbered-migration.ts says why drizzle-kit alone would).
 */
import { generateNumbered } from './numbered-migration.ts';

const args = process.argv.slice(2);
const at = args.indexOf('--name');
const name = at >= 0 ? args[at + 1] : undefined;
if (!name || !/^[a-z0-9_]+$/.test(name)) {
  console.error('usage: npm run db:generate -- --name <migration_name> (lower case, digits, _)');
  process.exit(2);
}
const tag = generateNumbered(name);
console.log(tag ? `wrote drizzle/${tag}.sql and its snapshot` : 'no schema changes: nothing to migrate');
