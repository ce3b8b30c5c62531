/**
 * One postgres.js pool per process, and the drizzle handle over it.
 */
import { drizzle, type PostgresJsDatabase } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import * as schema from './schema.ts';

export type Sql = postgres.Sql;
export type Db = PostgresJsDatabase<typeof schema>;

export interface Connection {
  sql: Sql;
  db: Db;
  end(): Promise<void>;
}

/** Session timeouts in milliseconds (0 = off). */
export interface SessionTimeouts {
  lockTimeoutMs: number;
  statementTimeoutMs: number;
  idleInTransactionTimeoutMs: number;
}

/**
 * The documented defaults (README, configuration): a lock wait, a statement, an idle transaction.
 * A lock wait outlives the idle-transaction limit, so whoever waits behind a frozen node gets the
 * row once that node's session is ended, instead of failing first.
 */
export const DEFAULT_TIMEOUTS: SessionTimeouts = { lockTimeoutMs: 30_000, statementTimeoutMs: 120_000, idleInTransactionTimeoutMs: 15_000 };

let statementsSent = 0;
/** SQL statements sent by pools made with `countStatements` (a benchmark's round trips). */
export function statementCount(): number {
  return statementsSent;
}

const options = (max: number, t: SessionTimeouts, countStatements: boolean, connectTimeoutSeconds: number) => ({
  max,
  connect_timeout: connectTimeoutSeconds,
  // Reconnect quickly after an outage (postgres.js's default backs off up to 20 s): dispatch and the
  // LISTEN connection (events, revocations) come back within about 2 s of Postgres.
  backoff: (attempts: number) => Math.min(0.1 * 2 ** attempts, 2),
  onnotice: () => {},
  transform: { undefined: null },
  // postgres.js calls `debug` once per statement sent (BEGIN and COMMIT included).
  ...(countStatements ? { debug: () => void statementsSent++ } : {}),
  connection: {
    application_name: 'sluice',
    // A frozen or partitioned node must not hold the window row (or any row) until TCP gives up.
    lock_timeout: t.lockTimeoutMs,
    statement_timeout: t.statementTimeoutMs,
    idle_in_transaction_session_timeout: t.idleInTransactionTimeoutMs,
  },
});

export interface ConnectOptions {
  max?: number;
  timeouts?: SessionTimeouts;
  /** Diagnostics (benchmarks): count the statements sent. */
  countStatements?: boolean;
  /** A connection attempt gives up after this long: a request never hangs on a Postgres that is away. */
  connectTimeoutSeconds?: number;
}

/**
 * How one process splits its DB_POOL_MAX: the raw pool (hot paths) gets it
 * all, drizzle's CRUD pool a quarter, pg-boss's pool half; one more for the
 * bus's LISTEN. docs/SCALING.md budgets connections from this.
 */
export function poolSizes(max: number): { sql: number; drizzle: number; boss: number } {
  return { sql: max, drizzle: Math.max(2, Math.ceil(max / 4)), boss: Math.max(2, Math.ceil(max / 2)) };
}

/**
 * Two pools: drizzle's postgres-js driver rewrites its client's type
 * serializers (dates and arrays become pass-through strings), which breaks
 * plain tagged-template SQL on the same client. Raw SQL (the hot paths) gets
 * its own untouched pool; drizzle gets a small one for its CRUD.
 */
export function connect(url: string, o: ConnectOptions = {}): Connection {
  const sizes = poolSizes(o.max ?? 20);
  const t = o.timeouts ?? DEFAULT_TIMEOUTS;
  const count = o.countStatements ?? false;
  const connectTimeout = o.connectTimeoutSeconds ?? 30;
  const sql = postgres(url, options(sizes.sql, t, count, connectTimeout));
  const drizzleClient = postgres(url, options(sizes.drizzle, t, count, connectTimeout));
  return {
    sql,
    db: drizzle(drizzleClient, { schema }),
    end: async () => {
      await Promise.all([sql.end({ timeout: 5 }), drizzleClient.end({ timeout: 5 })]);
    },
  };
}

/**
 * A small pool of its own, with the same settings as `connect`'s: for work
 * that must never queue behind the hot path's statements (the attempt-lease
 * refresh, one connection per dispatching process).
 */
export function connectDedicated(url: string, o: ConnectOptions & { max: number }): Sql {
  return postgres(url, options(o.max, o.timeouts ?? DEFAULT_TIMEOUTS, o.countStatements ?? false, o.connectTimeoutSeconds ?? 30));
}

/** Creates a database if it does not exist (used by tests and the embedded default). */
export async function ensureDatabase(adminUrl: string, name: string): Promise<void> {
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} });
  try {
    const [row] = await admin`select 1 as ok from pg_database where datname = ${name}`;
    if (!row) await admin.unsafe(`create database "${name.replaceAll('"', '""')}"`);
  } catch (err) {
    // Two processes creating it at once: the loser sees a duplicate, which is fine.
    if (!(err instanceof Error && /already exists|duplicate key/.test(err.message))) throw err;
  } finally {
    await admin.end();
  }
}
