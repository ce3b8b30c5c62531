/**
 * `npm start`: runs Sluice with configuration from the environment.
 */
import { ConfigError, loadEnv } from './config/env.ts';
import { startSluice, type SluiceApp } from './app.ts';
import { createLogger } from './log.ts';
import { installConnectionCrashGuard } from './db/guard.ts';

let env;
try {
  env = loadEnv();
} catch (err) {
  if (err instanceof ConfigError) {
    console.error(`sluice: ${err.message}`);
    process.exit(2);
  }
  throw err;
}
const log = createLogger(env.LOG_LEVEL);
installConnectionCrashGuard(log);

/**
 * SIGTERM or SIGINT (Ctrl-C): a graceful stop. Leasing stops, in-flight calls
 * finish and settle (up to SHUTDOWN_GRACE_SECONDS), subscriptions close, the
 * embedded Postgres stops last. A second signal forces the exit at once; what
 * was still in flight is settled by a live node's sweeper (billed at most
 * once, never left reserved). The handlers are in place before start-up: a
 * signal that comes while Sluice starts (migrations, the embedded Postgres, an
 * orchestrator stopping a node it just started) stops it as soon as it has
 * started, instead of killing it with what it started (the embedded Postgres)
 * left running.
 */
let app: SluiceApp | null = null;
let stopping = false;
const stop = (started: SluiceApp) =>
  started.stop().then(
    () => {
      log.info('stopped');
      process.exit(0);
    },
    (err) => {
      log.error({ err }, 'stop failed');
      process.exit(1);
    },
  );
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) {
      log.warn({ signal }, 'second signal: exiting now, without waiting for in-flight calls');
      process.exit(signal === 'SIGINT' ? 130 : 143);
    }
    stopping = true;
    if (!app) {
      log.info({ signal }, 'stopping once start-up is done (send the signal again to exit now)');
      return;
    }
    log.info({ signal, graceSeconds: env.SHUTDOWN_GRACE_SECONDS }, 'stopping: no new work; in-flight calls finish and settle (send the signal again to force)');
    void stop(app);
  });
}

app = await startSluice(env, log).catch((err) => {
  if (err instanceof ConfigError) {
    console.error(`sluice: ${err.message}`);
    process.exit(2);
  }
  log.fatal({ err }, 'start-up failed');
  process.exit(1);
});

if (app.generatedAdminToken) {
  const line = '='.repeat(78);
  process.stdout.write(
    `\n${line}\n  Sluice generated an admin token. It is shown ONCE; only its hash is stored.\n\n` +
      `    ${app.generatedAdminToken}\n\n` +
      `  Open ${app.url ?? 'the API'} and send the header\n    Authorization: Bearer <admin token>\n` +
      `  to create tenants (createTenant). Set SLUICE_ADMIN_TOKEN to choose your own.\n${line}\n\n`,
  );
}
if (stopping) {
  log.info({ graceSeconds: env.SHUTDOWN_GRACE_SECONDS }, 'started; stopping now, as asked during start-up');
  void stop(app);
}
