/**
 * What a worker's sweeper does each round beyond its own steps (sweeper.ts): publish this node's
 * view (window latencies and pool sizes, the oldest waits for the starvation guard, the breakers,
 * the provider's last status), run retention when due; and the alerts
 * the database's state asks for. Wired here, not in the process's start, so `app.ts` only wires.
 */
import type postgres from 'postgres';
import type { Sql } from '../db/client.ts';
import type { Dispatcher } from '../dispatch/dispatcher.ts';
import type { Breakers } from '../dispatch/breakers.ts';
import type { ProviderClient } from '../provider/types.ts';
import type { Retention } from '../retention/retention.ts';
import type { WindowSpec } from './windows.ts';
import type { JobClass } from '../config/classes.ts';
import { desiredAlerts, type DesiredAlert } from '../alerts/rules.ts';
import { publishProviderStatus, readAccount } from './sql/account.ts';
import { publishBreakers, readBreakers } from './sql/breakers.ts';
import { oldestQueuedAgeByClass, oldestWaitByClass } from './sql/classes.ts';
import { readWindows, recentCappedAsks, reportWindowLatency } from './sql/windows.ts';
import { failedExpiries } from './sql/reservations.ts';
import { recentAttemptLost } from '../jobs/store.ts';

/** Alerts about recent events (a capped pause, jobs failed ATTEMPT_LOST) stay raised this long after the last one. */
export const ALERT_RECENT_SECONDS = 3_600;

export interface SweeperDutiesOptions {
  sql: Sql;
  windows: readonly WindowSpec[];
  dispatcher: Dispatcher;
  breakers: Breakers;
  client: ProviderClient;
  retention: Retention;
  /** CLASS_AGE_PROMISE_SECONDS, in ms per class. */
  agePromisesMs: Partial<Record<JobClass, number>>;
}

export function sweeperDuties(o: SweeperDutiesOptions): { onRound: () => Promise<void>; desiredAlerts: (tx: postgres.TransactionSql) => Promise<DesiredAlert[]> } {
  const { sql, windows, dispatcher, breakers, client, retention, agePromisesMs } = o;
  return {
    onRound: async () => {
      for (const w of windows) {
        const lat = dispatcher.latency.get(w.name)!;
        if (lat.count > 0) await reportWindowLatency(sql, w.name, dispatcher.poolFor(w), lat.percentile(50), lat.percentile(95), dispatcher.held.get(w.name)!.percentile(95));
      }
      dispatcher.oldestWaitMs = await oldestWaitByClass(sql);
      await publishBreakers(sql, breakers.states().map((b) => ({ ...b, retryAt: b.state === 'OPEN' ? new Date(breakers.retryAt(b.api) ?? Date.now()) : null })));
      const status = client.lastStatus();
      if (status) await publishProviderStatus(sql, status);
      await retention.maybeRun();
    },
    desiredAlerts: async (tx) => {
      // Only the oldest ages: classTotals' sums read every queue's row, once a second here.
      const [oldest, account, windowRows, breakerRows, cappedAsks, stuck, lost] = await Promise.all([
        oldestQueuedAgeByClass(tx),
        readAccount(tx),
        readWindows(tx),
        readBreakers(tx),
        recentCappedAsks(tx, ALERT_RECENT_SECONDS),
        failedExpiries(tx),
        recentAttemptLost(tx, ALERT_RECENT_SECONDS),
      ]);
      return desiredAlerts({
        oldestAgeSeconds: oldest,
        agePromiseSeconds: Object.fromEntries(Object.entries(agePromisesMs).map(([c, ms]) => [c, ms! / 1000])),
        accountStop: account.dispatchStoppedUntil ? { reason: account.stopReason ?? 'STOPPED', until: account.dispatchStoppedUntil } : null,
        windowsStopped: windowRows.filter((w) => w.pausedUntil !== null && w.pausedUntil > w.dbNow && w.pauseReason === 'KEY_UNUSABLE').map((w) => ({ name: w.name, reason: w.pauseReason! })),
        openBreakers: breakerRows.filter((b) => b.state === 'OPEN').map((b) => b.api),
        cappedAsks,
        failedExpiries: stuck,
        attemptLost: lost,
      });
    },
  };
}
