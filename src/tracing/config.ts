/**
 * Whether this process traces, and how it samples: read from the standard OpenTelemetry
 * variables, pure (the SDK wiring is in tracer.ts).
 *
 * Tracing is off unless an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): a deployment that never heard of OpenTelemetry pays one
 * boolean check per job and nothing else. OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none
 * turn it off even with an endpoint, as the specification says.
 */

export type SamplerKind = 'always_on' | 'always_off' | 'traceidratio' | 'parentbased_always_on' | 'parentbased_always_off' | 'parentbased_traceidratio';

export const SAMPLERS: readonly SamplerKind[] = ['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio'];

export interface SamplerConfig {
  kind: SamplerKind;
  /** The ratio of root traces kept (traceidratio kinds); 1 for the others. */
  ratio: number;
}

export type TracingConfig =
  | { enabled: false; reason: string }
  | {
      enabled: true;
      /** Where spans go: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, or OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces. */
      endpoint: string;
      serviceName: string;
      sampler: SamplerConfig;
    };

/**
 * The sampler named by OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG. Default
 * parentbased_always_on (the SDK's default). An unknown name or a ratio outside [0, 1] throws,
 * naming the variable, so a typo does not silently trace everything (or nothing).
 */
export function parseSampler(name: string | undefined, arg: string | undefined): SamplerConfig {
  const kind = (name?.trim() || 'parentbased_always_on').toLowerCase() as SamplerKind;
  if (!SAMPLERS.includes(kind)) throw new Error(`OTEL_TRACES_SAMPLER: unknown sampler "${name}" (one of ${SAMPLERS.join(', ')})`);
  if (!kind.endsWith('traceidratio')) return { kind, ratio: kind.endsWith('always_off') ? 0 : 1 };
  if (arg === undefined || arg.trim() === '') return { kind, ratio: 1 };
  const ratio = Number(arg);
  if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1) throw new Error(`OTEL_TRACES_SAMPLER_ARG: "${arg}" is not a ratio between 0 and 1`);
  return { kind, ratio };
}

const truthy = (v: string | undefined) => v !== undefined && ['true', '1', 'yes'].includes(v.trim().toLowerCase());

/** This process's tracing configuration from its environment. Pure. */
export function tracingConfig(env: Record<string, string | undefined>): TracingConfig {
  const traces = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim();
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim();
  const endpoint = traces || (base ? `${base.replace(/\/+$/, '')}/v1/traces` : '');
  if (!endpoint) return { enabled: false, reason: 'no OTEL_EXPORTER_OTLP_ENDPOINT' };
  if (truthy(env.OTEL_SDK_DISABLED)) return { enabled: false, reason: 'OTEL_SDK_DISABLED' };
  const exporters = (env.OTEL_TRACES_EXPORTER ?? 'otlp').split(',').map((s) => s.trim().toLowerCase());
  if (exporters.includes('none')) return { enabled: false, reason: 'OTEL_TRACES_EXPORTER=none' };
  const protocol = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL || env.OTEL_EXPORTER_OTLP_PROTOCOL || 'http/json').trim();
  // The bundled exporter speaks OTLP over HTTP with JSON bodies; a collector accepts it on the same
  // port as protobuf. gRPC needs another exporter: refuse rather than send to a port that cannot read it.
  if (protocol === 'grpc') throw new Error('OTEL_EXPORTER_OTLP_PROTOCOL: grpc is not supported; Sluice exports OTLP over HTTP (http/json): point it at the collector\'s HTTP port (4318)');
  return { enabled: true, endpoint, serviceName: env.OTEL_SERVICE_NAME?.trim() || 'sluice', sampler: parseSampler(env.OTEL_TRACES_SAMPLER, env.OTEL_TRACES_SAMPLER_ARG) };
}

/**
 * A traced root span that links to other traces (a batch call carrying several jobs) is kept
 * when any of them was kept, whatever the ratio: otherwise at 10 % sampling the call that served
 * a sampled job would be missing from its trace nine times in ten. Only for root spans; a child
 * follows its parent. Pure: `linked` are the links' sampled flags.
 */
export function keepForLinks(isRoot: boolean, linked: readonly boolean[]): boolean {
  return isRoot && linked.some(Boolean);
}
