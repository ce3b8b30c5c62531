/**
 * A Sluice process for a benchmark: startSluice with the environment the
 * parent gave, then "ready" over IPC. "stop" stops it and reports the
 * process's CPU time. Logs (pino, stdout) are piped to the parent's stderr.
 * Like `npm start` (src/main.ts), SIGTERM is a graceful stop and the
 * postgres.js crash guard is installed, so a bench that signals it or stops
 * its Postgres sees what a deployment would.
 */
import { startSluice } from '../../src/app.ts';
import { loadEnv } from '../../src/config/env.ts';
import { statementCount } from '../../src/db/client.ts';
import { installConnectionCrashGuard } from '../../src/db/guard.ts';
import { createLogger } from '../../src/log.ts';

const env = loadEnv(process.env);
const log = createLogger(env.LOG_LEVEL, 'sluice-bench');
installConnectionCrashGuard(log);
const app = await startSluice(env, log);
const cpuAtReady = process.cpuUsage();
process.send!({ type: 'ready', url: app.url, port: app.port });

let stopping = false;
async function stop(): Promise<void> {
  if (stopping) return;
  stopping = true;
  const cpu = process.cpuUsage(cpuAtReady);
  await app.stop();
  if (process.connected) {
    const sqlStatements = env.SLUICE_COUNT_SQL ? { sqlStatements: statementCount() } : {};
    process.send!({ type: 'stopped', cpuUserMs: cpu.user / 1000, cpuSystemMs: cpu.system / 1000, rssMb: process.memoryUsage().rss / 2 ** 20, ...sqlStatements }, () => process.exit(0));
  } else process.exit(0);
}
process.on('message', (m: { type?: string }) => {
  if (m?.type === 'stop') void stop();
  // Memory after a full collection (the parent forks with --expose-gc), so a before/after difference is not GC timing.
  if (m?.type === 'memory') {
    (globalThis as { gc?: () => void }).gc?.();
    const u = process.memoryUsage();
    process.send!({ type: 'memory', rssMb: u.rss / 2 ** 20, heapUsedMb: u.heapUsed / 2 ** 20, externalMb: (u.external + u.arrayBuffers) / 2 ** 20 });
  }
  // A reading between two points of a run (statements per submission): the count so far.
  if (m?.type === 'stats') process.send!({ type: 'stats', sqlStatements: statementCount() });
});
process.on('disconnect', () => void stop());
process.on('SIGTERM', () => void stop());
