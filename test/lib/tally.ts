/**
 * The counts check of `npm test`: from the events of Node's test runner, what each test file
 * declared, what it reported, and how its process ended; then whether the run may pass.
 *
 * Node's runner alone passes a file whose process exits 0 half way: the tests it never reached
 * are simply never reported (a library's `beforeExit` hook calling process.exit once did this,
 * and the run still printed "0 failed"). Here a file passes only when
 *  - every test and suite its process declared (test:enqueue, sent as each is created) reported
 *    a result (test:pass / test:fail): the ones that did not are named;
 *  - its process's own test runner finished: it sends a per-file test:summary last, whose test
 *    count must match the results that reached us;
 *  - its process ended cleanly: exit code 0, or 1 after reporting failed tests; no signal.
 * Pure: `record` folds events into a tally, `judge` turns a tally into a verdict, `report` into
 * the lines to print. test/run.ts feeds it the events of the real run.
 */

/** One event of a node:test TestsStream, as `run()` emits it. */
export interface RunnerEvent {
  type: string;
  data: unknown;
}

/** The fields of the events read here (a subset of node:test's EventData, plus `entryFile`). */
interface EventFields {
  testId?: number;
  parentId?: number;
  name?: string;
  type?: 'suite' | 'test';
  file?: string;
  /** The test file whose process sent the event; absent on the runner's own per-file entry. */
  entryFile?: string;
  skip?: unknown;
  todo?: unknown;
  details?: { type?: 'suite' | 'test'; error?: { failureType?: string; exitCode?: number | null; signal?: string | null } };
  counts?: { tests: number };
  success?: boolean;
}

type Outcome = 'passed' | 'failed' | 'skipped';

/** What the events said about one test file (its absolute path). */
export interface FileTally {
  /** Every test and suite its process declared, by the testId its process gave it. */
  declared: Map<number, { name: string; parentId: number; type: 'suite' | 'test' }>;
  /** The result each reported, by testId. */
  reported: Map<number, { outcome: Outcome; type: 'suite' | 'test' }>;
  /** Suites that failed for a reason of their own (a hook), not because a test in them failed. */
  suiteFailures: number;
  /** Its process's own summary, sent once its test runner finished; null while none came. */
  summary: { tests: number; success: boolean } | null;
  /** How its process ended (from the runner's per-file entry); null while it has not. */
  exit: { code: number | null; signal: string | null } | null;
}

export type Tally = Map<string, FileTally>;

/** How test/lib/linger-guard.ts's line on stderr starts; test/run.ts reads it to know the guard ended a file. */
export const LINGER_MARK = 'linger-guard:';

const fileTally = (tally: Tally, file: string): FileTally => {
  let t = tally.get(file);
  if (!t) {
    t = { declared: new Map(), reported: new Map(), suiteFailures: 0, summary: null, exit: null };
    tally.set(file, t);
  }
  return t;
};

/** Folds one event into the tally. Events of other types are ignored. */
export function record(tally: Tally, event: RunnerEvent): void {
  const d = (event.data ?? {}) as EventFields;
  if (d.entryFile === undefined) {
    // The runner's own entry for a file (it spawned the process): its completion says how the
    // process ended. The run-wide summary has neither file nor entryFile and is not needed.
    if (event.type === 'test:complete' && d.file) {
      const error = d.details?.error;
      fileTally(tally, d.file).exit = error ? { code: error.exitCode ?? null, signal: error.signal ?? null } : { code: 0, signal: null };
    }
    return;
  }
  const t = fileTally(tally, d.entryFile);
  switch (event.type) {
    case 'test:enqueue':
      if (d.testId !== undefined) t.declared.set(d.testId, { name: d.name ?? '?', parentId: d.parentId ?? 0, type: d.type ?? 'test' });
      break;
    case 'test:pass':
    case 'test:fail': {
      if (d.testId === undefined) break;
      const type = d.details?.type ?? t.declared.get(d.testId)?.type ?? 'test';
      // A todo test's failure fails nothing (Node's own rule): it counts with the skipped.
      const outcome: Outcome = d.skip || d.todo ? 'skipped' : event.type === 'test:pass' ? 'passed' : 'failed';
      t.reported.set(d.testId, { outcome, type });
      if (type === 'suite' && outcome === 'failed' && d.details?.error?.failureType !== 'subtestsFailed') t.suiteFailures++;
      break;
    }
    case 'test:summary':
      t.summary = { tests: d.counts?.tests ?? 0, success: d.success === true };
      break;
  }
}

/** The totals and problems of one file. */
export interface FileVerdict {
  file: string;
  /** Tests (not suites) its process declared, and those that reported a result. */
  declared: number;
  ran: number;
  passed: number;
  failed: number;
  skipped: number;
  /** Declared tests and suites that never reported, as "suite > test". */
  missing: string[];
  /** Why the file fails the counts check; empty when it passes it. */
  problems: string[];
}

export interface Verdict {
  files: FileVerdict[];
  passed: number;
  /** Failed tests and suites, plus missing tests, plus one for a file that ended badly with neither. */
  failed: number;
  skipped: number;
  ok: boolean;
}

const pathName = (t: FileTally, id: number): string => {
  const names: string[] = [];
  // Bounded: a parentId chain is at most as long as the declared set.
  for (let cur = t.declared.get(id), n = 0; cur && n <= t.declared.size; cur = t.declared.get(cur.parentId), n++) names.unshift(cur.name);
  return names.join(' > ');
};

/**
 * Judges one file from its tally. `lingered`: its process stayed up after its tests ended and
 * test/lib/linger-guard.ts ended it, so its own summary is missing or cut short; every declared
 * test must still have reported, and a failed one still fails.
 */
export function judgeFile(file: string, t: FileTally | undefined, lingered = false): FileVerdict {
  const v: FileVerdict = { file, declared: 0, ran: 0, passed: 0, failed: 0, skipped: 0, missing: [], problems: [] };
  if (!t) {
    v.problems.push('the test runner reported nothing for it');
    return v;
  }
  for (const [id, d] of t.declared) {
    if (d.type === 'test') v.declared++;
    if (!t.reported.has(id)) v.missing.push(pathName(t, id));
  }
  for (const r of t.reported.values()) {
    if (r.type !== 'test') continue;
    v.ran++;
    v[r.outcome]++;
  }
  v.failed += t.suiteFailures;

  const exit = t.exit;
  if (!exit) v.problems.push('its process never ended');
  else if (exit.signal) v.problems.push(`its process was killed by ${exit.signal}`);
  // Exit code 1 is how a finished run says some of its tests failed; anything else is abnormal.
  else if (exit.code !== 0 && !(exit.code === 1 && t.summary?.success === false)) v.problems.push(`its process exited with code ${exit.code}`);
  if (lingered && exit && !exit.signal) {
    // Ended by the guard after its tests: the summary it sent, if any, was cut short (seen in CI:
    // 0 tests, not a success, exit code 1); the declared-vs-reported check below still holds it.
  } else if (!t.summary) {
    v.problems.push(
      exit && !exit.signal && exit.code === 0
        ? 'its process exited (code 0) before its test runner finished: something called process.exit (an exit hook?)'
        : 'its test runner never finished (its process sent no summary)',
    );
  } else if (t.summary.tests !== v.ran) {
    v.problems.push(`its process counted ${t.summary.tests} tests but ${v.ran} results reached the run`);
  }
  if (v.missing.length > 0) v.problems.push(`${v.missing.length} declared never reported: ${v.missing.map((m) => JSON.stringify(m)).join(', ')}`);
  if (t.declared.size === 0 && v.problems.length === 0) v.problems.push('it declared no tests');
  return v;
}

/** Judges the run over the files it was given (absolute paths). */
export function judge(files: readonly string[], tally: Tally, lingered: ReadonlySet<string> = new Set()): Verdict {
  const verdicts = files.map((f) => judgeFile(f, tally.get(f), lingered.has(f)));
  // Events for a file nobody asked for (cannot happen with run()'s own files): judged too, not dropped.
  for (const [f, t] of tally) if (!files.includes(f)) verdicts.push(judgeFile(f, t));
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  for (const v of verdicts) {
    passed += v.passed;
    skipped += v.skipped;
    const missingTests = Math.max(0, v.declared - v.ran);
    const f = v.failed + missingTests;
    // The summary line must never say "0 failed" for a run that fails.
    failed += f === 0 && v.problems.length > 0 ? 1 : f;
  }
  return { files: verdicts, passed, failed, skipped, ok: failed === 0 && verdicts.every((v) => v.problems.length === 0) };
}

/** The lines to print after the runner's own output: the failing files' totals, then the summary line. */
export function report(verdict: Verdict, display: (file: string) => string = (f) => f): string[] {
  const bad = verdict.files.filter((v) => v.problems.length > 0);
  const lines: string[] = [];
  if (bad.length > 0) {
    lines.push('', `counts check: ${bad.length} test file${bad.length === 1 ? '' : 's'} did not report every test declared or did not end cleanly:`);
    for (const v of bad) {
      lines.push(
        `  ${display(v.file)}: ${v.declared} tests declared, ${v.ran} ran (${v.passed} passed, ${v.failed} failed, ${v.skipped} skipped)`,
        ...v.problems.map((p) => `    - ${p}`),
      );
    }
  }
  lines.push('', `${verdict.passed} passed, ${verdict.failed} failed, ${verdict.skipped} skipped`);
  return lines;
}
