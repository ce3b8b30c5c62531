/**
 * What a /metrics scrape reads from the database: the classes' depths and oldest ages, the
 * windows' tokens and pools, the breakers, the active alerts, the fairness lag, and per-tenant
 * queues when METRICS_TENANT_LABELS is on. The same reads as the console's system status
 * (visibility/status.ts), shaped for metrics.ts.
 */
import type { Services } from './graphql/context.ts';
import { tokensAt } from './scheduler/pacer.ts';
import { tenantDepths } from './scheduler/sql/queues.ts';
import { systemStatus } from './visibility/status.ts';

export async function metricsSnapshot(services: Services, tenantLabels: boolean) {
  const status = await systemStatus(services);
  const tenantRows = tenantLabels ? await tenantDepths(services.sql) : [];
  return {
    queues: status.classes.map((c) => ({ class: c.priority, depth: c.depth, oldestAgeSeconds: c.oldestAgeSeconds })),
    windows: status.windows.map((w) => ({
      window: w.name,
      tokens: w.ratePerMinute === null ? null : tokensAt(w, w.dbNow),
      poolSize: w.poolSize,
      busy: w.inFlight,
      ratePerMinute: w.ratePerMinute,
      configuredRatePerMinute: w.configuredRatePerMinute,
    })),
    breakers: status.breakers.map((b) => ({ api: b.api, state: b.state === 'OPEN' ? ('open' as const) : b.state === 'HALF_OPEN' ? ('half-open' as const) : ('closed' as const) })),
    alerts: status.alerts.map((a) => ({ alert: a.key.split(':')[0]!, active: true })),
    ...(tenantLabels ? { tenantQueues: tenantRows } : {}),
    fairness: {
      worst: status.fairness.worst,
      tenants: status.fairness.tenants.map((t) => ({ tenant: t.tenantId, lag: t.lag, bound: t.bound })),
    },
  };
}
