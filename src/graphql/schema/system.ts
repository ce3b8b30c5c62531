import type { AlertRow } from '../../alerts/store.ts';
import { resumeDispatch, type AccountRow } from '../../scheduler/sql/account.ts';
import { type WindowRow } from '../../scheduler/sql/windows.ts';
import { changes, systemStatus, type SystemStatus } from '../../visibility/status.ts';
import { PriorityEnum } from './jobs.ts';
import { tokensAt } from '../../scheduler/pacer.ts';
import { builder, role } from '../builder.ts';
import { HEALTH_STATUSES, paceUsed, systemHealth, type Health } from '../../visibility/health.ts';
import { HISTORY_RANGES, HISTORY_SAMPLE_MS, type HistoryPoint } from '../../visibility/history.ts';

const WindowRef = builder.objectRef<WindowRow & { callsPerSecond?: number }>('Window').implement({
  description: 'One upstream rate window (key) and its pacer, shared by every node.',
  fields: (t) => ({
    name: t.exposeString('name'),
    ratePerMinute: t.float({
      nullable: true,
      description: 'The paced rate in use now, as learned from the provider (at most configuredRatePerMinute); null = unlimited.',
      resolve: (w) => w.ratePerMinute,
    }),
    configuredRatePerMinute: t.float({ nullable: true, description: 'The paced rate from configuration (limit × PACE_FRACTION); null = unlimited.', resolve: (w) => w.configuredRatePerMinute }),
    observedLimitPerMinute: t.float({ nullable: true, description: "The provider's stated window (x-rate-limit-limit) as last learned from; null = none seen.", resolve: (w) => w.observedLimitPerMinute }),
    paceReason: t.string({ nullable: true, description: 'Why the rate last changed: START (a slow start: doubling while answers confirm the room), PROBE (one call at the floor after a pause the provider asked beyond RETRY_AFTER_MAX_SECONDS), LIMIT (a smaller stated window), DRAIN (others spend on the key), RATE_LIMITED (a 429), CLIMB (answers allow more); null = as configured.', resolve: (w) => w.paceReason }),
    pacedAt: t.field({ type: 'DateTime', nullable: true, description: 'When the rate last changed.', resolve: (w) => (w.pacedAt === null ? null : new Date(w.pacedAt)) }),
    burst: t.float({ description: 'The bucket size now (the configured burst scaled with the learned rate).', resolve: (w) => w.burst }),
    tokens: t.float({ nullable: true, description: 'Tokens in the bucket now; null for an unlimited window.', resolve: (w) => (w.ratePerMinute === null ? null : Math.round(tokensAt(w, w.dbNow) * 1000) / 1000) }),
    pausedUntil: t.field({ type: 'DateTime', nullable: true, resolve: (w) => (w.pausedUntil && w.pausedUntil > w.dbNow ? new Date(w.pausedUntil) : null) }),
    pauseReason: t.string({ nullable: true, resolve: (w) => (w.pausedUntil && w.pausedUntil > w.dbNow ? w.pauseReason : null) }),
    poolSize: t.int({ description: "ceil(paced rate × p95 of how long a call holds its slot: lease to settlement commit), within the window's concurrency limit (as last published by a worker).", resolve: (w) => w.poolSize }),
    busy: t.int({ description: 'Calls in flight on this window across all nodes.', resolve: (w) => w.inFlight }),
    latencyP50Ms: t.float({ nullable: true, resolve: (w) => w.latencyP50Ms }),
    latencyP95Ms: t.float({ nullable: true, resolve: (w) => w.latencyP95Ms }),
    slotHoldP95Ms: t.float({
      nullable: true,
      description: "p95 of how long a call held its pool slot, from its lease through the call to its settlement's commit (as last published by a worker): the time poolSize is sized by. Far above latencyP95Ms, the database's commits are slow.",
      resolve: (w) => w.slotHoldP95Ms,
    }),
    callsPerSecond: t.float({ description: 'Calls sent on this window over the last 10 seconds, per second (one per batch item, as the pacer counts).', resolve: (w) => w.callsPerSecond ?? 0 }),
    paceUsed: t.float({
      nullable: true,
      description: 'callsPerSecond ÷ the paced rate per second (0.5 = half the pace used); null for an unlimited window.',
      resolve: (w) => paceUsed({ ratePerMinute: w.ratePerMinute, callsPerSecond: w.callsPerSecond ?? 0 }),
    }),
    limitPerMinute: t.float({
      nullable: true,
      description: "The key's configured limit upstream (calls/min; the paced rate is this × PACE_FRACTION); null = no per-minute ceiling.",
      resolve: (w, _a, ctx) => ctx.services.windows.find((s) => s.name === w.name)?.limitPerMinute ?? null,
    }),
  }),
});

const HealthStatusEnum = builder.enumType('HealthStatus', {
  values: {
    HEALTHY: { description: 'Every window open, no breaker open, no active alert.' },
    DEGRADED: { description: 'Part of the work is held back or needs a look: a paused window, a breaker not closed, an active alert.' },
    STOPPED: { description: 'Nothing is dispatched: the account is out of credits, or every window is paused.' },
  } satisfies Record<(typeof HEALTH_STATUSES)[number], unknown>,
});

const HealthRef = builder.objectRef<Health>('Health').implement({
  description: 'One verdict of the system, with the reasons.',
  fields: (t) => ({
    status: t.field({ type: HealthStatusEnum, resolve: (h) => h.status }),
    reasons: t.exposeStringList('reasons', { description: 'Why, most fundamental first (for HEALTHY, what was checked).' }),
  }),
});

const HistoryRangeEnum = builder.enumType('HistoryRange', { values: Object.keys(HISTORY_RANGES) as Array<keyof typeof HISTORY_RANGES> });

const HistoryPointRef = builder.objectRef<HistoryPoint>('HistoryPoint').implement({
  fields: (t) => ({
    at: t.field({ type: 'DateTime', resolve: (p) => new Date(p.at) }),
    callsPerSecond: t.exposeFloat('callsPerSecond'),
    pacedPerSecond: t.float({ nullable: true, description: 'The paced rate per second; null = unlimited.', resolve: (p) => p.pacedPerSecond }),
    busy: t.exposeInt('busy', { description: 'Calls in flight (the peak, when points are averaged).' }),
    poolSize: t.exposeInt('poolSize'),
  }),
});

const WindowHistoryRef = builder.objectRef<{ window: string; points: HistoryPoint[] }>('WindowHistory').implement({
  fields: (t) => ({
    window: t.exposeString('window'),
    points: t.field({ type: [HistoryPointRef], description: 'Oldest first; at most 360 (longer ranges are averaged).', resolve: (h) => h.points }),
  }),
});

const AccountRef = builder.objectRef<AccountRow>('Account').implement({
  description: 'The upstream account, as its newest response headers and the dispatch state say.',
  fields: (t) => ({
    creditsRemaining: t.float({ nullable: true, description: 'x-api-remaining-credits (may be negative).', resolve: (a) => a.creditsRemaining }),
    maxCredits: t.float({ nullable: true, resolve: (a) => a.maxCredits }),
    renewalAt: t.field({ type: 'DateTime', nullable: true, resolve: (a) => a.renewalAt }),
    statusAt: t.field({ type: 'DateTime', nullable: true, description: 'When these figures were seen.', resolve: (a) => a.statusAt }),
    dispatchStoppedUntil: t.field({ type: 'DateTime', nullable: true, description: 'All dispatch is stopped until then (credits exhausted).', resolve: (a) => a.dispatchStoppedUntil }),
    stopReason: t.string({ nullable: true, resolve: (a) => a.stopReason }),
  }),
});

const BreakerRef = builder.objectRef<SystemStatus['breakers'][number]>('Breaker').implement({
  fields: (t) => ({
    api: t.exposeString('api'),
    state: t.exposeString('state', { description: 'CLOSED, OPEN or HALF_OPEN.' }),
    openedAt: t.field({ type: 'DateTime', nullable: true, resolve: (b) => b.openedAt }),
    retryAt: t.field({ type: 'DateTime', nullable: true, description: 'When a half-open probe may go.', resolve: (b) => b.retryAt }),
  }),
});

const AlertRef = builder.objectRef<AlertRow>('Alert').implement({
  fields: (t) => ({
    key: t.exposeString('key', { description: 'e.g. AGE_PROMISE:BULK, CREDITS_EXHAUSTED, KEY_UNUSABLE:sub1, BREAKER_OPEN:dnslookup' }),
    severity: t.exposeString('severity', { description: 'page or warning.' }),
    message: t.exposeString('message'),
    raisedAt: t.field({ type: 'DateTime', resolve: (a) => a.raisedAt }),
  }),
});

const ClassTotalRef = builder.objectRef<SystemStatus['classes'][number]>('ClassStatus').implement({
  description: 'One class across all tenants.',
  fields: (t) => ({
    priority: t.field({ type: PriorityEnum, resolve: (c) => c.priority }),
    depth: t.exposeInt('depth'),
    running: t.exposeInt('running'),
    oldestAgeSeconds: t.float({ nullable: true, resolve: (c) => c.oldestAgeSeconds }),
    agePromiseSeconds: t.float({ nullable: true, description: 'How old the oldest job may grow before AGE_PROMISE alerts (CLASS_AGE_PROMISE_SECONDS).', resolve: (c, _a, ctx) => ctx.services.agePromiseSeconds?.[c.priority] ?? null }),
  }),
});

const FairnessLagRef = builder.objectRef<SystemStatus['fairness']['tenants'][number]>('FairnessLag').implement({
  description: "A backlogged tenant's worst lag against another backlogged tenant, and that pair's bound.",
  fields: (t) => ({
    tenantId: t.exposeID('tenantId'),
    lag: t.exposeFloat('lag', { description: '|ΔW_i/w_i − ΔW_j/w_j|, the worst over every interval of the span (jobs per unit of weight).' }),
    bound: t.exposeFloat('bound', { description: "1/w_i + 1/w_j + P/W (P: most jobs one lease handed out; W: the pair's weight)." }),
  }),
});

const FairnessPairRef = builder.objectRef<NonNullable<SystemStatus['fairness']['worst']>>('FairnessPair').implement({
  fields: (t) => ({
    tenantA: t.exposeID('tenantA'),
    tenantB: t.exposeID('tenantB'),
    lag: t.exposeFloat('lag'),
    bound: t.exposeFloat('bound'),
  }),
});

const FairnessRef = builder.objectRef<SystemStatus['fairness']>('Fairness').implement({
  description:
    "Start-time fair queueing's bound, measured over the recent leases (the last 30 s, at most 3,000 jobs): for two tenants backlogged together, the normalised service difference over any interval should stay within the bound. Tenants with work waiting now count as backlogged from their first lease in the span.",
  fields: (t) => ({
    seconds: t.exposeFloat('seconds', { description: 'The span measured.' }),
    worst: t.field({ type: FairnessPairRef, nullable: true, description: 'The pair with the largest lag / bound.', resolve: (f) => f.worst }),
    tenants: t.field({ type: [FairnessLagRef], resolve: (f) => f.tenants }),
  }),
});

const SystemRef = builder.objectRef<SystemStatus>('System').implement({
  description: 'The shared machinery (admin).',
  fields: (t) => ({
    windows: t.field({ type: [WindowRef], resolve: (s) => s.windows }),
    account: t.field({ type: AccountRef, resolve: (s) => s.account }),
    breakers: t.field({ type: [BreakerRef], resolve: (s) => s.breakers }),
    alerts: t.field({ type: [AlertRef], description: 'Active alerts.', resolve: (s) => s.alerts }),
    classes: t.field({ type: [ClassTotalRef], resolve: (s) => s.classes }),
    estimatedDrainSeconds: t.float({ nullable: true, description: 'All waiting work ÷ the whole pace.', resolve: (s) => s.estimatedDrainSeconds }),
    fairness: t.field({ type: FairnessRef, resolve: (s) => s.fairness }),
    health: t.field({ type: HealthRef, description: 'HEALTHY, DEGRADED or STOPPED, with the reasons.', resolve: (s) => systemHealth(s) }),
  }),
});

builder.queryFields((t) => ({
  system: t.field({ ...role('admin'), type: SystemRef, resolve: (_r, _a, ctx) => systemStatus(ctx.services) }),
  systemHistory: t.field({
    ...role('admin'),
    type: [WindowHistoryRef],
    description: `Each window's calls, pace, in-flight and pool over a range, sampled every ${HISTORY_SAMPLE_MS / 1000} s by the node that answers and kept in its memory for 24 h (empty after that node restarts).`,
    args: { range: t.arg({ type: HistoryRangeEnum, defaultValue: 'MINUTES_15' }) },
    resolve: (_r, { range }, ctx) => ctx.services.history?.read(range ?? 'MINUTES_15') ?? [],
  }),
}));

builder.mutationFields((t) => ({
  resumeDispatch: t.field({
    ...role('admin'),
    type: SystemRef,
    description: 'Resumes dispatch stopped by credits exhaustion, and windows stopped for an unusable key (all, or the one named) once the key is fixed.',
    args: { window: t.arg.string() },
    resolve: async (_r, args, ctx) => {
      await resumeDispatch(ctx.services.sql, args.window ?? null);
      return systemStatus(ctx.services);
    },
  }),
}));

builder.subscriptionFields((t) => ({
  systemStatus: t.field({
    ...role('admin'),
    type: SystemRef,
    description: 'The system view, pushed when it changes, at most once a second.',
    subscribe: (_r, _a, ctx) => changes(() => systemStatus(ctx.services)),
    resolve: (s) => s,
  }),
}));
