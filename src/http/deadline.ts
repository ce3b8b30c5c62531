/**
 * The request deadline (REQUEST_TIMEOUT_MS) and the one thing it must never
 * break: a submission answered with an error must not be stored.
 *
 * When the deadline passes, the HTTP layer answers 503 at once, but the
 * resolver may still be running. A submission therefore asks the gate before
 * it commits: `enterCommit()` fails once the deadline has answered (the
 * transaction rolls back), and once a commit has started `expire()` fails, so
 * the HTTP layer waits for the commit's real outcome instead of answering a
 * timeout for work that is being stored.
 */
export class CommitGate {
  private state: 'open' | 'committing' | 'expired' = 'open';

  /** Before a commit: true when the request may still succeed (the deadline has not answered). */
  enterCommit(): boolean {
    if (this.state === 'expired') return false;
    this.state = 'committing';
    return true;
  }

  /** At the deadline: true when the request may be answered with a timeout now (no commit under way). */
  expire(): boolean {
    if (this.state === 'committing') return false;
    this.state = 'expired';
    return true;
  }
}
