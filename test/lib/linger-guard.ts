/**
 * Loaded into every test file's process (test/run.ts, `--import`): once the file's tests have
 * ended, the process has LINGER_MS (60 s; TEST_LINGER_MS) to exit by itself. One that stays up (a handle left open: a
 * socket reconnecting to a test database already dropped, a timer) would otherwise keep the
 * runner waiting for ever, and the suite would hang instead of finishing. It is reported on
 * stderr with the open resources, then the process exits with the code its runner set.
 *
 * The case that made it: a postgres.js connection killed mid-query by its test's database drop,
 * then asked for one more query, reconnected to the dropped database without end (fixed since by
 * scripts/patch-postgres.mjs). A Sluice process never waits like this: `npm start` exits once its
 * graceful stop is done.
 */
import { after } from 'node:test';
import { LINGER_MARK } from './tally.ts';

/**
 * Long enough for the file's own top-level `after` hooks (stopping apps, dropping databases),
 * which may run after this one: it is armed when the root's hooks start.
 */
const LINGER_MS = Number(process.env.TEST_LINGER_MS ?? 60_000);

after(() => {
  const timer = setTimeout(() => {
    process.stderr.write(`${LINGER_MARK} the process was still up ${LINGER_MS / 1000} s after its tests ended (open: ${JSON.stringify(process.getActiveResourcesInfo())}); exiting with the code its runner set, ${process.exitCode ?? 0}\n`);
    process.exit();
  }, LINGER_MS);
  // Only a process that something else keeps alive ever reaches it.
  timer.unref();
});
