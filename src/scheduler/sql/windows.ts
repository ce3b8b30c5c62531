/**
 * The statements on windows: each upstream key's pacer bucket, pool size, latency and pause.
 * sluice_lease takes its tokens and slots.
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';
import type { BucketState } from '../pacer.ts';
import type { WindowSpec } from '../windows.ts';

/** A rate-limit 429: the window sends nothing on any node until the pause ends, and its bucket is emptied. */
export async function pauseWindow(sql: Tx, window: string, seconds: number, reason: string): Promise<void> {
  await sql`
    update windows set tokens = 0, refilled_at = greatest(clock_timestamp(), now() + make_interval(secs => ${seconds})),
      paused_until = greatest(coalesce(paused_until, now()), now() + make_interval(secs => ${seconds})),
      pause_reason = ${reason}, updated_at = now()
    where name = ${window}`;
}

/** An unusable key (401/403): its window stops until an admin resumes it; other windows carry on. */
export async function stopWindow(sql: Tx, window: string, reason: string): Promise<void> {
  // Far in the future rather than 'infinity', which JavaScript Dates cannot hold.
  await sql`update windows set tokens = 0, paused_until = '9999-12-31T00:00:00Z', pause_reason = ${reason}, updated_at = now() where name = ${window}`;
}

/** resumeDispatch's first step (sql/account.ts): lifts the stop of key-unusable windows (all, or one), locked by name. */
export async function resumeKeyStoppedWindows(sql: Tx, window: string | null): Promise<void> {
  await sql`
    update windows w set paused_until = null, pause_reason = null, updated_at = now()
    from (select name from windows where pause_reason = 'KEY_UNUSABLE' and (${window}::text is null or name = ${window})
          order by name for update) l
    where w.name = l.name`;
}

export async function upsertWindows(sql: Tx, specs: readonly WindowSpec[]): Promise<void> {
  for (const w of specs) {
    await sql`
      insert into windows (name, rate_per_minute, burst, tokens)
      values (${w.name}, ${w.pacedPerMinute}, ${w.burst}, ${w.burst})
      on conflict (name) do update set rate_per_minute = excluded.rate_per_minute, burst = excluded.burst,
        tokens = least(windows.tokens, excluded.burst), updated_at = now()`;
  }
}

export interface WindowRow extends BucketState {
  name: string;
  inFlight: number;
  poolSize: number;
  pauseReason: string | null;
  latencyP50Ms: number | null;
  latencyP95Ms: number | null;
  /** The database's clock when read, so waits are computed on one clock. */
  dbNow: number;
  /** All dispatch is stopped until then (credits exhausted), or null. */
  accountStoppedUntil: number | null;
}

export async function readWindows(sql: Tx, names?: readonly string[]): Promise<WindowRow[]> {
  const rows = await sql`
    select w.*, clock_timestamp() as db_now, a.dispatch_stopped_until,
      -- slots settlements gave back that the next lease has not folded yet (window_slot_deltas)
      (w.in_flight + coalesce((select sum(d.n) from window_slot_deltas d where d."window" = w.name), 0))::int as in_flight_now
    from windows w
    left join account_state a on a.id = 1
    where ${names ? sql`w.name = any(${names as string[]}::text[])` : sql`true`} order by w.name`;
  return rows.map((r) => ({
    name: r.name as string,
    ratePerMinute: r.rate_per_minute as number | null,
    burst: r.burst as number,
    tokens: r.tokens as number,
    refilledAt: (r.refilled_at as Date).getTime(),
    pausedUntil: r.paused_until ? (r.paused_until as Date).getTime() : null,
    pauseReason: r.pause_reason as string | null,
    inFlight: r.in_flight_now as number,
    poolSize: r.pool_size as number,
    latencyP50Ms: r.latency_p50_ms as number | null,
    latencyP95Ms: r.latency_p95_ms as number | null,
    dbNow: (r.db_now as Date).getTime(),
    accountStoppedUntil: r.dispatch_stopped_until ? (r.dispatch_stopped_until as Date).getTime() : null,
  }));
}

export async function reportWindowLatency(sql: Tx, window: string, poolSize: number, p50: number, p95: number): Promise<void> {
  await sql`update windows set pool_size = ${poolSize}, latency_p50_ms = ${p50}, latency_p95_ms = ${p95}, updated_at = now() where name = ${window}`;
}
