/**
 * All configuration comes from the environment and is validated once at start.
 * A bad value stops start-up with a message naming the variable, so a typo in a
 * deployment fails loudly instead of running with a silent default.
 */
import { z } from 'zod';
import { PLAN_NAMES } from './plans.ts';
import { parseClassNumbers } from './classes.ts';
import { parseTrustProxy } from '../http/client-address.ts';

const int = (def: number, min = 0) => z.coerce.number().int().min(min).default(def);
const bool = (def: boolean) =>
  z
    .enum(['true', 'false', '1', '0', 'yes', 'no'])
    .default(def ? 'true' : 'false')
    .transform((v) => v === 'true' || v === '1' || v === 'yes');
const optionalString = z
  .string()
  .optional()
  .transform((v) => (v === undefined || v.trim() === '' ? undefined : v.trim()));
/** `CLASS=number,…`, checked at start so a typo names its variable. */
const classNumbers = (def: string) =>
  z
    .string()
    .default(def)
    .superRefine((v, ctx) => {
      try {
        parseClassNumbers(v);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
      }
    });
const list = z
  .string()
  .default('')
  .transform((v) => v.split(',').map((s) => s.trim()).filter(Boolean));

export const envSchema = z.object({
  /** Production unless set: only NODE_ENV=development shows stack traces and error details to clients. */
  NODE_ENV: z.enum(['development', 'production', 'test']).default('production'),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  HOST: z.string().default('0.0.0.0'),
  PORT: int(4000),
  /** Which parts this process runs: the GraphQL API, the dispatcher, or both. */
  SLUICE_ROLE: z.enum(['all', 'api', 'worker']).default('all'),
  /** Any Postgres 13+. Unset: an embedded Postgres under SLUICE_DATA_DIR. */
  DATABASE_URL: optionalString,
  /**
   * Postgres itself, for what needs a session (LISTEN, migrations, session advisory locks) when
   * DATABASE_URL points at a pooler in transaction mode (PgBouncer). Unset: DATABASE_URL.
   */
  DATABASE_DIRECT_URL: optionalString,
  /**
   * What sits in front of Postgres at DATABASE_URL: `pgbouncer` (any transaction-mode pooler: no
   * startup parameters, no prepared statements) or `none`. Unset: `pgbouncer` when
   * DATABASE_DIRECT_URL is set and differs from DATABASE_URL, else `none`.
   */
  DATABASE_POOLER: z.enum(['none', 'pgbouncer']).optional(),
  SLUICE_DATA_DIR: z.string().default('.data'),
  /** Admin bearer token, at least 32 characters (a guessable one is refused at start). Unset: one is generated on first start and stored. */
  SLUICE_ADMIN_TOKEN: optionalString.refine((v) => v === undefined || v.length >= 32, {
    message: 'is shorter than 32 characters: choose a long random token (e.g. `openssl rand -hex 24`), or unset it and Sluice generates one',
  }),

  /** Upstream account. Unset key: demo mode with the in-process simulator. */
  APIVERVE_API_KEY: optionalString,
  APIVERVE_SUB_KEYS: list,
  APIVERVE_BASE_URL: z.url().default('https://api.apiverve.com/v1'),
  APIVERVE_PLAN: z.enum(PLAN_NAMES).default('PRO'),
  /** Overrides the plan's per-minute limit (e.g. a key limited below its plan). */
  APIVERVE_RATE_PER_MINUTE: z.coerce.number().int().min(1).optional(),
  /** Cost overrides, `api=credits,api=credits`; the catalog in src/config/apis.ts is the default. */
  API_COSTS: z.string().default(''),
  PROVIDER_TIMEOUT_MS: int(10_000, 100),
  /**
   * A kept-alive connection to the upstream unused this long is closed by Sluice. Below the idle
   * timeout of whatever sits in front of the provider (a request written on a connection it is
   * closing is reset unread, yet billed as a guess); a shorter `Keep-Alive: timeout` hint still wins.
   */
  PROVIDER_IDLE_SOCKET_TIMEOUT_MS: int(4_000, 100),
  /** A timed-out call may have been billed: `billed` charges it (safe for the account), `refunded` does not. */
  TIMEOUT_BILLING: z.enum(['billed', 'refunded']).default('billed'),
  /**
   * Most bytes of one upstream answer read (a batch: this much per item). A
   * 200 over it is not read further and its job fails UPSTREAM_BAD_RESPONSE,
   * billed. 1 MiB is a hundred times the largest catalog answer.
   */
  MAX_RESULT_BYTES: int(1024 * 1024, 1024),

  /** Submission limits. */
  MAX_JOBS_PER_SUBMISSION: int(10_000, 1),
  MAX_BODY_BYTES: int(16 * 1024 * 1024, 1024),
  /** One job's params: at most this many keys, and at most this many bytes as JSON. */
  MAX_PARAM_KEYS: int(50, 1),
  MAX_PARAMS_BYTES: int(16 * 1024, 64),

  /** On SIGTERM/SIGINT: how long in-flight upstream calls may take to finish and settle before the process stops anyway. */
  SHUTDOWN_GRACE_SECONDS: int(30, 0),
  /**
   * Backstop: a request still unanswered after this long gets 503 DATABASE_UNAVAILABLE (a submission
   * then is not stored). With Postgres down requests fail at once (refused) or after the connect
   * timeout, min(5 s, this); legitimate work (10,000 jobs on a busy machine) must fit well within it.
   */
  REQUEST_TIMEOUT_MS: int(30_000, 100),

  /** Retries of retryable failures (server errors, timeouts), with exponential backoff. */
  JOB_RETRY_LIMIT: int(3),
  JOB_RETRY_DELAY_SECONDS: int(1),

  /** The account's concurrent-call limit, when it differs from the plan's. */
  APIVERVE_CONCURRENT_CALLS: z.coerce.number().int().min(1).optional(),

  /** Pacer: the share of each window's limit Sluice uses, and the bucket size (default max(1, limit × PACE_FRACTION / 20): three seconds at the paced rate). */
  PACE_FRACTION: z.coerce.number().gt(0).max(1).default(0.9),
  PACER_BURST: z.coerce.number().int().min(1).optional(),
  /**
   * The learned pace (scheduler/learned-pace.ts): the shared rate follows the provider's answers,
   * lowered to the stated window × PACE_FRACTION (or what others on the key leave), × PACE_DECREASE
   * on a rate-limit 429, never below PACE_MIN of the configured rate, and climbing back by
   * PACE_STEP of it every PACE_STEP_MS, never above it. Each node folds its answers every PACE_SAMPLE_MS.
   * A window starts slowly (a first start, a changed configuration, a start after a minute without
   * a lease): at PACE_START of the configured rate, doubling each sample while answers confirm the
   * room (1 = no slow start).
   */
  PACE_LEARN: bool(true),
  PACE_SAMPLE_MS: int(1_000, 50),
  PACE_STEP: z.coerce.number().gt(0).max(1).default(0.05),
  PACE_STEP_MS: int(2_000, 0),
  PACE_DECREASE: z.coerce.number().gt(0).max(1).default(0.5),
  PACE_MIN: z.coerce.number().gt(0).max(1).default(0.05),
  PACE_START: z.coerce.number().gt(0).max(1).default(0.25),
  /** Class-to-window map, e.g. `INTERACTIVE=sub1,BULK=sub2`; default: INTERACTIVE on sub1 when a sub-key exists. */
  CLASS_WINDOWS: z.string().default(''),
  /** Starvation guard: a lower class waiting longer than this is served anyway (`STANDARD=30,BULK=120`). */
  CLASS_MAX_WAIT_SECONDS: classNumbers('STANDARD=30,BULK=120'),

  /** Pools: ceil(paced rate × p95 time a call holds its slot) per window, at most this (and the plan's concurrent calls). */
  POOL_MAX: int(1_024, 1),
  /** Latency assumed before any call was measured. */
  INITIAL_LATENCY_MS: int(1_000, 1),
  /** Most jobs one dispatch decision takes from one queue. */
  LEASE_MAX: int(8, 1),
  /** Decision loops per window per worker process (leases of different tenants in parallel). */
  DISPATCH_LOOPS: int(4, 1),
  /** A batch turn takes at most this many items per unit of the tenant's weight (deficit round robin). */
  BATCH_QUANTUM: int(20, 1),
  /** Most jobs one decision takes when the queue's head API batches (one batch call; 1 = never batch). */
  BATCH_MAX: int(200, 1),
  /** APIs never batched, comma-separated (the catalog says which batch otherwise). */
  BATCH_DISABLED_APIS: z.string().default(''),
  /** How often an idle dispatcher looks for work (new work also wakes it at once). */
  DISPATCH_IDLE_POLL_MS: int(1_000, 10),
  /** A worker node that has not heartbeated for this long is dead: its reservations and slots are released. */
  NODE_TIMEOUT_SECONDS: int(10, 1),
  SWEEP_INTERVAL_MS: int(1_000, 50),
  /**
   * The attempt lease, the one liveness authority: an attempt whose node has not refreshed it for
   * this long is settled by the sweeper (timeout rule) and its job queued again. Default: NODE_TIMEOUT_SECONDS.
   */
  ATTEMPT_LEASE_SECONDS: z.coerce.number().int().min(1).optional(),
  /** Settlements are grouped: one transaction per this interval per worker process. */
  SETTLE_INTERVAL_MS: int(2, 0),
  /**
   * Connections this process may open: its SQL pool; drizzle's pool gets a quarter and pg-boss's a
   * half on top, so one process holds at most 1.75x this (35 by default). Size it so that every
   * process of the deployment fits under Postgres's max_connections (docs/SCALING.md).
   */
  DB_POOL_MAX: int(20, 2),
  /** Postgres session timeouts for Sluice's pools (0 = off): a frozen node cannot hold a hot row for long. */
  DB_LOCK_TIMEOUT_MS: int(30_000, 0),
  DB_STATEMENT_TIMEOUT_MS: int(120_000, 0),
  DB_IDLE_IN_TRANSACTION_TIMEOUT_MS: int(15_000, 0),
  /** pg-boss's maintenance (expiry, retention, queue stats) runs on one process at a time, this often. */
  BOSS_SUPERVISE_INTERVAL_SECONDS: int(15, 1),
  /** Queues each maintenance pass supervises (name order, wrapping): bounds a pass whatever the tenant count. */
  BOSS_MAINTENANCE_PAGE: int(1000, 1),
  /** Diagnostics (benchmarks): count the SQL statements this process's pools send. Costs a stack capture per statement. */
  SLUICE_COUNT_SQL: bool(false),
  /** How often the sweeper looks for waiting jobs whose pg-boss job is gone (and puts them back). */
  RECONCILE_INTERVAL_SECONDS: int(60, 1),

  /**
   * Tenant API keys are cached per process this long (0 = no cache). A rotation, suspension,
   * resumption, limit change or deletion reaches every process at once through NOTIFY sluice_auth;
   * the TTL only bounds what a lost notice could leave behind. Unknown keys: AUTH_NEGATIVE_CACHE_MS.
   */
  AUTH_CACHE_TTL_MS: int(5_000, 0),
  /** How far ahead a job's runAt may be (JobInput.runAt); further is refused with BAD_RUN_AT. */
  JOB_RUN_AT_MAX_SECONDS: int(30 * 24 * 3600, 1),
  /** rotateTenantKey leaves the tenant's old keys working this long (0: they stop at once). */
  KEY_ROTATION_OVERLAP_SECONDS: int(86_400, 0),
  /** Admission: the bound on waiting jobs across all tenants, and the share of it each class may fill. */
  GLOBAL_QUEUE_BOUND: int(1_000_000, 1),
  CLASS_SHARES: classNumbers('BULK=0.7,STANDARD=0.9,INTERACTIVE=1'),
  /**
   * A submitJobs of at least BULK_RESERVE_MIN jobs (keyed or not) is admitted under the gate into a reservation,
   * then written outside it; a reservation whose jobs never came (a crash) is reclaimed after this long.
   */
  BULK_RESERVE_MIN: int(500, 1),
  ADMISSION_RESERVATION_SECONDS: int(30, 1),
  /** Group commit: concurrent single submissions share one transaction, gathered for at most this long... */
  GROUP_COMMIT_MS: int(2, 0),
  /** ...or until this many are waiting (1 = no group commit). */
  GROUP_COMMIT_MAX: int(200, 1),
  /** Age promises: an alert is raised when a class's oldest job is older than this. */
  CLASS_AGE_PROMISE_SECONDS: classNumbers('INTERACTIVE=10,STANDARD=300,BULK=14400'),
  /** Alerts are POSTed here (JSON) when raised and when cleared. */
  ALERT_WEBHOOK_URL: z.url().optional(),

  /** Breakers per API: open when this share of the last BREAKER_WINDOW calls failed (5xx, timeouts). */
  BREAKER_THRESHOLD: z.coerce.number().gt(0).max(1).default(0.5),
  BREAKER_WINDOW: int(20, 2),
  BREAKER_MIN_CALLS: int(10, 1),
  BREAKER_HALF_OPEN_SECONDS: z.coerce.number().gt(0).default(5),
  /** Credits exhausted with no renewal time from the provider: stop dispatch this long (an admin can resume sooner). */
  CREDITS_STOP_SECONDS: int(3_600, 1),
  /**
   * The longest pause or put-back delay a provider's answer may impose (retry-after,
   * x-rate-limit-reset): a longer ask is capped, and an alert names the window and the value;
   * after the pause the next call decides again.
   */
  RETRY_AFTER_MAX_SECONDS: int(300, 1),

  // Front door and metrics (src/http/hardening.ts, src/metrics.ts)
  /** Query limits, checked before execution; they count the document, not the variables. */
  MAX_QUERY_DEPTH: int(12, 1),
  MAX_QUERY_COST: int(50_000, 1),
  MAX_ALIASES: int(30, 0),
  MAX_TOKENS: int(5_000, 100),
  /** Per-tenant series on GET /metrics (one series per tenant and class): off by default to bound cardinality. */
  METRICS_TENANT_LABELS: bool(false),

  // Retention, ops endpoints, subscription limits
  /** Finished jobs and results, settled reservations and cleared alerts older than this are deleted (default 30 days); pg-boss keeps its finished jobs as long. */
  JOB_RETENTION_SECONDS: int(30 * 24 * 3600, 1),
  /** How often the sweeping worker runs a retention pass, and the rows one delete statement takes. */
  RETENTION_INTERVAL_SECONDS: int(60, 1),
  RETENTION_BATCH_SIZE: int(500, 1),
  /** Worker-only processes serve /healthz, /readyz and /metrics on this port (0 = a free port). API nodes use PORT. */
  METRICS_PORT: int(9464, 0),
  /** When set, GET /metrics needs Authorization: Bearer <METRICS_TOKEN>. */
  METRICS_TOKEN: optionalString,
  /**
   * A link to a job's trace in the operator's tracing UI, `{traceId}` replaced by the job's trace
   * id (e.g. `http://jaeger:16686/trace/{traceId}`); the console and Job.traceUrl show it. Tracing
   * itself is configured by the standard OTEL_* variables (README "Tracing").
   */
  TRACE_URL_TEMPLATE: optionalString,
  /** Open graphql-ws operations one tenant may hold on one process, and one process in all. */
  MAX_SUBSCRIPTIONS_PER_TENANT: int(100, 1),
  /** Charge tenant operations to a per-tenant request budget of cost points (src/http/budget.ts); sizes per tier, overridable per tenant. */
  REQUEST_BUDGET_ENABLED: bool(true),
  /** A tenant asking again before its Retry-After passed gets its THROTTLED answer this much later (bounds what a closed loop costs). */
  REQUEST_BUDGET_REFUSAL_DELAY_MS: int(250),
  MAX_SUBSCRIPTIONS_PER_PROCESS: int(20_000, 1),
  /** Events one subscriber may have waiting; a subscriber that falls further behind is closed (4408). */
  SUBSCRIPTION_BUFFER_MAX: int(1_000, 1),

  // Completion webhooks (src/webhooks/)
  /** Allow plain http, loopback, private and link-local webhook addresses (development and tests only: off stops server-side request forgery). */
  WEBHOOK_ALLOW_PRIVATE: bool(false),
  /** One delivery attempt as a whole (waiting for a socket, connect, send, the answer's headers and body) within this. */
  WEBHOOK_TIMEOUT_MS: int(10_000, 100),
  /** A new connection (TCP and TLS) within this, and the answer's headers within this of connecting; each at most WEBHOOK_TIMEOUT_MS. */
  WEBHOOK_CONNECT_TIMEOUT_MS: int(5_000, 100),
  WEBHOOK_HEADERS_TIMEOUT_MS: int(10_000, 100),
  /** A kept-alive socket to a receiver is closed after this long unused. */
  WEBHOOK_IDLE_SOCKET_TIMEOUT_MS: int(4_000, 100),
  /** Sockets one sender (per worker process) holds open across all hosts, idle ones included; per host it is WEBHOOK_ENDPOINT_CONCURRENCY. */
  WEBHOOK_MAX_SOCKETS: int(128, 1),
  /**
   * Per-tenant delivery budget of each sender: deliveries a second (0 = no rate limit), the burst a
   * quiet tenant may send at once, and deliveries in flight. The burst covers batches of
   * completions back to back (a thousand jobs finishing together, again two seconds later, go out
   * at once); the rate bounds a flood. Between tenants the round-robin claims share the sender.
   */
  WEBHOOK_TENANT_DELIVERIES_PER_SECOND: z.coerce.number().min(0).default(1_000),
  WEBHOOK_TENANT_DELIVERY_BURST: int(2_000, 1),
  WEBHOOK_TENANT_CONCURRENCY: int(32, 1),
  /**
   * The key that encrypts webhook signing secrets at rest (AES-256-GCM; 32 bytes, base64 or hex).
   * Unset: a key generated once and stored in the settings table (a database dump alone then reads the secrets).
   * WEBHOOK_SECRET_KEY_PREVIOUS: the key before a rotation, still opening what it sealed until each start reseals it.
   */
  WEBHOOK_SECRET_KEY: optionalString,
  WEBHOOK_SECRET_KEY_PREVIOUS: optionalString,
  /** Deliveries one process sends at once, and one endpoint receives at once across every node. */
  WEBHOOK_CONCURRENCY: int(64, 1),
  WEBHOOK_ENDPOINT_CONCURRENCY: int(16, 1),
  /** A failed attempt is retried after this, doubling each time up to WEBHOOK_RETRY_MAX_MS... */
  WEBHOOK_RETRY_BASE_MS: int(5_000, 10),
  WEBHOOK_RETRY_MAX_MS: int(3_600_000, 10),
  /** ...for this long after the event; then the delivery is FAILED. */
  WEBHOOK_RETRY_FOR_SECONDS: int(86_400, 1),
  /** An endpoint answering nothing but failures for this long is disabled (re-enabled with updateWebhookEndpoint). */
  WEBHOOK_DISABLE_AFTER_SECONDS: int(86_400, 1),
  /** After rotateWebhookSecret, deliveries are signed with the old secret too for this long. */
  WEBHOOK_SECRET_OVERLAP_SECONDS: int(86_400, 0),
  /** The senders look for due deliveries at least this often (a NOTIFY wakes them at once for new ones). */
  WEBHOOK_POLL_MS: int(1_000, 10),
  /** Endpoints one tenant may have. */
  WEBHOOK_MAX_ENDPOINTS: int(10, 1),

  // Limits before authentication (src/http/front-door.ts)
  /** Most bytes of a request body (or a graphql-ws message before connection_init is accepted) without a valid credential. */
  UNAUTHENTICATED_MAX_BODY_BYTES: int(64 * 1024, 1024),
  /** Failed authentications one client address may make per minute; past it, 429 with Retry-After. */
  AUTH_FAILURES_PER_MINUTE: int(20, 1),
  /**
   * Which proxies in front of Sluice are trusted to say who the client is (src/http/client-address.ts):
   * empty or `false` (the default) trusts none and the socket's peer is the client; a number trusts that
   * many hops (1: one load balancer); a list of IPs, CIDRs and the names loopback, private, linklocal
   * trusts those addresses (`10.0.0.0/8,192.168.0.0/16`). The client's address keys the failed-auth
   * budget and the audit log.
   */
  TRUST_PROXY: z
    .string()
    .default('')
    .superRefine((v, ctx) => {
      try {
        parseTrustProxy(v);
      } catch (err) {
        ctx.addIssue({ code: 'custom', message: (err as Error).message });
      }
    }),
  /** The header trusted proxies write the client's address into: `x-forwarded-for` (default) or RFC 7239 `forwarded`. Only this one is read. */
  TRUST_PROXY_HEADER: z.enum(['x-forwarded-for', 'forwarded']).default('x-forwarded-for'),
  /**
   * Who may introspect the schema (__schema, __type): `public` (anyone), `keys` (a tenant key or the admin
   * token; charged to the tenant's request budget), `off` (nobody). Default: `public` with
   * NODE_ENV=development, `keys` otherwise.
   */
  INTROSPECTION: z.enum(['public', 'keys', 'off']).optional(),
  /** Unknown keys are remembered this long per process (0 = never): repeated guesses do not reach Postgres. */
  AUTH_NEGATIVE_CACHE_MS: int(2_000, 0),
  /** Node's server timeouts: all request headers within, the whole request within, an idle keep-alive connection closed after. */
  HTTP_HEADERS_TIMEOUT_MS: int(10_000, 1_000),
  HTTP_REQUEST_TIMEOUT_MS: int(60_000, 1_000),
  HTTP_KEEP_ALIVE_TIMEOUT_MS: int(5_000, 100),
  /** GraphiQL at GET /graphql. Default: on in demo mode (no APIVERVE_API_KEY) and NODE_ENV=development, off otherwise. */
  GRAPHIQL: z.enum(['true', 'false', '1', '0', 'yes', 'no']).optional().transform((v) => (v === undefined ? undefined : v === 'true' || v === '1' || v === 'yes')),
}).superRefine((env, ctx) => {
  // The embedded Postgres has no pooler in front: a direct URL beside it would be another server.
  if (env.DATABASE_DIRECT_URL && !env.DATABASE_URL) {
    ctx.addIssue({ code: 'custom', path: ['DATABASE_DIRECT_URL'], message: 'is set without DATABASE_URL: set DATABASE_URL (the pooler) too, or unset both for the embedded Postgres' });
  }
  // LISTEN through a transaction-mode pooler is lost when its server connection goes to another client.
  if (env.DATABASE_POOLER === 'pgbouncer' && (!env.DATABASE_DIRECT_URL || env.DATABASE_DIRECT_URL === env.DATABASE_URL)) {
    ctx.addIssue({ code: 'custom', path: ['DATABASE_DIRECT_URL'], message: 'must point at Postgres itself (not the pooler) when DATABASE_POOLER=pgbouncer: LISTEN, migrations and session locks need a session' });
  }
  // Node requires it, and a request cannot finish before its headers have.
  if (env.HTTP_HEADERS_TIMEOUT_MS > env.HTTP_REQUEST_TIMEOUT_MS) {
    ctx.addIssue({ code: 'custom', path: ['HTTP_HEADERS_TIMEOUT_MS'], message: `must not exceed HTTP_REQUEST_TIMEOUT_MS (${env.HTTP_REQUEST_TIMEOUT_MS})` });
  }
});

export type Env = z.infer<typeof envSchema>;

export class ConfigError extends Error {
  override name = 'ConfigError';
}

/** Parses the environment; throws a ConfigError naming every bad variable. */
export function loadEnv(source: NodeJS.ProcessEnv = process.env): Env {
  const parsed = envSchema.safeParse(source);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((issue) => `  ${issue.path.join('.')}: ${issue.message}`);
  throw new ConfigError(`invalid configuration:\n${lines.join('\n')}`);
}
