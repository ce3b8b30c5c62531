/**
 * The learned pace's I/O, one per worker process: the provider's answers on this node are folded
 * into a sample per window (no statement per call), and every PACE_SAMPLE_MS a window that had
 * answers reads its row once and, when the pure rule (scheduler/learned-pace.ts planPace) says so,
 * changes the shared rate with one conditional statement, for every node at once (leases refill by
 * `windows.rate_per_minute`). An answer that states a window smaller than the rate in use does not
 * wait for the sample: the pace is lowered at once, before a burst at the configured rate trips
 * the provider. A rate-limit 429 is the settler's (pauseWindow: the pause and the decrease commit
 * with the settlement).
 *
 * Sluice's own spend between two samples is read off the window's bucket (what leases on every
 * node took), so the provider's falling `x-rate-limit-remaining` can be told apart from Sluice's
 * own calls (otherTraffic).
 */
import type { Logger } from 'pino';
import type { Sql } from '../db/client.ts';
import type { CallOutcome } from '../provider/types.ts';
import { DRAIN_SPAN_MS, bucketLow, burstFor, decayedBucketSize, otherTraffic, planPace, type PaceRules } from '../scheduler/learned-pace.ts';
import { tokensAt } from '../scheduler/pacer.ts';
import { changePace, readWindows, recordObservedLimit } from '../scheduler/sql/windows.ts';
import type { WindowSpec } from '../scheduler/windows.ts';

export interface PaceLearnerOptions {
  sql: Sql;
  windows: readonly WindowSpec[];
  rules: PaceRules;
  /** PACE_SAMPLE_MS: how often a window's answers on this node are folded into its shared rate. */
  sampleMs: number;
  log: Logger;
}

interface Remaining {
  remaining: number;
  at: number;
  /** The window stated with it (its refill rate), or null. */
  limit: number | null;
}

/** One window's answers since the last sample, and what the samples before it left. */
interface WindowMemory {
  /** The lowest stated window this sample. */
  limit: number | null;
  /** The newest answer's remaining. */
  last: Remaining | null;
  /** Answers with rate-limit headers this sample. */
  answers: number;
  /** Answers this sample that confirm the room (learned-pace.ts PaceEvidence.confirmed), headers or not. */
  confirmed: number;
  /** The highest remaining stated this sample. */
  seenMax: number | null;
  /** The provider's bucket size as far as it shows (decayedBucketSize), and when it was last decayed. */
  bucketSize: number | null;
  bucketAt: number;
  /**
   * The span others' traffic is measured over (DRAIN_SPAN_MS or more): the remaining at its start
   * and what Sluice's leases took since. Restarted wherever Sluice's spend cannot be known.
   */
  drain: { from: Remaining; own: number } | null;
  /** The bucket at the previous sample, to count what leases took since. */
  prevBucket: { tokens: number; at: number; rate: number; pacedAt: number | null } | null;
  /** The shared rate as last read (the at-once trigger compares with it). */
  rate: number | null;
}

export class PaceLearner {
  private readonly options: PaceLearnerOptions;
  private readonly memory = new Map<string, WindowMemory>();
  private timer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private again = false;
  private stopped = true;

  constructor(options: PaceLearnerOptions) {
    this.options = options;
    for (const w of options.windows) {
      this.memory.set(w.name, { limit: null, last: null, answers: 0, confirmed: 0, seenMax: null, bucketSize: null, bucketAt: 0, drain: null, prevBucket: null, rate: w.pacedPerMinute });
    }
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.timer = setInterval(() => this.sample(), this.options.sampleMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.running;
  }

  /** The window's shared rate as this process last read or set it (its configured pace before the first sample). */
  rateOf(w: WindowSpec): number | null {
    return this.memory.get(w.name)?.rate ?? w.pacedPerMinute;
  }

  /** One answer on a window (a batch call is one answer): it joins the window's sample, with its headers if any. */
  observe(w: WindowSpec, outcome: CallOutcome): void {
    const status = outcome.status;
    const m = this.memory.get(w.name);
    if (!status || !m || w.pacedPerMinute === null) return;
    // A 429 is the settler's (pauseWindow); a failing provider says nothing about the room.
    if (outcome.kind !== 'rate_limited' && outcome.kind !== 'server_error' && outcome.kind !== 'credits_exhausted') m.confirmed++;
    const limit = status.rateLimitLimit;
    const remaining = status.rateLimitRemaining;
    if (limit === null && remaining === null) return;
    m.answers++;
    if (limit !== null && limit > 0) m.limit = m.limit === null ? limit : Math.min(m.limit, limit);
    if (remaining !== null) {
      const at = status.observedAt.getTime();
      if (!m.last || at >= m.last.at) m.last = { remaining, at, limit };
      m.seenMax = Math.max(m.seenMax ?? 0, remaining);
    }
    // A stated window below the rate in use: lower now, not at the next sample.
    if (limit !== null && m.rate !== null && limit * this.options.rules.fraction < m.rate - 1e-6) this.sample();
  }

  /** Folds every window's sample; one at a time (a call while one runs runs again after it). */
  private sample(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = (async () => {
      do {
        this.again = false;
        for (const w of this.options.windows) {
          try {
            await this.sampleWindow(w);
          } catch (err) {
            this.options.log.warn({ err, window: w.name }, 'learned pace: sample failed (the rate stays as it is)');
          }
        }
      } while (this.again && !this.stopped);
    })().finally(() => {
      this.running = null;
    });
  }

  private async sampleWindow(w: WindowSpec): Promise<void> {
    const { sql, rules, log } = this.options;
    const m = this.memory.get(w.name)!;
    if (m.answers === 0 && m.confirmed === 0) return;
    const limit = m.limit;
    const last = m.last;
    const confirmed = m.confirmed > 0;
    const at = Date.now();
    m.bucketSize = decayedBucketSize(m.bucketSize, m.seenMax, m.bucketSize === null ? 0 : at - m.bucketAt);
    m.bucketAt = at;
    m.limit = null;
    m.answers = 0;
    m.confirmed = 0;
    m.seenMax = null;
    const [row] = await readWindows(sql, [w.name]);
    if (!row || row.ratePerMinute === null || row.configuredRatePerMinute === null || row.configuredBurst === null) return;
    const now = row.dbNow;
    const paused = (row.pausedUntil !== null && row.pausedUntil > now) || (row.accountStoppedUntil !== null && row.accountStoppedUntil > now);
    const tokens = tokensAt(row, now);
    // What leases took since the last sample: known only across a span with one rate, no pause, and
    // a bucket that was not full at either end (a full bucket drops its refill, and how much it
    // dropped cannot be told from what leases took: Sluice's spend would read low, others' high).
    const pb = m.prevBucket;
    const measurable = pb && !paused && pb.rate === row.ratePerMinute && pb.pacedAt === row.pacedAt && pb.tokens < row.burst - 1 && tokens < row.burst - 1;
    const own = measurable ? Math.max(0, pb.tokens + (row.ratePerMinute * (now - pb.at)) / 60_000 - tokens) : null;
    // Others' traffic, once the span is long enough, over a span with one stated window (the refill).
    let others: number | null = null;
    if (own === null || !last || !m.drain || m.drain.from.limit === null || m.drain.from.limit !== last.limit) {
      m.drain = last ? { from: last, own: 0 } : null;
    } else {
      m.drain.own += own;
      if (last.at - m.drain.from.at >= DRAIN_SPAN_MS && m.bucketSize !== null) {
        others = otherTraffic({ from: m.drain.from.remaining, to: last.remaining, spanMs: last.at - m.drain.from.at, limit: m.drain.from.limit, ownCalls: m.drain.own, bucketSize: m.bucketSize });
        m.drain = { from: last, own: 0 };
      }
    }
    log.trace({ window: w.name, own, others, limit, remaining: last?.remaining ?? null, bucketSize: m.bucketSize, tokens, burst: row.burst, rate: row.ratePerMinute }, 'learned pace: sample');
    const decision = planPace(
      {
        configured: row.configuredRatePerMinute,
        current: row.ratePerMinute,
        sinceChangeMs: row.pacedAt === null ? null : now - row.pacedAt,
        starting: row.paceReason === 'START' || row.paceReason === 'PROBE',
      },
      { limit, otherPerMinute: others, low: bucketLow(last?.remaining ?? null, m.bucketSize), confirmed },
      rules,
    );
    m.prevBucket = paused ? null : { tokens, at: now, rate: row.ratePerMinute, pacedAt: row.pacedAt };
    m.rate = row.ratePerMinute;
    if (decision.kind === 'hold') {
      if (limit !== null && limit !== row.observedLimitPerMinute) await recordObservedLimit(sql, w.name, limit);
      return;
    }
    const change = {
      rate: decision.rate,
      burst: burstFor(row.configuredBurst, row.configuredRatePerMinute, decision.rate),
      reason: decision.reason,
      observedLimit: limit,
    };
    const changed = await changePace(sql, w.name, change, decision.kind === 'raise' ? row.ratePerMinute : null);
    if (!changed) return;
    m.rate = decision.rate;
    m.prevBucket = null;
    const fields = { window: w.name, from: row.ratePerMinute, to: decision.rate, reason: change.reason, statedLimit: limit, othersPerMinute: others, configured: row.configuredRatePerMinute };
    // A lowering is news (the provider is not what the plan says); each step of a climb is not.
    if (decision.kind === 'raise') log.debug(fields, 'learned pace: window rate climbs');
    else log.info(fields, 'learned pace: window rate lowered');
  }
}
