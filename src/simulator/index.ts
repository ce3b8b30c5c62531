/**
 * The APIVerve provider simulator: a real HTTP server faithful to
 * /work/shared/PROVIDER.md (see docs/PROVIDER-SIMULATOR.md), used in-process
 * by tests and the app's demo mode, and standalone via `npm run simulator`.
 *
 *   const sim = await startSimulator({ ratePerMinute: 600, cooldownSeconds: 1 });
 *   const client = createProviderClient({ baseUrl: sim.url, timeoutMs: 2000, catalog: sim.catalog });
 *   await client.call({ api: 'exchangerate', params: { currency1: 'USD', currency2: 'EUR' }, apiKey: sim.apiKey });
 *   await sim.stop();
 */
export { startSimulator, type Simulator } from './server.ts';
export {
  createEngine,
  billedInputKey,
  SimulatorConfigError,
  type Engine,
  type Reply,
  type Slot,
  type SimulatorStats,
  type CallRecord,
  type CallLogPage,
  type KeyStats,
  type AccountStats,
  type AccountInfo,
  type KeyInfo,
} from './engine.ts';
export {
  initialConditions,
  applyConditionsPatch,
  faultsFor,
  conditionsPatchSchema,
  DEFAULT_API_KEY,
  DEFAULT_COOLDOWN_SECONDS,
  DEFAULT_HUGE_BYTES,
  BAD_ANSWER_KINDS,
  type BadAnswerKind,
  type BadAnswerSpec,
  type SimulatorOptions,
  type Conditions,
  type ConditionsPatch,
  type FaultSpec,
  type HangSpec,
  type ConcurrencyLimitResponse,
  type SubKeySpec,
} from './options.ts';
export { INVALID_UTF8, HTML_PAGE } from './bad-answers.ts';
export { simulatorOptionsFromEnv, ENV_DEFAULTS, SIMULATOR_ENV_VARS } from './env.ts';
export { sampleLatencies, sampleLatencyMs, mulberry32, deriveSeed } from './random.ts';
export { defaultBurst } from './limits.ts';
