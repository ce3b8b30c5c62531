/**
 * WHEN an attempt may be declared dead or given up, as pure functions: the
 * sweeper's grace after an outage, how long a sent call's lease lasts, the
 * attempt's deadline on the node's own monotonic clock, the outcome of an
 * attempt whose run threw, and how soon a failed settlement is tried again. The I/O that applies them lives in
 * scheduler/sweeper.ts, dispatch/attempt-leases.ts, dispatch/window-loop.ts and
 * dispatch/settler.ts.
 */
import type { CallOutcome } from '../provider/types.ts';

/**
 * How long a reconnecting node (postgres.js) may take to reach a Postgres
 * that is back: its reconnect backoff is capped at 2 s (db/client.ts).
 */
export const RECONNECT_BOUND_MS = 2_000;

export interface ExpiryHoldInput {
  leaseMs: number;
  /** How long Postgres has been up (its clock: now - its start or last crash recovery). */
  dbUpForMs: number;
  /** How long since this node reached Postgres again after failing to (monotonic); Infinity if it never failed. */
  nodeBackForMs: number;
  /** Extra room for a node to reconnect (default RECONNECT_BOUND_MS). */
  reconnectMs?: number;
}

/**
 * How long the sweeper must still wait before it may settle expired leases
 * (0 = it may now). Leases run on the database's clock, which does not stop
 * in an outage: when Postgres comes back, or this node reaches it again,
 * every lease that ran out meanwhile looks dead, although its owner may be
 * alive with the attempt's outcome in hand, waiting to store it. One lease
 * (plus a reconnect) after both are back, every live owner has refreshed its
 * leases (every ⅕ lease) or settled them; only then is an expired lease
 * proof of a dead (or still cut-off) owner.
 *
 * A node cut off while Postgres stays up is NOT protected by this: the other
 * nodes' sweepers see Postgres up all along and expire its leases on time.
 * That is safe because no lease of a sent call ends before the call's own
 * timeout has ended it (`sentLeaseMs`), and the node stops any call whose
 * lease it could not refresh in time (`leaseLost`); the outcomes it holds
 * land late and are reconciled (dispatch/late-settlement.ts).
 */
export function expiryHoldMs(i: ExpiryHoldInput): number {
  const grace = i.leaseMs + (i.reconnectMs ?? RECONNECT_BOUND_MS);
  return Math.max(0, grace - i.dbUpForMs, grace - i.nodeBackForMs);
}

/**
 * How long an attempt's lease must last from the moment its call is marked
 * sent (the mark and this lease are one statement, before the call leaves):
 * the call's own timeout (the provider client's, which ends every call:
 * connect, headers and body) plus the ¼ lease margin of `leaseLost`, and
 * never less than one lease.
 *
 * Why: leases run on the database's clock, which does not stop while this
 * node cannot reach it, and the node cannot tell whether Postgres is down for
 * everyone (nobody can take its leases; its outcomes are worth keeping) or
 * only for it (the others take its leases as they expire). A lease shorter
 * than the call forced a choice: abort the call at ¾ of the lease (the
 * outcome is lost, the provider bills it anyway, and the job is called and
 * billed again), or let it run past a lease others may take (two calls at
 * once). A lease that outlasts the call needs neither: the call ends by its
 * own timeout before any sweeper may take it, whoever can reach Postgres,
 * and its outcome waits in memory until it can be settled. The cost: a sent
 * attempt of a node that died is put back after up to this long instead of
 * one lease (by default 12.5 s instead of 10 s).
 */
export function sentLeaseMs(leaseMs: number, callTimeoutMs: number): number {
  return Math.max(leaseMs, callTimeoutMs + leaseMs / 4);
}

/**
 * The local deadline of a lease (monotonic ms): counted from when the lease
 * statement RETURNED, since the database starts the lease inside the call,
 * after any lock it waited on (counting from the send would abort calls
 * early after a slow lease). The ¼ margin of `leaseLost` covers the call's
 * tail after the reservation was written (its commit and the answer's trip).
 */
export function leaseDeadline(returnedAt: number, leaseMs: number): number {
  return returnedAt + leaseMs;
}

/**
 * A refresh extends the deadline from when it was SENT (the database
 * extends it later, from its commit): never shortened by a late answer. The
 * "sent" mark extends it the same way, by `sentLeaseMs`.
 */
export function refreshedDeadline(deadline: number, refreshSentAt: number, leaseMs: number): number {
  return Math.max(deadline, refreshSentAt + leaseMs);
}

/**
 * Whether an open attempt's lease is worth a refresh at this tick: it has used a tenth of its
 * length. A lease just written, or just lengthened by the sent mark, would only be written again
 * to the same effect: with calls that answer in milliseconds that was most of a drain's refreshes
 * (an update of each open reservation every tick). The refresh timer ticks every fifth of a lease
 * and `leaseLost` gives up at ¾ without one, so a lease still gets at least three tries (the first
 * by three tenths of its length, then one every fifth) before its call is stopped, as it did when
 * the first try came right after the lease.
 */
export function refreshDue(now: number, deadline: number, leaseMs: number): boolean {
  return deadline - now <= leaseMs * 0.9;
}

/**
 * The call must stop: the database may soon let a sweeper take its lease (¾
 * of a lease without a refresh since the deadline's last extension). For a
 * sent call that is never before its own timeout (`sentLeaseMs`), so in an
 * outage of any length a call runs to its answer or its timeout. The rule
 * remains the backstop for a call that started late after its mark (a busy
 * event loop), whose own timer would end it past the lease.
 */
export function leaseLost(now: number, deadline: number, leaseMs: number): boolean {
  return now > deadline - leaseMs / 4;
}

/**
 * What an attempt whose run threw settles as. Nothing sent (the throw came
 * before the request left): a put-back, refunded, the job queued again at
 * once without using one of its attempts. Possibly sent: the provider may
 * have answered and billed, so it is settled like a timeout (billed per
 * TIMEOUT_BILLING, retried as a timeout is).
 */
export function unexpectedOutcome(sent: boolean, credits: number, timeoutBilling: 'billed' | 'refunded', message: string): { outcome: CallOutcome; putBack: boolean } {
  const base = { httpStatus: null, data: null, status: null, latencyMs: 0, message: `unexpected error: ${message}` };
  if (!sent) return { outcome: { ...base, kind: 'server_error', creditsBilled: 0, retryAfterSeconds: 1 }, putBack: true };
  return { outcome: { ...base, kind: 'timeout', creditsBilled: timeoutBilling === 'billed' ? credits : 0, retryAfterSeconds: null }, putBack: false };
}

/**
 * Backoff before a failed settlement is tried again: exponential up to 5 s
 * while running; while stopping, at most 250 ms, so the outcomes it knows
 * land as soon as Postgres is back rather than after a backoff that could
 * eat the rest of the grace.
 */
export function settleRetryDelayMs(failures: number, stopping: boolean): number {
  const delay = Math.min(5_000, 50 * 2 ** Math.min(Math.max(0, failures), 7));
  return stopping ? Math.min(250, delay) : delay;
}
