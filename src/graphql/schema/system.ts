import { readWindows, type WindowRow } from '../../scheduler/store.ts';
import { tokensAt } from '../../scheduler/pacer.ts';
import { builder, role } from '../builder.ts';

const WindowRef = builder.objectRef<WindowRow>('Window').implement({
  description: 'One upstream rate window (key) and its pacer, shared by every node.',
  fields: (t) => ({
    name: t.exposeString('name'),
    ratePerMinute: t.float({ nullable: true, description: 'The paced rate (limit × PACE_FRACTION); null = unlimited.', resolve: (w) => w.ratePerMinute }),
    burst: t.float({ resolve: (w) => w.burst }),
    tokens: t.float({ nullable: true, description: 'Tokens in the bucket now; null for an unlimited window.', resolve: (w) => (w.ratePerMinute === null ? null : Math.round(tokensAt(w, w.dbNow) * 1000) / 1000) }),
    pausedUntil: t.field({ type: 'DateTime', nullable: true, resolve: (w) => (w.pausedUntil && w.pausedUntil > w.dbNow ? new Date(w.pausedUntil) : null) }),
    pauseReason: t.string({ nullable: true, resolve: (w) => (w.pausedUntil && w.pausedUntil > w.dbNow ? w.pauseReason : null) }),
    poolSize: t.int({ description: "ceil(paced rate × p95 latency), within the window's concurrency limit (as last published by a worker).", resolve: (w) => w.poolSize }),
    busy: t.int({ description: 'Calls in flight on this window across all nodes.', resolve: (w) => w.inFlight }),
    latencyP50Ms: t.float({ nullable: true, resolve: (w) => w.latencyP50Ms }),
    latencyP95Ms: t.float({ nullable: true, resolve: (w) => w.latencyP95Ms }),
  }),
});

const SystemRef = builder.objectRef<Record<string, never>>('System').implement({
  description: 'The shared machinery (admin).',
  fields: (t) => ({
    windows: t.field({ type: [WindowRef], resolve: (_s, _a, ctx) => readWindows(ctx.services.sql) }),
  }),
});

builder.queryFields((t) => ({
  system: t.field({ ...role('admin'), type: SystemRef, resolve: () => ({}) }),
}));
