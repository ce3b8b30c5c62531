/**
 * drizzle-kit numbers a new migration by its position in the journal, but the files here skip
 * numbers (0007, 0011 and 0026 were never kept), so its number names a migration that already
 * exists, and it writes its snapshot over that one's. `generateNumbered` runs drizzle-kit, puts
 * the snapshot it overwrote back, and renumbers the new migration after the newest file, with a
 * `when` after the last (drizzle applies only migrations newer than the last one applied).
 * Used by `npm run db:generate` and `npm run db:function`.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { MIGRATIONS_DIR, readJournal } from '../db/functions.ts';

const META = path.join(MIGRATIONS_DIR, 'meta');

/** The new migration's tag (`NNNN_<name>`), or null when drizzle-kit made none (no schema change). */
export function generateNumbered(name: string, extraArgs: readonly string[] = []): string | null {
  const before = readJournal().entries;
  const highest = Math.max(...readdirSync(MIGRATIONS_DIR).map((f) => Number(/^(\d{4})_.*\.sql$/.exec(f)?.[1] ?? -1)));
  const snapshots = new Map(readdirSync(META).filter((f) => f.endsWith('_snapshot.json')).map((f) => [f, readFileSync(path.join(META, f), 'utf8')]));
  execFileSync(path.join(MIGRATIONS_DIR, '..', 'node_modules', '.bin', 'drizzle-kit'), ['generate', ...extraArgs, '--name', name], {
    cwd: path.join(MIGRATIONS_DIR, '..'),
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  const journal = readJournal();
  if (journal.entries.length === before.length) return null;
  if (journal.entries.length !== before.length + 1) throw new Error('drizzle-kit added more than one journal entry');
  const entry = journal.entries.at(-1)!;
  const made = entry.tag;
  const number = String(highest + 1).padStart(4, '0');
  const tag = `${number}_${name}`;
  renameSync(path.join(MIGRATIONS_DIR, `${made}.sql`), path.join(MIGRATIONS_DIR, `${tag}.sql`));
  const written = `${made.slice(0, 4)}_snapshot.json`;
  if (existsSync(path.join(META, written))) {
    renameSync(path.join(META, written), path.join(META, `${number}_snapshot.json`));
    const overwritten = snapshots.get(written);
    if (overwritten !== undefined) writeFileSync(path.join(META, written), overwritten);
  }
  entry.tag = tag;
  entry.when = Math.max(entry.when, (before.at(-1)?.when ?? 0) + 1000);
  writeFileSync(path.join(META, '_journal.json'), JSON.stringify(journal, null, 2) + '\n');
  return tag;
}
