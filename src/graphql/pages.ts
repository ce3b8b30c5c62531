/**
 * Forward keyset pages on (created_at, id), newest first, shared by the Relay connections
 * (jobs, webhookDeliveries). The cursor carries created_at in epoch microseconds, as text: rows
 * of one statement share created_at to the microsecond, and a JS Date would truncate it.
 */
import { SluiceError } from '../errors.ts';
import { asId } from './ids.ts';

export interface Keyed {
  id: string;
  createdAtMicros: string;
}

export type Cursor = { createdAtMicros: string; id: string };

export const MAX_PAGE = 500;

export function encodeCursor(row: Keyed): string {
  return Buffer.from(JSON.stringify([row.createdAtMicros, row.id])).toString('base64url');
}

export function decodeCursor(cursor: string, what: string): Cursor {
  try {
    const [micros, id] = JSON.parse(Buffer.from(cursor, 'base64url').toString()) as [string, string];
    // Digits only, and within Postgres's bigint (the cursor is compared as one).
    if (typeof micros !== 'string' || !/^\d{1,19}$/.test(micros) || BigInt(micros) > 9_223_372_036_854_775_807n) throw new Error('bad cursor');
    return { createdAtMicros: micros, id: asId(id, what) };
  } catch {
    throw new SluiceError('BAD_USER_INPUT', 'invalid cursor', { field: 'after' });
  }
}

/** The page size and start a connection's arguments ask for, refused with a code when out of bounds. */
export function pageArgs(args: { first?: number | null; after?: string | null; before?: string | null; last?: number | null }, what: string): { first: number; after: Cursor | null } {
  if (args.before || args.last) throw new SluiceError('BAD_USER_INPUT', 'only forward pagination (first, after) is supported');
  const first = args.first ?? 50;
  if (first < 0 || first > MAX_PAGE) throw new SluiceError('BAD_USER_INPUT', `first must be 0 to ${MAX_PAGE}`, { field: 'first' });
  return { first, after: args.after ? decodeCursor(args.after, what) : null };
}

/** A connection from `first + 1` rows read after the cursor (the extra row says there is a next page). */
export function pageOf<T extends Keyed>(rows: readonly T[], first: number, after: Cursor | null) {
  const page = rows.slice(0, first);
  return {
    edges: page.map((node) => ({ cursor: encodeCursor(node), node })),
    pageInfo: {
      hasNextPage: rows.length > first,
      hasPreviousPage: after !== null,
      startCursor: page[0] ? encodeCursor(page[0]) : null,
      endCursor: page.at(-1) ? encodeCursor(page.at(-1)!) : null,
    },
  };
}
