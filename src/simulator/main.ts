/**
 * Standalone simulator: `npm run simulator`. Configuration from SIMULATOR_*
 * environment variables (env.ts); a bad value exits 1 naming the variable.
 */
import { pino } from 'pino';
import { simulatorOptionsFromEnv } from './env.ts';
import { startSimulator } from './server.ts';

const log = pino({ name: 'simulator' });

let options;
try {
  options = simulatorOptionsFromEnv(process.env);
} catch (err) {
  console.error(err instanceof Error ? err.message : String(err));
  process.exit(1);
}

const sim = await startSimulator(options);
const account = sim.account();
log.info(
  {
    url: sim.url,
    adminUrl: sim.adminUrl,
    plan: account.plan,
    apiKey: sim.apiKey,
    subKeys: sim.subKeys,
    credits: account.credits,
    ratePerMinute: sim.conditions().ratePerMinute,
  },
  `APIVerve simulator on ${sim.url} (admin ${sim.adminUrl}); keys: ${[sim.apiKey, ...sim.subKeys].join(', ')}`,
);

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'stopping simulator');
    void sim.stop().then(() => process.exit(0));
  });
}
