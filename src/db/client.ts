/**
 * One postgres.js pool per process, and the drizzle handle over it.
 */
import { drizzle, type PostgresJsDatabase } from 'drizzle-orm/postgres-js';
import postgres from 'postgres';
import * as schema from './schema.ts';
import { postgresPatched } from './guard.ts';

export type Sql = postgres.Sql;
/** A statement's runner: the pool, or a transaction on it. */
export type Tx = Sql | postgres.TransactionSql;
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

/** The Postgres parameter behind each of the timeouts. */
const TIMEOUT_PARAMETERS: Record<keyof SessionTimeouts, string> = {
  lockTimeoutMs: 'lock_timeout',
  statementTimeoutMs: 'statement_timeout',
  idleInTransactionTimeoutMs: 'idle_in_transaction_session_timeout',
};

function options(max: number, t: SessionTimeouts, countStatements: boolean, connectTimeoutSeconds: number, pooler: boolean) {
  if (pooler && !postgresPatched()) {
    throw new Error('behind a pooler postgres.js must carry scripts/patch-postgres.mjs (run `npm ci`): without it every transaction is refused');
  }
  return {
    max,
    connect_timeout: connectTimeoutSeconds,
    // Reconnect quickly after an outage (postgres.js's default backs off up to 20 s): dispatch and the
    // LISTEN connection (events, revocations) come back within about 2 s of Postgres.
    backoff: (attempts: number) => Math.min(0.1 * 2 ** attempts, 2),
    onnotice: () => {},
    transform: { undefined: null },
    // postgres.js calls `debug` once per statement sent (BEGIN and COMMIT included).
    ...(countStatements ? { debug: () => void statementsSent++ } : {}),
    // Behind a transaction-mode pooler the next transaction may run on another server connection,
    // where a statement prepared on this one does not exist: every statement goes unnamed. Nor may a
    // query be pipelined behind another: PgBouncer hands the server connection back at the first
    // one's ReadyForQuery and drops the replies to the second, which then waits forever
    // (porsager/postgres#970; seen here as a subscription that never got its first value).
    // `max_pipeline: 0` needs scripts/patch-postgres.mjs, or every `sql.begin` is refused.
    ...(pooler ? { prepare: false, max_pipeline: 0 } : {}),
    connection: {
      application_name: 'sluice',
      // A frozen or partitioned node must not hold the window row (or any row) until TCP gives up.
      // A pooler refuses (or, told to ignore them, drops) startup parameters: there the timeouts are
      // the role's defaults on the server (`timeoutStatements`), which its server connections start with.
      ...(pooler
        ? {}
        : {
            lock_timeout: t.lockTimeoutMs,
            statement_timeout: t.statementTimeoutMs,
            idle_in_transaction_session_timeout: t.idleInTransactionTimeoutMs,
          }),
    },
  };
}

export interface ConnectOptions {
  max?: number;
  timeouts?: SessionTimeouts;
  /** Diagnostics (benchmarks): count the statements sent. */
  countStatements?: boolean;
  /** A connection attempt gives up after this long: a request never hangs on a Postgres that is away. */
  connectTimeoutSeconds?: number;
  /** A transaction-mode pooler (PgBouncer) sits in front of `url`: nothing session-scoped on these connections. */
  pooler?: boolean;
}

/**
 * Where a process's connections go. Everything that fits in one transaction
 * goes to `url` (DATABASE_URL, a pooler or Postgres); what needs a session
 * (LISTEN, migrations, session advisory locks) to `directUrl`.
 */
export interface DatabaseTargets {
  url: string;
  directUrl: string;
  /** A transaction-mode pooler sits in front of `url`: no startup parameters, no prepared statements. */
  pooler: boolean;
}

/**
 * DATABASE_URL, DATABASE_DIRECT_URL and DATABASE_POOLER as one decision. Pure.
 * Unset, the pooler is assumed exactly when a separate direct URL is given:
 * nobody sets one for a Postgres they already reach directly.
 */
export function databaseTargets(url: string, directUrl: string | undefined, pooler: 'none' | 'pgbouncer' | undefined): DatabaseTargets {
  const direct = directUrl ?? url;
  return { url, directUrl: direct, pooler: pooler === undefined ? direct !== url : pooler === 'pgbouncer' };
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
  const pooler = o.pooler ?? false;
  const sql = postgres(url, options(sizes.sql, t, count, connectTimeout, pooler));
  const drizzleClient = postgres(url, options(sizes.drizzle, t, count, connectTimeout, pooler));
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
  return postgres(url, options(o.max, o.timeouts ?? DEFAULT_TIMEOUTS, o.countStatements ?? false, o.connectTimeoutSeconds ?? 30, o.pooler ?? false));
}

/**
 * The session pool, on DATABASE_DIRECT_URL when a pooler is in front of
 * DATABASE_URL: LISTEN (postgres.js keeps one connection per pool for every
 * channel, so a node holds one) and the session advisory locks (pg-boss's
 * maintenance leader, a retention pass). Two connections at most, so a
 * retention pass never waits behind the maintenance lock's; an idle one closes
 * after a few seconds, so a node keeps only its LISTEN connection open (and
 * the maintenance process its lock's).
 */
export function connectDirect(url: string, o: ConnectOptions = {}): Sql {
  return postgres(url, { ...options(2, o.timeouts ?? DEFAULT_TIMEOUTS, false, o.connectTimeoutSeconds ?? 30, false), idle_timeout: 5 });
}

/**
 * The ALTER ROLE statements that make the server's defaults for `role` in
 * `database` the configured timeouts, for those that differ from `current`
 * (milliseconds, as pg_settings shows them). Behind a pooler this is how the
 * timeouts reach the pooled connections: the operator runs them once. Pure.
 */
export function timeoutStatements(role: string, database: string, wanted: SessionTimeouts, current: SessionTimeouts): string[] {
  const ident = (name: string) => `"${name.replaceAll('"', '""')}"`;
  return (Object.keys(TIMEOUT_PARAMETERS) as (keyof SessionTimeouts)[])
    .filter((k) => wanted[k] !== current[k])
    .map((k) => `ALTER ROLE ${ident(role)} IN DATABASE ${ident(database)} SET ${TIMEOUT_PARAMETERS[k]} = ${wanted[k]}`);
}

/** The timeouts a connection of `sql` runs with, and its role and database (for `timeoutStatements`). One statement. */
export async function sessionTimeouts(sql: Sql): Promise<{ role: string; database: string; timeouts: SessionTimeouts }> {
  const rows = await sql`select name, setting::int as ms, current_user as role, current_database() as database from pg_settings where name in ${sql(Object.values(TIMEOUT_PARAMETERS))}`;
  const ms = new Map(rows.map((r) => [r.name as string, r.ms as number]));
  const timeouts = Object.fromEntries((Object.keys(TIMEOUT_PARAMETERS) as (keyof SessionTimeouts)[]).map((k) => [k, ms.get(TIMEOUT_PARAMETERS[k]) ?? 0])) as unknown as SessionTimeouts;
  return { role: rows[0]!.role as string, database: rows[0]!.database as string, timeouts };
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
