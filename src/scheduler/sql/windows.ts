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
import { burstFor } from '../learned-pace.ts';

/**
 * How a rate-limit 429 changes the learned pace: the rate × `decrease`, not below `floor` of the
 * configured rate (learned-pace.ts rateAfterRateLimit; `decrease` 1 = the pace is not learned).
 */
export interface RateLimitPace {
  decrease: number;
  floor: number;
}

/**
 * A rate-limit 429: the window sends nothing on any node until the pause ends, and its bucket is
 * emptied. The first 429 of a pause (the window not paused yet) also lowers the learned rate
 * (multiplicative decrease, the same formula as learned-pace.ts rateAfterRateLimit) and scales
 * the burst with it; the calls already in flight when the provider tripped answer 429 too, and
 * land in the same pause, so one trip lowers the rate once.
 *
 * `probe`: the provider asked for more than RETRY_AFTER_MAX_SECONDS and the pause was capped, so
 * the window reopens with a probe (learned-pace.ts): the floor rate and a bucket of one, whatever
 * the pause it lands in.
 */
export async function pauseWindow(sql: Tx, window: string, seconds: number, reason: string, pace: RateLimitPace = { decrease: 1, floor: 0 }, probe = false): Promise<void> {
  const learn = pace.decrease < 1;
  await sql`
    update windows w set tokens = 0, refilled_at = greatest(clock_timestamp(), now() + make_interval(secs => ${seconds})),
      paused_until = greatest(coalesce(w.paused_until, now()), now() + make_interval(secs => ${seconds})),
      pause_reason = ${reason}, updated_at = now(),
      rate_per_minute = coalesce(d.rate, w.rate_per_minute),
      burst = case when d.probe then 1 when d.rate is null then w.burst else greatest(1, w.configured_burst * d.rate / w.configured_rate_per_minute) end,
      pace_reason = case when d.probe then 'PROBE' when d.rate is null then w.pace_reason else 'RATE_LIMITED' end,
      paced_at = case when d.rate is null then w.paced_at else now() end
    from (select case when ${probe && learn}::boolean and x.rate_per_minute is not null and x.configured_rate_per_minute > 0 and x.configured_burst is not null
                   then x.configured_rate_per_minute * ${pace.floor}::float8
                 when ${learn}::boolean and x.rate_per_minute is not null and x.configured_rate_per_minute > 0
                        and x.configured_burst is not null and (x.paused_until is null or x.paused_until <= now())
                   then least(x.rate_per_minute, greatest(x.configured_rate_per_minute * ${pace.floor}::float8, x.rate_per_minute * ${pace.decrease}::float8))
                 end as rate,
                 ${probe && learn}::boolean and x.rate_per_minute is not null and x.configured_rate_per_minute > 0 and x.configured_burst is not null as probe
          from windows x where x.name = ${window}) d
    where w.name = ${window}`;
}

/** The provider asked this window for a pause beyond RETRY_AFTER_MAX_SECONDS (it was capped): kept for the alert naming it. */
export async function recordCappedAsk(sql: Tx, window: string, askedSeconds: number): Promise<void> {
  await sql`update windows set capped_ask_seconds = ${askedSeconds}, capped_ask_at = now() where name = ${window}`;
}

/** Windows whose provider asked for a capped pause within the last `seconds` (the alert's facts). */
export async function recentCappedAsks(sql: Tx, seconds: number): Promise<Array<{ window: string; askedSeconds: number }>> {
  const rows = await sql`
    select name, capped_ask_seconds from windows
    where capped_ask_at > now() - make_interval(secs => ${seconds}) order by name`;
  return rows.map((r) => ({ window: r.name as string, askedSeconds: r.capped_ask_seconds as number }));
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

/** How a node start treats the learned pace (absent: the pace is not learned, every window runs at its configured rate). */
export interface StartPace {
  /** A slow start's first rate (learned-pace.ts slowStartRate), as a share of the configured rate. */
  start: number;
  /** A window with no lease for this long starts slowly again (SLOW_START_IDLE_MS). */
  idleMs: number;
}

/**
 * The windows from configuration, at start. The configured rate and burst are written as they are.
 * Without a learned pace the rate leases refill by is the configured one. With one, a window in
 * use under an unchanged configuration keeps what it learned (another node starting, a rolling
 * restart: the provider's window is what it was); a new window, a changed configuration, or one
 * without a lease for `idleMs` starts slowly (learned-pace.ts: PACE_START of the configured rate,
 * its burst scaled, pace reason START), so a key whose real window is smaller than configured is
 * learned before a configured burst trips the provider's cooldown.
 */
export async function upsertWindows(sql: Tx, specs: readonly WindowSpec[], learning: StartPace | null = null): Promise<void> {
  for (const w of specs) {
    const startRate = learning && w.pacedPerMinute !== null && learning.start < 1 ? w.pacedPerMinute * learning.start : null;
    const start = startRate === null ? null : { rate: startRate, burst: burstFor(w.burst, w.pacedPerMinute!, startRate) };
    const rate = start ? start.rate : w.pacedPerMinute;
    const burst = start ? start.burst : w.burst;
    // Kept: what the window learned, under the same configuration, while it is in use.
    const kept = sql`(${learning !== null}::boolean and windows.rate_per_minute is not null and excluded.configured_rate_per_minute is not null
      and windows.configured_rate_per_minute is not distinct from excluded.configured_rate_per_minute
      and windows.configured_burst is not distinct from excluded.configured_burst
      and windows.refilled_at > now() - make_interval(secs => ${(learning?.idleMs ?? 0) / 1000}))`;
    await sql`
      insert into windows (name, rate_per_minute, burst, tokens, configured_rate_per_minute, configured_burst, pace_reason, paced_at)
      values (${w.name}, ${rate}, ${burst}, ${burst}, ${w.pacedPerMinute}, ${w.burst}, ${start ? 'START' : null}, ${start ? sql`now()` : null})
      on conflict (name) do update set
        rate_per_minute = case when ${kept} then windows.rate_per_minute else excluded.rate_per_minute end,
        burst = case when ${kept} then windows.burst else excluded.burst end,
        tokens = least(windows.tokens, case when ${kept} then windows.burst else excluded.burst end),
        pace_reason = case when ${kept} then windows.pace_reason else excluded.pace_reason end,
        paced_at = case when ${kept} then windows.paced_at else excluded.paced_at end,
        observed_limit_per_minute = case when ${kept} then windows.observed_limit_per_minute end,
        configured_rate_per_minute = excluded.configured_rate_per_minute, configured_burst = excluded.configured_burst,
        updated_at = now()`;
  }
}

/** One pace change a node decided (learned-pace.ts planPace): the new rate and its burst. */
export interface PaceChange {
  rate: number;
  burst: number;
  reason: 'LIMIT' | 'DRAIN' | 'START' | 'CLIMB';
  /** The stated window it was decided on, or null. */
  observedLimit: number | null;
}

/**
 * Applies a pace change, one conditional statement. The bucket first refills at the old rate up
 * to now (so the new rate counts only from now); a lowering keeps the seconds' worth it holds
 * (tokens × new / old: the configured burst the first answers found too big is not spent at the
 * learned rate), and it is capped at the new burst; a paused bucket
 * (refilled_at ahead) keeps its pause. A lowering applies only where the rate is higher (nodes
 * deciding the same drop at once change it once; the lowest wins); an increase only where the
 * rate is still the one it was decided from (`from`), so two nodes never add two steps for one.
 * Returns whether the row changed.
 */
export async function changePace(sql: Tx, window: string, change: PaceChange, from: number | null): Promise<boolean> {
  const rows = await sql`
    update windows set
      tokens = least(${change.burst}::float8, least(1, ${change.rate}::float8 / rate_per_minute) * case when refilled_at >= clock_timestamp() then tokens
        else least(burst, tokens + extract(epoch from (clock_timestamp() - refilled_at)) * rate_per_minute / 60.0) end),
      refilled_at = greatest(refilled_at, clock_timestamp()),
      rate_per_minute = ${change.rate}::float8, burst = ${change.burst}::float8,
      observed_limit_per_minute = coalesce(${change.observedLimit}::float8, observed_limit_per_minute),
      pace_reason = ${change.reason}, paced_at = now(), updated_at = now()
    where name = ${window} and rate_per_minute is not null
      and ${from === null ? sql`rate_per_minute > ${change.rate}::float8` : sql`rate_per_minute = ${from}::float8`}
    returning name`;
  return rows.length > 0;
}

/** Records the provider's stated window when it changed, without a pace change (visibility only). */
export async function recordObservedLimit(sql: Tx, window: string, limit: number): Promise<void> {
  await sql`update windows set observed_limit_per_minute = ${limit}::float8 where name = ${window} and observed_limit_per_minute is distinct from ${limit}::float8`;
}

export interface WindowRow extends BucketState {
  name: string;
  /** Configured paced rate (limit × PACE_FRACTION) and burst; ratePerMinute and burst are what leases use now. */
  configuredRatePerMinute: number | null;
  configuredBurst: number | null;
  observedLimitPerMinute: number | null;
  paceReason: string | null;
  pacedAt: number | null;
  inFlight: number;
  poolSize: number;
  pauseReason: string | null;
  latencyP50Ms: number | null;
  latencyP95Ms: number | null;
  /** p95 of how long a call held its pool slot (lease to settlement commit), as last published. */
  slotHoldP95Ms: number | null;
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
    configuredRatePerMinute: r.configured_rate_per_minute as number | null,
    configuredBurst: r.configured_burst as number | null,
    observedLimitPerMinute: r.observed_limit_per_minute as number | null,
    paceReason: r.pace_reason as string | null,
    pacedAt: r.paced_at ? (r.paced_at as Date).getTime() : null,
    tokens: r.tokens as number,
    refilledAt: (r.refilled_at as Date).getTime(),
    pausedUntil: r.paused_until ? (r.paused_until as Date).getTime() : null,
    pauseReason: r.pause_reason as string | null,
    inFlight: r.in_flight_now as number,
    poolSize: r.pool_size as number,
    latencyP50Ms: r.latency_p50_ms as number | null,
    latencyP95Ms: r.latency_p95_ms as number | null,
    slotHoldP95Ms: r.slot_hold_p95_ms as number | null,
    dbNow: (r.db_now as Date).getTime(),
    accountStoppedUntil: r.dispatch_stopped_until ? (r.dispatch_stopped_until as Date).getTime() : null,
  }));
}

export async function reportWindowLatency(sql: Tx, window: string, poolSize: number, p50: number, p95: number, holdP95: number): Promise<void> {
  await sql`update windows set pool_size = ${poolSize}, latency_p50_ms = ${p50}, latency_p95_ms = ${p95}, slot_hold_p95_ms = ${holdP95}, updated_at = now() where name = ${window}`;
}
