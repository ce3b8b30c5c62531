/**
 * `npm start`: runs Sluice with configuration from the environment.
 */
import { ConfigError, loadEnv } from './config/env.ts';
import { startSluice } from './app.ts';
import { createLogger } from './log.ts';

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

const app = await startSluice(env, log).catch((err) => {
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

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) process.exit(1);
    stopping = true;
    log.info({ signal }, 'stopping');
    app.stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  });
}
