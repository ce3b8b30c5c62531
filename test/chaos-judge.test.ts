/**
 * The chaos benchmark's judgement (bench/lib/chaos-judge.ts): pure functions,
 * so the verdicts the bench prints rest on tested arithmetic.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  attribute,
  creditsPerTenant,
  faultOfJobs,
  firstAfter,
  idempotencyKeyFor,
  judgeJobs,
  longestGapSeconds,
  paramsFor,
  recoverySeconds,
  tagOfKey,
  tagOfParams,
  type JobRecord,
} from '../bench/lib/chaos-judge.ts';

describe('chaos judgement', () => {
  test('a tag round-trips through the idempotency key and both params', () => {
    assert.equal(tagOfKey(idempotencyKeyFor('3-17')), '3-17');
    assert.equal(tagOfKey('someone-else'), null);
    assert.equal(tagOfParams(paramsFor('dnslookup', '3-17')), '3-17');
    assert.equal(tagOfParams(paramsFor('emailvalidator', '12-0')), '12-0');
    assert.equal(tagOfParams({ domain: 'example.com' }), null);
    assert.equal(tagOfParams({}), null);
  });

  test('calls are summed per job; lost, double-billed and mis-billed jobs are named', () => {
    const call = (tag: string, credits: number, status: number | null = 200) => ({ params: paramsFor('dnslookup', tag), status, credits });
    const { perTag, unattributed } = attribute([
      call('0-0', 1),
      call('0-1', 0, 503),
      call('0-1', 1),
      call('0-2', 1),
      call('0-2', 1), // billed twice
      call('0-3', 1),
      call('0-3', 1), // billed twice: the first call's worker was lost with it (SIGKILL), so it ran again
      call('1-0', 5),
      call('1-0', 0, null), // a hang: a call, not billed, not counted by Sluice (attempts 1)
      call('9-9', 1), // a job Sluice has no row for
      { params: { domain: 'example.com' }, status: 200, credits: 1 },
    ]);
    assert.equal(unattributed, 1);
    assert.deepEqual(perTag.get('0-1'), { calls: 2, billedCalls: 1, credits: 1 });
    const jobs: JobRecord[] = [
      { id: 'a', tag: '0-0', state: 'SUCCEEDED', attempts: 1, creditsBilled: 1 },
      { id: 'b', tag: '0-1', state: 'SUCCEEDED', attempts: 2, creditsBilled: 1 },
      { id: 'c', tag: '0-2', state: 'SUCCEEDED', attempts: 2, creditsBilled: 1 },
      { id: 'f', tag: '0-3', state: 'SUCCEEDED', attempts: 2, creditsBilled: 2, lostWithWorker: 1 },
      { id: 'd', tag: '1-0', state: 'RUNNING', attempts: 1, creditsBilled: 0 },
    ];
    const accepted = new Map([['a', ''], ['b', ''], ['c', ''], ['d', ''], ['e', ''], ['f', '']]);
    const v = judgeJobs(accepted, jobs, perTag);
    assert.deepEqual(v.lost, [{ id: 'd', state: 'RUNNING' }, { id: 'e', state: null }]);
    assert.deepEqual(v.doubleBilled.map((d) => [d.tag, d.why]), [['0-2', ['billedTwice']], ['1-0', ['callsOverAttempts']]]);
    assert.deepEqual(v.rerunAfterWorkerLoss.map((d) => [d.tag, d.billedCalls, d.lostWithWorker]), [['0-3', 2, 1]], 'a re-run after a lost worker is not double billing');
    assert.deepEqual(v.perJobMismatches.map((m) => [m.tag, m.creditsBilled, m.providerCredits]), [['0-2', 1, 2], ['1-0', 0, 5]]);
    assert.equal(v.callsForUnknownJobs, 1);
    assert.deepEqual([...creditsPerTenant(perTag)].sort(), [[0, 6], [1, 5], [9, 1]]);
  });

  test('recovery waits for the slowest tenant on both sides; never = null', () => {
    assert.equal(firstAfter([1, 5, 9], 5), 9);
    assert.equal(firstAfter([1, 5, 9], 9), null);
    const finishes = [[1_000, 12_000], [11_000]];
    const answers = [[10_500], [13_500]];
    assert.equal(recoverySeconds(10_000, finishes, answers), 3.5);
    assert.equal(recoverySeconds(12_500, finishes, answers), null); // tenant 1 never finished again
  });

  test('the longest gap counts the stretch before the first and after the last instant', () => {
    assert.equal(longestGapSeconds([2_000, 3_000, 9_000], 0, 10_000), 6);
    assert.equal(longestGapSeconds([2_000], 0, 30_000), 28);
    assert.equal(longestGapSeconds([], 0, 4_000), 4);
  });

  test('a faulty job belongs to the first fault around one of its calls', () => {
    const spans = [{ startMs: 10_000, endMs: 20_000 }, { startMs: 40_000, endMs: 45_000 }];
    const times = new Map([['a', [9_000, 30_000]], ['b', [52_000]], ['c', [60_000]], ['d', []]]);
    const got = faultOfJobs(['a', 'b', 'c', 'd'], times, spans, 3_000, 10_000);
    assert.deepEqual([...got], [['a', 0], ['b', 1], ['c', -1], ['d', -1]]);
  });
});
