/**
 * The dispatchers' wake-up when work arrives (`NOTIFY sluice_work`), sent after a submission's
 * commit instead of inside it. A NOTIFY in a transaction takes Postgres's one notification lock at
 * its commit and holds it through the commit's WAL flush, so every notifying commit of the database
 * waits for the others' flushes: a submission's notice made the settlements' commits (whose final
 * events must ride in them) queue behind the submissions' flushes. Here the submission commits
 * without it; this process's own dispatcher is poked at once, and the others get a notice of its
 * own: one at a time (a wake() while one is under way asks for one more after it, so every commit
 * is followed by a notice that starts after it), and with synchronous_commit off, so the lock is
 * held only while it is queued, not through a flush. A notice lost to a crash or an outage costs a
 * listener its wake-up only: its dispatcher polls (DISPATCH_IDLE_POLL_MS) and re-LISTENs.
 */
import type { Logger } from 'pino';
import type { Sql } from '../db/client.ts';
import { WORK_CHANNEL } from './service.ts';

export class WorkNotice {
  private readonly sql: Sql;
  private readonly log: Logger;
  private local: (() => void) | null = null;
  private sending = false;
  private again = false;
  /** Notices sent (for tests and metrics). */
  sent = 0;

  constructor(sql: Sql, log: Logger) {
    this.sql = sql;
    this.log = log;
  }

  /** This process's dispatcher: poked directly on each wake(). */
  setLocal(poke: (() => void) | null): void {
    this.local = poke;
  }

  /** Work was committed: wake this process's dispatcher now and every listener by a notice. */
  wake(): void {
    this.local?.();
    if (this.sending) {
      this.again = true;
      return;
    }
    void this.send();
  }

  private async send(): Promise<void> {
    this.sending = true;
    try {
      do {
        this.again = false;
        try {
          await this.sql.begin((tx) => [tx`set local synchronous_commit = off`, tx`select pg_notify(${WORK_CHANNEL}, '')`]);
          this.sent++;
        } catch (err) {
          this.log.debug({ err }, 'the work notice failed: listeners find the work by polling');
        }
      } while (this.again);
    } finally {
      this.sending = false;
    }
  }
}
