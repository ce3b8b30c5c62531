/**
 * Starting and stopping a Sluice process: the database (embedded or
 * DATABASE_URL), migrations, pg-boss, the provider (the real one, or the
 * simulator in demo mode), then the API and/or the dispatcher per SLUICE_ROLE.
 */
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { buildCatalog } from './config/apis.ts';
import { ConfigError, type Env } from './config/env.ts';
import { connect, connectDedicated, connectDirect, databaseTargets, ensureDatabase, poolSizes, sessionTimeouts, timeoutStatements } from './db/client.ts';
import { startEmbeddedPostgres, type EmbeddedDatabase } from './db/embedded.ts';
import { runMigrations, shippedMigrations } from './db/migrate.ts';
import { resolveAdminToken, resolveKeyChecksumSecret } from './db/settings.ts';
import { Dispatcher, dispatcherSettings } from './dispatch/dispatcher.ts';
import { Breakers } from './dispatch/breakers.ts';
import { createMetrics } from './metrics.ts';
import { queryLimitsFromEnv } from './http/hardening.ts';
import { RequestBudget } from './http/budget.ts';
import { windowCallRates } from './visibility/status.ts';
import { metricsSnapshot } from './metrics-snapshot.ts';
import { createNotifier } from './alerts/notifier.ts';
import { EventBus } from './events/bus.ts';
import type { Services } from './graphql/context.ts';
import { JobService } from './jobs/service.ts';
import type { Logger } from './log.ts';
import { createProviderClient } from './provider/client.ts';
import type { ProviderClient } from './provider/types.ts';
import { BossMaintenance, TENANT_QUEUE_RETENTION_SECONDS, alignTenantQueues, ensureTenantQueues, startBoss } from './queue/boss.ts';
import { createOpsServer, metricsRefused, type OpsOptions } from './http/ops.ts';
import { applyTimeouts, isLoopbackHost } from './http/front-door.ts';
import { parseTrustProxy } from './http/client-address.ts';
import { SubscriptionRegistry } from './events/subscriptions.ts';
import { Retention } from './retention/retention.ts';
import type { Worker } from 'node:worker_threads';
import { WebhookThread, senderSettings } from './webhooks/sender-thread.ts';
import { SecretBox } from './webhooks/secret-box.ts';
import { webhookSecretKeys } from './webhooks/secret-keys.ts';
import { GRAPHQL_PATH, createHttpServer } from './server.ts';
import type { Simulator, SimulatorOptions } from './simulator/index.ts';
import { resolveUpstream } from './upstream.ts';
import { TenantStore } from './tenants/store.ts';
import { KeyUseRecorder } from './tenants/key-use.ts';
import { KeyCache } from './tenants/key-cache.ts';
import { ensureClasses } from './scheduler/sql/classes.ts';
import { syncTenant, unscheduledTenantIds } from './scheduler/sql/tenants.ts';
import { readWindows, upsertWindows } from './scheduler/sql/windows.ts';
import { SLOW_START_IDLE_MS, slowStartRate } from './scheduler/learned-pace.ts';
import { Sweeper } from './scheduler/sweeper.ts';
import { sweeperDuties } from './scheduler/sweeper-duties.ts';
import { Reconciler } from './scheduler/reconcile.ts';
import { parseClassWindows, planWindows } from './scheduler/windows.ts';
import { parseClassNumbers, parseClassSeconds } from './config/classes.ts';
import { WindowHistory } from './visibility/history.ts';
import { tracingConfig } from './tracing/config.ts';
import { startTracing, stopTracing } from './tracing/tracer.ts';

export interface SluiceApp {
  /** http://host:port/graphql when this process serves the API. */
  url: string | null;
  port: number | null;
  /** The port a worker-only process serves /healthz, /readyz and /metrics on (null otherwise). */
  metricsPort: number | null;
  databaseUrl: string;
  /** The in-process simulator in demo mode. */
  simulator: Simulator | null;
  /** The admin token when this start generated it (shown once). */
  generatedAdminToken: string | null;
  /** Tenants' request budgets as this process charges them (null: REQUEST_BUDGET_ENABLED=false). */
  requestBudget: RequestBudget | null;
  /** This process's job events (tests read which copy of its own settlements' events it delivered). */
  bus: EventBus;
  stop(): Promise<void>;
}

/** What tests and benchmarks may set beyond the environment. */
export interface StartOverrides {
  /** Options for the demo-mode simulator, on top of the SIMULATOR_* environment. */
  simulator?: Partial<SimulatorOptions>;
  /** Wraps the real provider client (tests: a fault on a chosen request, through the real path). */
  wrapProviderClient?: (client: ProviderClient) => ProviderClient;
  /** Each webhook sender thread once it runs (tests: that it is not the main thread; terminate it to see it restarted). */
  webhookThread?: (worker: Worker, threadId: number) => void;
  /** OTEL_* variables on top of the process's environment (tracing reads them from there). */
  tracingEnv?: Record<string, string>;
}

export async function startSluice(env: Env, log: Logger, overrides: StartOverrides = {}): Promise<SluiceApp> {
  /**
   * Stop order: first stop taking new work (the HTTP server stops accepting
   * connections), then the cleanups in reverse order of start: the dispatcher
   * drains its in-flight calls (up to SHUTDOWN_GRACE_SECONDS) and settles them,
   * subscriptions close with 1001, then the sweeper, event bus, provider
   * client, pg-boss and the pools; the embedded Postgres, started first, stops last.
   */
  const intake: Array<() => void> = [];
  const cleanups: Array<() => Promise<unknown>> = [];
  let stopping: Promise<void> | null = null;
  const stop = () =>
    (stopping ??= (async () => {
      for (const fn of intake) fn();
      for (const fn of cleanups.reverse()) await fn().catch((err) => log.error({ err }, 'error while stopping'));
    })());
  try {
    // 0. Tracing: on only with an OTLP endpoint (the standard OTEL_* variables); stopped last, so
    // the spans of the stop itself are flushed.
    let traceConfig;
    try {
      traceConfig = tracingConfig({ ...process.env, ...overrides.tracingEnv });
    } catch (err) {
      throw new ConfigError(`invalid configuration:\n  ${(err as Error).message}`);
    }
    if (traceConfig.enabled && startTracing(traceConfig, { 'sluice.role': env.SLUICE_ROLE })) {
      cleanups.push(() => stopTracing());
      log.info({ endpoint: traceConfig.endpoint, sampler: traceConfig.sampler }, 'tracing is on: spans go to the OTLP endpoint');
    }
    // 1. Database.
    let databaseUrl = env.DATABASE_URL;
    let embedded: EmbeddedDatabase | null = null;
    if (!databaseUrl) {
      embedded = await startEmbeddedPostgres(path.join(env.SLUICE_DATA_DIR, 'postgres'), (msg) => log.info(msg));
      cleanups.push(() => embedded!.stop());
      await ensureDatabase(embedded.url, 'sluice');
      databaseUrl = embedded.urlFor('sluice');
      log.info({ dataDir: path.resolve(env.SLUICE_DATA_DIR) }, 'embedded Postgres is running (set DATABASE_URL to use your own)');
    }
    // DATABASE_URL may be a transaction-mode pooler; what needs a session goes to DATABASE_DIRECT_URL.
    const targets = databaseTargets(databaseUrl, env.DATABASE_DIRECT_URL, env.DATABASE_POOLER);
    await runMigrations(targets.directUrl);
    const poolSettings = {
      timeouts: {
        lockTimeoutMs: env.DB_LOCK_TIMEOUT_MS,
        statementTimeoutMs: env.DB_STATEMENT_TIMEOUT_MS,
        idleInTransactionTimeoutMs: env.DB_IDLE_IN_TRANSACTION_TIMEOUT_MS,
      },
      // A connection attempt gives up within 5 s (and within the request deadline): a request never hangs on a Postgres that is away.
      connectTimeoutSeconds: Math.max(1, Math.min(5, Math.ceil(env.REQUEST_TIMEOUT_MS / 1000))),
      pooler: targets.pooler,
    };
    const connection = connect(databaseUrl, { ...poolSettings, max: env.DB_POOL_MAX, countStatements: env.SLUICE_COUNT_SQL });
    const { sql, db } = connection;
    cleanups.push(() => connection.end());
    // LISTEN and the session advisory locks. Without a pooler it is the main pool itself, as it
    // always was (its LISTEN connection is the one more in the connection budget).
    const direct = targets.directUrl === databaseUrl && !targets.pooler ? sql : connectDirect(targets.directUrl, poolSettings);
    if (direct !== sql) cleanups.push(() => direct.end({ timeout: 5 }));
    if (targets.pooler) {
      // Startup parameters do not pass a pooler: the timeouts are the role's server defaults there.
      const shown = await sessionTimeouts(sql);
      const missing = timeoutStatements(shown.role, shown.database, poolSettings.timeouts, shown.timeouts);
      if (missing.length > 0) {
        log.warn(
          { run: missing, current: shown.timeouts },
          'behind the pooler, the Postgres timeouts (DB_*_TIMEOUT_MS) are not the server defaults of this role: a frozen node could hold rows longer; run these statements once on Postgres (docs/SCALING.md)',
        );
      }
    }
    const boss = await startBoss(databaseUrl, { supervise: false, max: poolSizes(env.DB_POOL_MAX).boss });
    cleanups.push(() => boss.stop({ graceful: false, close: true }));
    // Queues created before the attempt lease keep a pg-boss heartbeat, before retention was set only 14
    // days of waiting (pg-boss's default), or another finished-job deletion: bring them in line, once per set of values.
    const extended = await alignTenantQueues(sql, env.JOB_RETENTION_SECONDS);
    if (extended) log.info({ queues: extended, retentionDays: TENANT_QUEUE_RETENTION_SECONDS / 86_400 }, 'extended the retention of existing tenant queues');
    // pg-boss's maintenance runs on one process at a time, a bounded page of queues per pass.
    const maintenance = new BossMaintenance(boss, sql, env.BOSS_SUPERVISE_INTERVAL_SECONDS * 1000, (err) => log.warn({ err }, 'pg-boss maintenance failed'), env.BOSS_MAINTENANCE_PAGE, direct);
    maintenance.start();
    cleanups.push(() => maintenance.stop());

    // 2. Provider: the real account, or the simulator in demo mode (same plan, rate and keys).
    const catalog = buildCatalog(env.API_COSTS, env.BATCH_DISABLED_APIS);
    const upstream = await resolveUpstream(env, catalog, overrides.simulator);
    const { simulator, primaryKey, subKeys, baseUrl } = upstream;
    if (simulator) {
      cleanups.push(() => simulator.stop());
      log.warn({ simulator: simulator.url }, 'DEMO MODE: no APIVERVE_API_KEY is set, so jobs run against the bundled provider simulator, not the real APIVerve');
    }
    const realClient = createProviderClient({ baseUrl, timeoutMs: env.PROVIDER_TIMEOUT_MS, catalog, timeoutBilling: env.TIMEOUT_BILLING, maxResultBytes: env.MAX_RESULT_BYTES, maxRetryAfterSeconds: env.RETRY_AFTER_MAX_SECONDS, idleSocketMs: env.PROVIDER_IDLE_SOCKET_TIMEOUT_MS });
    const client = overrides.wrapProviderClient?.(realClient) ?? realClient;
    cleanups.push(() => client.close());
    const windowSpecs = planWindows({
      plan: env.APIVERVE_PLAN,
      ratePerMinute: env.APIVERVE_RATE_PER_MINUTE,
      concurrentCalls: env.APIVERVE_CONCURRENT_CALLS,
      paceFraction: env.PACE_FRACTION,
      burst: env.PACER_BURST,
      primaryKey,
      subKeys,
      classWindows: (() => {
        try {
          return parseClassWindows(env.CLASS_WINDOWS, subKeys);
        } catch (err) {
          throw new ConfigError(`invalid configuration:\n  CLASS_WINDOWS: ${(err as Error).message}`);
        }
      })(),
    });
    await ensureClasses(sql);
    await upsertWindows(sql, windowSpecs, env.PACE_LEARN ? { start: slowStartRate(1, { start: env.PACE_START, min: env.PACE_MIN }), idleMs: SLOW_START_IDLE_MS } : null);

    // 3. Shared services.
    const admin = await resolveAdminToken(sql, env.SLUICE_ADMIN_TOKEN);
    // Webhook signing secrets are stored sealed: the keys, and the start's pass over older rows.
    const webhookKeys = await webhookSecretKeys(sql, env, log);
    const keyChecksumSecret = await resolveKeyChecksumSecret(sql);
    const bus = new EventBus({ maxBuffer: env.SUBSCRIPTION_BUFFER_MAX });
    // Job events feed GraphQL subscriptions only. A worker serves none, so it does not LISTEN for
    // them: every event would otherwise be sent to and parsed by every worker (bench dispatch: the
    // worker processes' CPU per job fell from 0.16-0.27 ms to 0.14-0.24 ms with 1 to 4 workers).
    if (env.SLUICE_ROLE !== 'worker') {
      await bus.start(direct);
      cleanups.push(() => bus.stop());
    }
    const queuePolicy = {
      deleteAfterSeconds: env.JOB_RETENTION_SECONDS,
      retryLimit: 10, // pg-boss's own retries only cover crash redelivery; Sluice counts upstream attempts itself
      retryDelaySeconds: 1,
      expireInSeconds: Math.max(60, Math.ceil((env.PROVIDER_TIMEOUT_MS / 1000) * 3)),
    };
    // Tenant keys, cached per process; the sluice_auth notice (sent in the changing transaction) and
    // the changing process itself invalidate them (tenants/key-cache.ts).
    const tenantStore = new TenantStore(db, { keyChecksumSecret, authChanged: (id) => apiKeys.invalidate(id) });
    const apiKeys = new KeyCache({ ttlMs: env.AUTH_CACHE_TTL_MS, negativeTtlMs: env.AUTH_NEGATIVE_CACHE_MS, load: (hash) => tenantStore.byKeyHash(hash), loadMany: (hashes) => tenantStore.byKeyHashes(hashes) });
    await apiKeys.start(direct);
    cleanups.push(() => apiKeys.stop());
    const keyUse = new KeyUseRecorder({ write: (uses) => tenantStore.recordKeyUse(uses), onError: (err) => log.warn({ err }, 'writing API keys\' lastUsedAt failed; kept for the next flush') });
    keyUse.start();
    cleanups.push(() => keyUse.stop());
    const services: Services = {
      sql,
      tenants: tenantStore,
      apiKeys,
      keyUse,
      keyRotationOverlapSeconds: env.KEY_ROTATION_OVERLAP_SECONDS,
      jobs: new JobService({
        sql,
        boss,
        catalog,
        maxJobsPerSubmission: env.MAX_JOBS_PER_SUBMISSION,
        paramLimits: { maxKeys: env.MAX_PARAM_KEYS, maxBytes: env.MAX_PARAMS_BYTES },
        runAtMaxSeconds: env.JOB_RUN_AT_MAX_SECONDS,
        admission: { globalBound: env.GLOBAL_QUEUE_BOUND, classShare: parseClassNumbers(env.CLASS_SHARES), windows: windowSpecs },
        groupCommit: { windowMs: env.GROUP_COMMIT_MS, maxItems: env.GROUP_COMMIT_MAX },
        bulkReserveMin: env.BULK_RESERVE_MIN,
        reservationSeconds: env.ADMISSION_RESERVATION_SECONDS,
        onRefused: (code, jobClass) => metrics.refused(code, jobClass ?? 'ALL'),
      }),
      bus,
      catalog,
      windows: windowSpecs,
      adminTokenHash: admin.hash,
      traceUrlTemplate: env.TRACE_URL_TEMPLATE,
      keyChecksumSecret,
      queuePolicy,
      lifecycle: { sql, boss, authChanged: (id) => apiKeys.invalidate(id) },
      agePromiseSeconds: parseClassNumbers(env.CLASS_AGE_PROMISE_SECONDS),
      ...(env.REQUEST_BUDGET_ENABLED ? { budget: new RequestBudget(sql, { refusalDelayMs: env.REQUEST_BUDGET_REFUSAL_DELAY_MS }) } : {}),
      webhooks: { allowPrivate: env.WEBHOOK_ALLOW_PRIVATE, maxEndpoints: env.WEBHOOK_MAX_ENDPOINTS, secretOverlapSeconds: env.WEBHOOK_SECRET_OVERLAP_SECONDS, box: new SecretBox(webhookKeys) },
      tenantChanged: async (tenant) => {
        await ensureTenantQueues(boss, tenant.id, queuePolicy);
        await syncTenant(sql, tenant);
      },
    };
    // Tenants the scheduler does not know yet (created before it existed): give them their rows.
    for (const id of await unscheduledTenantIds(sql)) {
      const tenant = await services.tenants.get(id);
      if (tenant) await services.tenantChanged(tenant);
    }

    const metrics = createMetrics({ tenantLabels: env.METRICS_TENANT_LABELS, onCollectError: (err) => log.warn({ err }, 'metrics collector failed') });
    metrics.setCollector(() => metricsSnapshot(services, metrics.tenantLabels));

    // 4. The parts this process runs.
    let url: string | null = null;
    let port: number | null = null;
    let dispatcherUp = false;
    let metricsPort: number | null = null;
    const ops: OpsOptions = {
      sql,
      expectedMigrations: shippedMigrations(),
      metrics,
      metricsToken: env.METRICS_TOKEN,
      metricsOff: metricsRefused(isLoopbackHost(env.HOST), env.METRICS_TOKEN),
      ...(env.SLUICE_ROLE !== 'api' ? { dispatcherRunning: () => dispatcherUp } : {}),
    };
    if (ops.metricsOff) log.warn({ host: env.HOST }, 'GET /metrics is refused (403): this process listens on a non-loopback address and METRICS_TOKEN is not set; set METRICS_TOKEN to serve it');
    if (env.SLUICE_ROLE !== 'worker') {
      // The console's chart history: this node's own ring buffer (visibility/history.ts).
      const history = new WindowHistory(async () => {
        const [windows, rates] = await Promise.all([readWindows(sql), windowCallRates(sql)]);
        return windows.map((w) => ({ ...w, callsPerSecond: rates.get(w.name) ?? 0 }));
      });
      history.start((err) => log.debug({ err }, 'chart history sample failed (the next one is in 5 s)'));
      services.history = history;
      cleanups.push(async () => history.stop());
      // In demo mode and development GraphiQL is on unless GRAPHIQL=false; in production only with GRAPHIQL=true.
      const graphiql = env.GRAPHIQL ?? (!env.APIVERVE_API_KEY || env.NODE_ENV === 'development');
      const subscriptions = new SubscriptionRegistry({ perTenant: env.MAX_SUBSCRIPTIONS_PER_TENANT, perProcess: env.MAX_SUBSCRIPTIONS_PER_PROCESS });
      const { server, closeSubscriptions, connections } = createHttpServer({
        services,
        maxBodyBytes: env.MAX_BODY_BYTES,
        requestTimeoutMs: env.REQUEST_TIMEOUT_MS,
        log,
        development: env.NODE_ENV === 'development',
        limits: queryLimitsFromEnv(env),
        metrics,
        ops,
        subscriptions,
        unauthenticatedMaxBodyBytes: env.UNAUTHENTICATED_MAX_BODY_BYTES,
        authFailuresPerMinute: env.AUTH_FAILURES_PER_MINUTE,
        httpTimeouts: { headersMs: env.HTTP_HEADERS_TIMEOUT_MS, requestMs: env.HTTP_REQUEST_TIMEOUT_MS, keepAliveMs: env.HTTP_KEEP_ALIVE_TIMEOUT_MS },
        graphiql,
        trustProxy: parseTrustProxy(env.TRUST_PROXY),
        trustProxyHeader: env.TRUST_PROXY_HEADER,
        introspection: env.INTROSPECTION ?? (env.NODE_ENV === 'development' ? 'public' : 'keys'),
      });
      // Revoked keys lose their open subscriptions on every node (http/ws-auth.ts).
      await connections.start(direct, (err) => log.warn({ err }, 'could not re-validate graphql-ws connections'));
      cleanups.push(() => connections.stop());
      await listen(server, env.PORT, env.HOST);
      intake.push(() => {
        server.close();
        server.closeIdleConnections();
      });
      cleanups.push(async () => {
        await closeSubscriptions();
        await closeServer(server);
      });
      port = (server.address() as AddressInfo).port;
      const shownHost = env.HOST === '0.0.0.0' || env.HOST === '::' ? 'localhost' : env.HOST;
      url = `http://${shownHost}:${port}${GRAPHQL_PATH}`;
      log.info({ url, console: url.replace(/\/graphql$/, '/console'), graphiql }, 'GraphQL API is up (graphql-ws on the same path, GraphiQL when `graphiql` is true); the console is at /console');
    }
    if (env.SLUICE_ROLE !== 'api') {
      const nodeId = randomUUID();
      const breakers = new Breakers({
        threshold: env.BREAKER_THRESHOLD,
        size: env.BREAKER_WINDOW,
        minimumCalls: env.BREAKER_MIN_CALLS,
        halfOpenAfterMs: env.BREAKER_HALF_OPEN_SECONDS * 1000,
      });
      const agePromises = parseClassSeconds(env.CLASS_AGE_PROMISE_SECONDS);
      const retention = new Retention({
        sql,
        lockSql: direct,
        retentionSeconds: env.JOB_RETENTION_SECONDS,
        batchSize: env.RETENTION_BATCH_SIZE,
        maxBatches: 20,
        intervalSeconds: env.RETENTION_INTERVAL_SECONDS,
        log,
      });
      // The attempt-lease refresh's own connection: it never waits behind the hot path on `sql`.
      const leaseSql = connectDedicated(databaseUrl, { ...poolSettings, max: 1 });
      cleanups.push(() => leaseSql.end({ timeout: 5 }));
      const dispatcher = new Dispatcher({
        sql,
        leaseSql,
        listenSql: direct,
        boss,
        client,
        catalog,
        windows: windowSpecs,
        nodeId,
        ...dispatcherSettings(env),
        // The raw pool's size: the settlement is warmed on it at start, all but the dispatch loop's spares (not behind a pooler).
        warmConnections: targets.pooler ? 0 : poolSizes(env.DB_POOL_MAX).sql,
        breakers,
        onLeased: (window, jobClass, jobs) => metrics.dispatched(window, jobClass, jobs),
        onSettled: ({ outcome, billed, reserved }) => metrics.attemptSettled(outcome, billed, reserved),
        // A process that serves subscribers gives them its own settlements' final events at their
        // commit, not when the NOTIFY comes back (a worker does not LISTEN: nothing to give).
        ...(env.SLUICE_ROLE !== 'worker' ? { ownEvents: bus } : {}),
        log,
      });
      const reconciler = new Reconciler({ boss, intervalMs: env.RECONCILE_INTERVAL_SECONDS * 1000, log });
      const duties = sweeperDuties({ sql, windows: windowSpecs, dispatcher, breakers, client, retention, agePromisesMs: agePromises });
      const sweeper = new Sweeper({
        sql,
        boss,
        nodeId,
        role: env.SLUICE_ROLE,
        intervalMs: env.SWEEP_INTERVAL_MS,
        nodeTimeoutSeconds: env.NODE_TIMEOUT_SECONDS,
        leaseSeconds: env.ATTEMPT_LEASE_SECONDS ?? env.NODE_TIMEOUT_SECONDS,
        timeoutBilling: env.TIMEOUT_BILLING,
        retryLimit: env.JOB_RETRY_LIMIT,
        log,
        onRound: duties.onRound,
        desiredAlerts: duties.desiredAlerts,
        notifier: createNotifier({ webhookUrl: env.ALERT_WEBHOOK_URL, log, onRaised: (name) => metrics.alertRaised(name) }),
        reconcile: (tx) => reconciler.reconcile(tx),
      });
      await sweeper.start();
      cleanups.push(() => sweeper.stop());
      // Webhook deliveries: on their own thread (its own event loop, so POSTs and signing take no
      // time from the leases and settlements here) with their own small pool, so a slow receiver
      // or a burst of events never takes a connection the dispatcher or the settlement waits for.
      const webhooks = new WebhookThread({
        data: {
          databaseUrl,
          pool: { ...poolSettings, max: 2 },
          logLevel: log.level,
          tracing: traceConfig.enabled ? traceConfig : null,
          sender: senderSettings(env, webhookKeys),
        },
        // Behind a transaction-mode pooler a LISTEN is lost with its server connection: it needs the direct one.
        // It stays on this thread (one session per node); the notices are forwarded to the sender's thread.
        listenSql: direct,
        log,
        onAttempts: (outcome, count) => metrics.webhookAttempt(outcome, count),
        ...(overrides.webhookThread ? { onThread: overrides.webhookThread } : {}),
      });
      await webhooks.start();
      cleanups.push(() => webhooks.stop());
      await dispatcher.start();
      dispatcherUp = true;
      // Stops leasing, lets in-flight calls finish and settle within the grace; past it, their
      // attempt leases expire and a live node's sweeper settles them (never called twice).
      cleanups.push(() => {
        dispatcherUp = false;
        return dispatcher.stop({ graceMs: env.SHUTDOWN_GRACE_SECONDS * 1000 }).then(({ unsettled }) => {
          if (unsettled > 0) log.warn({ unsettled, graceSeconds: env.SHUTDOWN_GRACE_SECONDS }, 'calls still in flight after the shutdown grace: their leases expire and a live node settles them');
          else log.info('dispatcher drained: every in-flight call is settled');
        });
      });
      if (env.SLUICE_ROLE === 'worker') {
        // A worker serves no GraphQL: /healthz, /readyz and /metrics get their own small server.
        const opsServer = createOpsServer(ops);
        applyTimeouts(opsServer, { headersMs: env.HTTP_HEADERS_TIMEOUT_MS, requestMs: env.HTTP_REQUEST_TIMEOUT_MS, keepAliveMs: env.HTTP_KEEP_ALIVE_TIMEOUT_MS });
        try {
          await listen(opsServer, env.METRICS_PORT, env.HOST);
          cleanups.push(() => closeServer(opsServer));
          metricsPort = (opsServer.address() as AddressInfo).port;
          log.info({ port: metricsPort }, 'worker serves /healthz, /readyz and /metrics');
        } catch (err) {
          // Dispatching matters more than being scraped: say so loudly and keep working.
          log.error({ err, port: env.METRICS_PORT }, 'could not listen on METRICS_PORT: this worker serves no /metrics');
        }
      }
      log.info({ nodeId, windows: windowSpecs.map((w) => ({ name: w.name, classes: w.classes, pacedPerMinute: w.pacedPerMinute })) }, 'dispatcher started');
    }

    return { url, port, metricsPort, databaseUrl, simulator, generatedAdminToken: admin.generated, requestBudget: services.budget ?? null, bus, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

function closeServer(server: Server): Promise<void> {
  return new Promise((resolve) => {
    if (!server.listening) resolve();
    else server.close(() => resolve());
    server.closeAllConnections();
  });
}
