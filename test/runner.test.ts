/**
 * `npm test` itself: test/run.ts over small fixture files (test/fixtures/runner, outside the
 * suite's *.test.ts), each run on its own, so each proves that this one file alone fails the run
 * (or does not). Node's runner alone exits 0 for the file that exits half way and for the one cut
 * short by an exit hook; the counts check must not.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { judge, record, report, type RunnerEvent, type Tally } from './lib/tally.ts';

const root = path.dirname(path.dirname(new URL(import.meta.url).pathname));
const fixture = (name: string) => path.join('test', 'fixtures', 'runner', `${name}.fixture.ts`);

/** Runs `npm test`'s script over the fixtures; its exit code and output. */
async function runTests(...files: string[]): Promise<{ code: number | null; out: string; summary: string }> {
  return runTestsWith({}, ...files);
}

async function runTestsWith(extraEnv: Record<string, string>, ...files: string[]): Promise<{ code: number | null; out: string; summary: string }> {
  // Not this file's runner context: run.ts is a runner of its own. No Postgres is needed (the
  // fixtures use none): a TEST_DATABASE_URL keeps run.ts from starting an embedded one.
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  const child = spawn(process.execPath, ['test/run.ts', ...files], {
    cwd: root,
    env: { ...env, TEST_DATABASE_URL: 'postgres://unused@127.0.0.1:1/unused', ...extraEnv },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr.on('data', (b: Buffer) => (out += b.toString()));
  const code = await new Promise<number | null>((resolve) => child.on('close', (c) => resolve(c)));
  const lines = out.trimEnd().split('\n');
  return { code, out, summary: lines[lines.length - 1] ?? '' };
}

describe('npm test over fixture files', () => {
  test('a file whose tests all report passes, and the run ends with the plain summary line', async () => {
    const r = await runTests(fixture('passes'));
    assert.equal(r.code, 0, r.out);
    assert.equal(r.summary, '3 passed, 0 failed, 1 skipped');
    assert.doesNotMatch(r.out, /counts check/);
  });

  test('a file whose process exits 0 half way fails the run, naming the tests it never reported', async () => {
    const r = await runTests(fixture('exits-midway'));
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /test\/fixtures\/runner\/exits-midway\.fixture\.ts: 4 tests declared, 1 ran/);
    for (const missing of ['exits midway > the exit', 'exits midway > never reached', 'never reached either']) {
      assert.ok(r.out.includes(JSON.stringify(missing)), `names ${missing}:\n${r.out}`);
    }
    assert.match(r.out, /exited \(code 0\) before its test runner finished/);
    assert.equal(r.summary, '1 passed, 3 failed, 0 skipped');
  });

  test("a file cut short by an exit hook after its last test fails the run, though every test passed", async () => {
    const r = await runTests(fixture('exit-hook'));
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /exit-hook\.fixture\.ts: 2 tests declared, 2 ran/);
    assert.match(r.out, /before its test runner finished/);
    assert.equal(r.summary, '2 passed, 1 failed, 0 skipped');
  });

  test('a file whose process is killed by a signal fails the run', async () => {
    const r = await runTests(fixture('killed'));
    assert.equal(r.code, 1, r.out);
    assert.match(r.out, /killed\.fixture\.ts: .*\n\s+- its process was killed by SIGKILL/);
    assert.equal(r.summary, '0 passed, 1 failed, 0 skipped');
  });

  test('a file that stays up after its tests is ended by the guard and named; its passing tests still pass the run', async () => {
    const r = await runTestsWith({ TEST_LINGER_MS: '2000' }, fixture('lingers'));
    assert.equal(r.code, 0, r.out);
    assert.match(r.out, /linger-guard: 1 test file\(s\) stayed up after their tests and were ended: test\/fixtures\/runner\/lingers\.fixture\.ts/);
    assert.doesNotMatch(r.out, /counts check/);
    assert.equal(r.summary, '2 passed, 0 failed, 0 skipped');
  });

  test('a failing test fails the run; its exit code 1 is a normal end, and the counts add up over files', async () => {
    const r = await runTests(fixture('fails'), fixture('passes'));
    assert.equal(r.code, 1, r.out);
    assert.doesNotMatch(r.out, /counts check/);
    assert.equal(r.summary, '4 passed, 1 failed, 1 skipped');
  });
});

describe('the counts check (pure)', () => {
  const file = '/x/a.test.ts';
  const events = (...list: [string, object][]): Tally => {
    const tally: Tally = new Map();
    for (const [type, data] of list) record(tally, { type, data } satisfies RunnerEvent);
    return tally;
  };
  const child = (testId: number, extra: object = {}) => ({ testId, parentId: 0, name: `t${testId}`, type: 'test', entryFile: file, ...extra });
  const ended = (error?: object): [string, object] => ['test:complete', { file, name: 'a.test.ts', details: { passed: !error, error } }];

  test('exit code 1 is normal only after its process reported a failed run', () => {
    const failedRun = events(
      ['test:enqueue', child(1)],
      ['test:fail', child(1, { details: { type: 'test', error: { failureType: 'testCodeFailure' } } })],
      ['test:summary', { entryFile: file, counts: { tests: 1 }, success: false }],
      ended({ failureType: 'subtestsFailed', exitCode: 1, signal: null }),
    );
    assert.deepEqual(judge([file], failedRun).files[0]!.problems, []);
    const exitedAfterSuccess = events(
      ['test:enqueue', child(1)],
      ['test:pass', child(1, { details: { type: 'test' } })],
      ['test:summary', { entryFile: file, counts: { tests: 1 }, success: true }],
      ended({ failureType: 'testCodeFailure', exitCode: 1, signal: null }),
    );
    const v = judge([file], exitedAfterSuccess);
    assert.deepEqual(v.files[0]!.problems, ['its process exited with code 1']);
    assert.equal(v.ok, false);
    assert.equal(v.failed, 1, 'the summary line never says 0 failed for a failing run');
  });

  test('a file the guard ended passes without its summary only if every declared test reported', () => {
    const reportedAll = events(['test:enqueue', child(1)], ['test:pass', child(1, { details: { type: 'test' } })], ended());
    assert.deepEqual(judge([file], reportedAll, new Set([file])).files[0]!.problems, []);
    assert.match(judge([file], reportedAll).files[0]!.problems[0]!, /before its test runner finished/, 'without the guard, a missing summary fails');
    const lostOne = events(['test:enqueue', child(1)], ['test:enqueue', child(2)], ['test:pass', child(1, { details: { type: 'test' } })], ended());
    const v = judge([file], lostOne, new Set([file]));
    assert.deepEqual(v.files[0]!.problems, ['1 declared never reported: "t2"']);
    assert.equal(v.ok, false);
    // As seen in CI: the guard's exit cut the file's own summary short (0 tests, not a success, exit
    // code 1) although its 12 tests had all passed. The results that reached the run judge it.
    const cutShort = events(['test:enqueue', child(1)], ['test:pass', child(1, { details: { type: 'test' } })], ['test:summary', { entryFile: file, counts: { tests: 0 }, success: false }], ended({ failureType: 'testCodeFailure', exitCode: 1, signal: null }));
    assert.deepEqual(judge([file], cutShort, new Set([file])).files[0]!.problems, []);
    assert.deepEqual(judge([file], cutShort).files[0]!.problems, ['its process counted 0 tests but 1 results reached the run'], 'without the guard, that summary fails');
  });

  test('a file nothing was heard of, and a summary whose count differs from the results received, fail', () => {
    assert.deepEqual(judge([file], new Map()).files[0]!.problems, ['the test runner reported nothing for it']);
    const lost = events(
      ['test:enqueue', child(1)],
      ['test:pass', child(1, { details: { type: 'test' } })],
      ['test:summary', { entryFile: file, counts: { tests: 2 }, success: true }],
      ended(),
    );
    const v = judge([file], lost);
    assert.deepEqual(v.files[0]!.problems, ['its process counted 2 tests but 1 results reached the run']);
    assert.deepEqual(report(v).slice(-1), ['1 passed, 1 failed, 0 skipped']);
  });

  test('a suite whose hook failed counts as a failure; a todo failure does not', () => {
    const v = judge(
      [file],
      events(
        ['test:enqueue', child(1, { type: 'suite' })],
        ['test:enqueue', child(2, { parentId: 1 })],
        ['test:enqueue', child(3, { parentId: 1 })],
        ['test:pass', child(2, { details: { type: 'test' } })],
        ['test:fail', child(3, { todo: true, details: { type: 'test', error: {} } })],
        ['test:fail', child(1, { details: { type: 'suite', error: { failureType: 'hookFailed' } } })],
        ['test:summary', { entryFile: file, counts: { tests: 2 }, success: false }],
        ended({ failureType: 'subtestsFailed', exitCode: 1, signal: null }),
      ),
    );
    assert.deepEqual(v.files[0]!.problems, []);
    assert.deepEqual({ passed: v.passed, failed: v.failed, skipped: v.skipped, ok: v.ok }, { passed: 1, failed: 1, skipped: 1, ok: false });
  });
});
