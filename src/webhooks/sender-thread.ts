/**
 * The webhook sender on its own thread: WebhookThread starts thread.ts in a node:worker_threads
 * Worker (same process, same settings) and gives app.ts the sender's start()/stop() contract.
 * Deliveries then take no time from the main event loop, where the dispatcher leases and settles:
 * on one loop, unpaced dispatch ran at 0.69x with an endpoint to deliver to.
 *
 * The LISTEN stays here, on the main thread's direct session (one per node, as before): each
 * `sluice_webhooks` notice is forwarded to the thread as a poke. A thread that dies (an error it
 * did not catch, an out-of-memory) is logged and started again after a backoff (1 s doubling to
 * 30 s; back to 1 s once a thread has run for a minute); the process carries on meanwhile, and the
 * deliveries the dead thread had claimed are sent again when their claims expire (at least once).
 */
import type { Env } from '../config/env.ts';
import type { TracingConfig } from '../tracing/config.ts';
import { Worker } from 'node:worker_threads';
import type { Sql } from '../db/client.ts';
import type { ConnectOptions } from '../db/client.ts';
import type { Logger } from '../log.ts';
import { WEBHOOK_CHANNEL, type WebhookSenderOptions } from './sender.ts';

/** The sender's settings from the environment; the signing keys as the thread gets them (base64). */
export function senderSettings(env: Env, secretKeys: readonly Buffer[]): WebhookThreadData['sender'] {
  return {
    concurrency: env.WEBHOOK_CONCURRENCY,
    perEndpoint: env.WEBHOOK_ENDPOINT_CONCURRENCY,
    timeoutMs: env.WEBHOOK_TIMEOUT_MS,
    connectTimeoutMs: env.WEBHOOK_CONNECT_TIMEOUT_MS,
    headersTimeoutMs: env.WEBHOOK_HEADERS_TIMEOUT_MS,
    idleSocketTimeoutMs: env.WEBHOOK_IDLE_SOCKET_TIMEOUT_MS,
    maxSockets: env.WEBHOOK_MAX_SOCKETS,
    tenantBudget: { ratePerSecond: env.WEBHOOK_TENANT_DELIVERIES_PER_SECOND, burst: env.WEBHOOK_TENANT_DELIVERY_BURST, concurrency: env.WEBHOOK_TENANT_CONCURRENCY },
    secretKeys: secretKeys.map((k) => k.toString('base64')),
    allowPrivate: env.WEBHOOK_ALLOW_PRIVATE,
    retry: { baseMs: env.WEBHOOK_RETRY_BASE_MS, maxMs: env.WEBHOOK_RETRY_MAX_MS, retryForMs: env.WEBHOOK_RETRY_FOR_SECONDS * 1000 },
    disableAfterMs: env.WEBHOOK_DISABLE_AFTER_SECONDS * 1000,
    pollMs: env.WEBHOOK_POLL_MS,
  };
}

/** What the thread is started with: everything structured-clonable (no pool, no logger: it makes its own). */
export interface WebhookThreadData {
  databaseUrl: string;
  pool: ConnectOptions & { max: number };
  logLevel: string;
  sender: Omit<WebhookSenderOptions, 'sql' | 'listenSql' | 'log' | 'onAttempt'>;
  /** How often the thread posts its attempt counts (metrics). */
  countFlushMs: number;
  /** The process's tracing configuration when tracing is on (the thread starts its own SDK). */
  tracing?: TracingConfig | null;
}

export type ToThread = { type: 'poke' } | { type: 'stop' };
export type FromThread = { type: 'ready'; threadId: number } | { type: 'attempts'; delivered: number; failed: number } | { type: 'stopped' };

export interface WebhookThreadOptions {
  data: Omit<WebhookThreadData, 'countFlushMs'> & { countFlushMs?: number };
  /** The session the LISTEN runs on (the main thread's direct pool). */
  listenSql: Sql;
  log: Logger;
  /** Attempts counted by the thread (metrics). */
  onAttempts?: (outcome: 'delivered' | 'failed', count: number) => void;
  /** Each thread started, once it is ready (tests: its id, to crash it). */
  onThread?: (worker: Worker, threadId: number) => void;
}

const RESTART_MIN_MS = 1_000;
const RESTART_MAX_MS = 30_000;
/** A thread that ran this long before it died starts the backoff over. */
const HEALTHY_MS = 60_000;
/** The sender thread's young generation (V8 new space), in MB: see spawn(). */
const THREAD_YOUNG_GENERATION_MB = 16;

export class WebhookThread {
  private readonly o: WebhookThreadOptions;
  private readonly data: WebhookThreadData;
  private worker: Worker | null = null;
  private stopped = false;
  private unlisten: (() => Promise<void>) | null = null;
  private restartTimer: NodeJS.Timeout | null = null;
  private backoffMs = RESTART_MIN_MS;
  /** Restarts after a thread died (a stat). */
  restarts = 0;
  /** The running thread's id (0: none running). */
  threadId = 0;

  constructor(o: WebhookThreadOptions) {
    this.o = o;
    this.data = { countFlushMs: 200, ...o.data };
  }

  /** The thread runs and the LISTEN forwards to it. Throws when the first thread cannot start. */
  async start(): Promise<void> {
    await this.spawn();
    const { unlisten } = await this.o.listenSql.listen(WEBHOOK_CHANNEL, () => this.worker?.postMessage({ type: 'poke' } satisfies ToThread));
    this.unlisten = unlisten;
  }

  /**
   * No more notices; the thread stops claiming, lets its attempts in flight finish (each within
   * WEBHOOK_TIMEOUT_MS) and records them, closes its pool and exits. Past the timeout plus a
   * margin it is terminated (its claims expire and those deliveries are sent again).
   */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    await this.unlisten?.().catch(() => {});
    const worker = this.worker;
    if (!worker) return;
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    worker.postMessage({ type: 'stop' } satisfies ToThread);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), this.data.sender.timeoutMs + 10_000)));
    if ((await Promise.race([exited, late])) === 'late') {
      this.o.log.warn('webhook sender thread did not stop in time: terminated (its claimed deliveries are sent again when their claims expire)');
      await worker.terminate();
    }
    clearTimeout(timer);
  }

  /** Starts a thread; resolves once it is ready, rejects when it dies first. */
  private spawn(): Promise<void> {
    const startedAt = Date.now();
    // The thread sends small requests at a modest rate: a young generation of V8's default size
    // for this heap (128 MB of new space under Node 24 on a machine with GBs of memory, resident
    // once the start-up's module loading has grown it) would be most of the thread's footprint.
    const worker = new Worker(new URL('./thread.ts', import.meta.url), { workerData: this.data, resourceLimits: { maxYoungGenerationSizeMb: THREAD_YOUNG_GENERATION_MB } });
    this.worker = worker;
    return new Promise<void>((resolve, reject) => {
      let ready = false;
      worker.on('message', (m: FromThread) => {
        if (m.type === 'ready') {
          ready = true;
          this.threadId = m.threadId;
          this.o.log.info({ threadId: m.threadId, restarts: this.restarts }, 'webhook sender thread running');
          this.o.onThread?.(worker, m.threadId);
          resolve();
        } else if (m.type === 'attempts') {
          if (m.delivered > 0) this.o.onAttempts?.('delivered', m.delivered);
          if (m.failed > 0) this.o.onAttempts?.('failed', m.failed);
        }
      });
      // Without a listener an 'error' would be thrown on the main thread: the process would crash.
      worker.on('error', (err) => this.o.log.error({ err, threadId: worker.threadId }, 'webhook sender thread failed'));
      worker.on('exit', (code) => {
        if (this.worker === worker) {
          this.worker = null;
          this.threadId = 0;
        }
        if (!ready) {
          reject(new Error(`the webhook sender thread exited with ${code} before it was ready`));
          if (!this.stopped && this.restarts > 0) this.scheduleRestart(0);
          return;
        }
        if (this.stopped) return;
        this.scheduleRestart(Date.now() - startedAt);
      });
    });
  }

  private scheduleRestart(ranMs: number): void {
    if (ranMs >= HEALTHY_MS) this.backoffMs = RESTART_MIN_MS;
    const delay = this.backoffMs;
    this.backoffMs = Math.min(RESTART_MAX_MS, this.backoffMs * 2);
    this.o.log.error({ restartInMs: delay, restarts: this.restarts }, 'webhook sender thread died: starting another (deliveries it had claimed are sent again when their claims expire)');
    this.restartTimer = setTimeout(() => {
      this.restartTimer = null;
      if (this.stopped) return;
      this.restarts++;
      this.spawn().catch((err) => this.o.log.error({ err }, 'webhook sender thread did not start'));
    }, delay);
    this.restartTimer.unref();
  }
}
