/**
 * The upstream account a process calls: the real one (APIVERVE_API_KEY and its sub-keys), or,
 * with no key, the bundled simulator started in this process (demo mode) with the same plan,
 * rate, pool and sub-keys, so everything downstream runs as it would against APIVerve.
 */
import type { ApiCatalog } from './config/apis.ts';
import type { Env } from './config/env.ts';
import { startSimulator, type Simulator, type SimulatorOptions } from './simulator/index.ts';
import { simulatorOptionsFromEnv } from './simulator/env.ts';

export interface Upstream {
  /** The demo-mode simulator (the caller stops it); null against the real account. */
  simulator: Simulator | null;
  primaryKey: string;
  subKeys: readonly string[];
  baseUrl: string;
}

export async function resolveUpstream(env: Env, catalog: ApiCatalog, simulatorOverrides: Partial<SimulatorOptions> = {}): Promise<Upstream> {
  if (env.APIVERVE_API_KEY) return { simulator: null, primaryKey: env.APIVERVE_API_KEY, subKeys: env.APIVERVE_SUB_KEYS, baseUrl: env.APIVERVE_BASE_URL };
  const fromEnv = simulatorOptionsFromEnv(process.env);
  const demoSubKeys = env.APIVERVE_SUB_KEYS.length > 0 ? env.APIVERVE_SUB_KEYS : (fromEnv.subKeys ?? []).map((k) => (typeof k === 'string' ? k : k.key));
  const simulator = await startSimulator({
    ...fromEnv,
    port: 0,
    catalog,
    plan: env.APIVERVE_PLAN,
    ...(env.APIVERVE_RATE_PER_MINUTE !== undefined ? { ratePerMinute: env.APIVERVE_RATE_PER_MINUTE } : {}),
    ...(env.APIVERVE_CONCURRENT_CALLS !== undefined ? { concurrentCalls: env.APIVERVE_CONCURRENT_CALLS } : {}),
    subKeys: demoSubKeys,
    ...simulatorOverrides,
  });
  return { simulator, primaryKey: simulator.apiKey, subKeys: simulator.subKeys, baseUrl: simulator.url };
}
