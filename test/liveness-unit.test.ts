/**
 * The liveness decisions (src/dispatch/liveness.ts), pure: the sweeper's hold
 * after an outage, how long a sent call's lease lasts, the attempt's local
 * deadline, the outcome of a run that threw, the settlement retry's backoff.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { expiryHoldMs, leaseDeadline, leaseLost, RECONNECT_BOUND_MS, refreshDue, refreshedDeadline, sentLeaseMs, settleRetryDelayMs, unexpectedOutcome } from '../src/dispatch/liveness.ts';
import { planSettlement } from '../src/dispatch/retry.ts';
import { reactionTo } from '../src/provider/classify.ts';
import { billedCredits } from '../src/scheduler/ledger.ts';

const LEASE = 10_000;
const GRACE = LEASE + RECONNECT_BOUND_MS;

describe('expiryHoldMs: when the sweeper may settle expired leases', () => {
  test('Postgres up for long and this node never cut off: at once', () => {
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 3_600_000, nodeBackForMs: Infinity }), 0);
  });

  test('Postgres just back from a restart: one lease plus a reconnect after its start', () => {
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 0, nodeBackForMs: Infinity }), GRACE);
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 4_000, nodeBackForMs: Infinity }), GRACE - 4_000);
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: GRACE, nodeBackForMs: Infinity }), 0);
  });

  test('this node just reached Postgres again (Postgres stayed up): one lease plus a reconnect after that', () => {
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 3_600_000, nodeBackForMs: 1_000 }), GRACE - 1_000);
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 3_600_000, nodeBackForMs: GRACE + 1 }), 0);
  });

  test('the later of the two counts', () => {
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 2_000, nodeBackForMs: 5_000 }), GRACE - 2_000);
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 5_000, nodeBackForMs: 2_000 }), GRACE - 2_000);
  });

  test("another node cut off while Postgres stays up does not hold this node's sweep: its leases expire on time", () => {
    // This node's view: Postgres up all along, this node never failed. The cut-off node's calls end
    // (by their own timeout, or by its lease rule) before their leases can expire: see sentLeaseMs.
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 86_400_000, nodeBackForMs: Infinity }), 0);
    const cutOffAt = 0;
    assert.ok(leaseLost(cutOffAt + 0.75 * LEASE + 1, leaseDeadline(cutOffAt, LEASE), LEASE), 'an attempt not yet sent is given up before the database lets anyone take it');
  });

  test('a reconnect allowance can be set', () => {
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 0, nodeBackForMs: Infinity, reconnectMs: 0 }), LEASE);
  });
});

describe('sentLeaseMs: a sent call\'s lease outlasts the call', () => {
  const TIMEOUT = 10_000; // PROVIDER_TIMEOUT_MS, the default: as long as the default lease

  test("its own timeout plus the lease rule's ¼ margin, never less than a lease", () => {
    assert.equal(sentLeaseMs(LEASE, TIMEOUT), 12_500);
    assert.equal(sentLeaseMs(LEASE, 30_000), 32_500);
    assert.equal(sentLeaseMs(3_000, 1_000), 3_000, 'a call well inside ¾ of the lease needs no more than the lease');
  });

  test('in an outage from the moment it was sent (no refresh at all), the call runs to its own timeout', () => {
    const markSentAt = 1_000; // the mark's send; the lease returned a little earlier
    const deadline = refreshedDeadline(leaseDeadline(markSentAt - 50, LEASE), markSentAt, sentLeaseMs(LEASE, TIMEOUT));
    // Postgres went away right after the mark: before, the call was cut short at ¾ of the lease.
    assert.equal(leaseLost(markSentAt + 0.75 * LEASE + 1, deadline, LEASE), false, 'not cut short at ¾ of the lease');
    assert.equal(leaseLost(markSentAt + TIMEOUT - 1, deadline, LEASE), false, 'it runs until its own timeout');
  });

  test("a node cut off while others reach Postgres: its call is over before anyone may take its lease", () => {
    const markSentAt = 0;
    const sentLease = sentLeaseMs(LEASE, TIMEOUT);
    // The database's lease runs from the mark's now(), which is after its send: at least this long.
    const databaseExpiry = markSentAt + sentLease;
    const deadline = refreshedDeadline(leaseDeadline(markSentAt, LEASE), markSentAt, sentLease);
    // The call ends by its own timer (it starts after the mark returns) or, if it started late, by the lease rule.
    const startedOnTime = markSentAt + 20;
    assert.ok(startedOnTime + TIMEOUT < databaseExpiry, 'its own timeout ends it in time');
    const startedLate = markSentAt + LEASE / 2; // a busy event loop: its own timer would end it past the lease
    assert.ok(startedLate + TIMEOUT > databaseExpiry);
    const stopAt = deadline - LEASE / 4;
    assert.ok(leaseLost(stopAt + 1, deadline, LEASE) && stopAt < databaseExpiry, 'the lease rule stops it a quarter lease before the database lets anyone take it');
  });
});

describe('the attempt deadline, on the monotonic clock', () => {
  test('a lease that waited on a lock counts from its return: its calls are not aborted early', () => {
    const sentAt = 1_000;
    const waitedMs = 0.9 * LEASE; // the lease call waited on a tenant row for most of a lease
    const returnedAt = sentAt + waitedMs;
    const deadline = leaseDeadline(returnedAt, LEASE);
    assert.equal(leaseLost(returnedAt + 0.5 * LEASE, deadline, LEASE), false, 'half a lease after the return, the call runs on');
    assert.equal(leaseLost(returnedAt + 0.75 * LEASE + 1, deadline, LEASE), true, '¾ of a lease without a refresh stops it');
    // Counted from the send (as before), the call would have been aborted right after it was sent.
    assert.equal(leaseLost(returnedAt + 1, leaseDeadline(sentAt, LEASE), LEASE), true);
  });

  test('a refresh extends the deadline from its send time, never shortens it', () => {
    assert.equal(refreshedDeadline(20_000, 15_000, LEASE), 25_000);
    assert.equal(refreshedDeadline(30_000, 15_000, LEASE), 30_000, 'a late answer to an old refresh changes nothing');
  });
});

describe('refreshDue: which open leases a tick refreshes', () => {
  test('a lease just written, or just lengthened by the sent mark, is not written again', () => {
    assert.equal(refreshDue(1_000, leaseDeadline(1_000, LEASE), LEASE), false);
    assert.equal(refreshDue(1_000 + 0.1 * LEASE - 1, leaseDeadline(1_000, LEASE), LEASE), false);
    assert.equal(refreshDue(1_000 + 0.1 * LEASE, leaseDeadline(1_000, LEASE), LEASE), true, 'a tenth of the lease used: due');
    const marked = refreshedDeadline(leaseDeadline(1_000, LEASE), 1_010, sentLeaseMs(LEASE, 12_000));
    assert.equal(refreshDue(1_000 + 0.5 * LEASE, marked, LEASE), false, 'the sent mark made it outlast the call: nothing to write yet');
  });

  test('whatever the phase of the timer, a lease whose refreshes all fail gets at least three tries before its call is stopped', () => {
    const tick = LEASE / 5; // AttemptLeases' timer
    for (let phase = 0; phase < tick; phase += tick / 50) {
      const leasedAt = 10_000 + phase;
      const deadline = leaseDeadline(leasedAt, LEASE);
      let tries = 0;
      for (let now = 10_000 + tick; ; now += tick) {
        if (leaseLost(now, deadline, LEASE)) break; // the tick aborts before it refreshes
        if (refreshDue(now, deadline, LEASE)) tries++;
      }
      assert.ok(tries >= 3, `phase ${phase}: ${tries} tries`);
    }
  });
});

describe('unexpectedOutcome: a run that threw', () => {
  test('nothing sent: a refunded put-back that uses no attempt', () => {
    const { outcome, putBack } = unexpectedOutcome(false, 5, 'billed', 'boom');
    assert.equal(putBack, true);
    assert.equal(billedCredits(outcome.creditsBilled, 5), 0, 'refunded');
    const plan = planSettlement('put_back', outcome, 1, 3, 1);
    assert.deepEqual(plan, { action: 'requeue', delaySeconds: 1, countsAsAttempt: false });
    assert.match(outcome.message!, /unexpected error: boom/);
  });

  test('possibly sent: settled like a timeout, billed per TIMEOUT_BILLING, retried', () => {
    const billed = unexpectedOutcome(true, 5, 'billed', 'boom');
    assert.equal(billed.putBack, false);
    assert.equal(billed.outcome.kind, 'timeout');
    assert.equal(billedCredits(billed.outcome.creditsBilled, 5), 5);
    assert.equal(planSettlement(reactionTo(billed.outcome), billed.outcome, 1, 3, 1).action, 'requeue');
    assert.equal(planSettlement(reactionTo(billed.outcome), billed.outcome, 4, 3, 1).action, 'fail', 'bounded by the retry limit like any timeout');
    const refunded = unexpectedOutcome(true, 5, 'refunded', 'boom');
    assert.equal(billedCredits(refunded.outcome.creditsBilled, 5), 0);
  });
});

describe('settleRetryDelayMs', () => {
  test('exponential and bounded while running; short while stopping, so the grace is not slept away', () => {
    assert.equal(settleRetryDelayMs(1, false), 100);
    assert.equal(settleRetryDelayMs(3, false), 400);
    assert.equal(settleRetryDelayMs(50, false), 5_000);
    assert.equal(settleRetryDelayMs(1, true), 100);
    assert.equal(settleRetryDelayMs(50, true), 250);
    assert.equal(settleRetryDelayMs(-1, false), 50);
  });
});
