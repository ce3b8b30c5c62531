/**
 * The statements on account_state: the one row about the shared upstream account: dispatch stopped
 * (credits exhausted), and the provider's newest status.
 *
 * Every TypeScript statement that writes the table is here (docs/ARCHITECTURE.md "Who writes each
 * table"; test/table-owners.test.ts). Shared state changes with single conditional statements, never
 * read-then-write, and rows are locked in the one order of docs/ARCHITECTURE.md "Lock order".
 */
import type { Tx } from '../../db/client.ts';
import { resumeKeyStoppedWindows } from './windows.ts';

export interface AccountRow {
  dispatchStoppedUntil: Date | null;
  stopReason: string | null;
  creditsRemaining: number | null;
  maxCredits: number | null;
  renewalAt: Date | null;
  statusAt: Date | null;
}

/** Credits exhausted: every node stops dispatching until `until` (the renewal) or an admin resumes. */
export async function stopAccount(sql: Tx, until: Date, reason: string): Promise<void> {
  await sql`
    insert into account_state (id, dispatch_stopped_until, stop_reason) values (1, ${until}, ${reason})
    on conflict (id) do update set dispatch_stopped_until = greatest(coalesce(account_state.dispatch_stopped_until, ${until}), ${until}),
      stop_reason = ${reason}`;
}

export async function readAccount(sql: Tx): Promise<AccountRow> {
  const [r] = await sql`select * from account_state where id = 1`;
  return {
    dispatchStoppedUntil: r?.dispatch_stopped_until && (r.dispatch_stopped_until as Date) > new Date() ? (r.dispatch_stopped_until as Date) : null,
    stopReason: r?.dispatch_stopped_until && (r.dispatch_stopped_until as Date) > new Date() ? (r.stop_reason as string) : null,
    creditsRemaining: r?.credits_remaining === null || r?.credits_remaining === undefined ? null : Number(r.credits_remaining),
    maxCredits: r?.max_credits === null || r?.max_credits === undefined ? null : Number(r.max_credits),
    renewalAt: (r?.renewal_at as Date | null) ?? null,
    statusAt: (r?.status_at as Date | null) ?? null,
  };
}

/** The newest provider status (x-api-* headers) a worker saw, for the admin view and alerts. */
export async function publishProviderStatus(sql: Tx, s: { remainingCredits: number | null; maxCredits: number | null; renewalAt: Date | null; observedAt: Date }): Promise<void> {
  await sql`
    insert into account_state (id, credits_remaining, max_credits, renewal_at, status_at)
    values (1, ${s.remainingCredits}, ${s.maxCredits}, ${s.renewalAt}, ${s.observedAt})
    on conflict (id) do update set credits_remaining = excluded.credits_remaining, max_credits = excluded.max_credits,
      renewal_at = excluded.renewal_at, status_at = excluded.status_at
    where account_state.status_at is null or account_state.status_at < excluded.status_at`;
}

/** An admin's resumeDispatch: lifts the account stop, and the stop of key-unusable windows (all, or one). */
export async function resumeDispatch(sql: Tx, window: string | null): Promise<void> {
  // Lock order: windows (by name) before account_state, as every other path takes them.
  await resumeKeyStoppedWindows(sql, window);
  await sql`update account_state set dispatch_stopped_until = null, stop_reason = null where id = 1`;
}
