/**
 * The liveness decisions (src/dispatch/liveness.ts), pure: the sweeper's hold
 * after an outage, the attempt's local deadline, the outcome of a run that
 * threw, the settlement retry's backoff.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { expiryHoldMs, leaseDeadline, leaseLost, RECONNECT_BOUND_MS, refreshedDeadline, settleRetryDelayMs, unexpectedOutcome } from '../src/dispatch/liveness.ts';
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
    // This node's view: Postgres up all along, this node never failed. The cut-off node aborts its own
    // calls at ¾ of the lease by its own clock, so expiring its leases on time is safe.
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 86_400_000, nodeBackForMs: Infinity }), 0);
    const cutOffAt = 0;
    assert.ok(leaseLost(cutOffAt + 0.75 * LEASE + 1, leaseDeadline(cutOffAt, LEASE), LEASE), 'its calls stop before the database lets anyone take them');
  });

  test('a reconnect allowance can be set', () => {
    assert.equal(expiryHoldMs({ leaseMs: LEASE, dbUpForMs: 0, nodeBackForMs: Infinity, reconnectMs: 0 }), LEASE);
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
