/**
 * The webhook sender: one per worker process, on its own small pool (it never takes a connection
 * the dispatcher or the settlement waits for). It claims due deliveries (store.ts claimDue: at
 * most WEBHOOK_ENDPOINT_CONCURRENCY per endpoint across every node, WEBHOOK_CONCURRENCY in this
 * process), POSTs each (deliver.ts), and records the outcomes in batches (one statement per
 * batch). A slow receiver holds only its own endpoint's slots, for at most WEBHOOK_TIMEOUT_MS;
 * the others keep flowing. Each tenant is held to its delivery budget (budget.ts: deliveries a
 * second and in flight), so one tenant's backlog never takes the sender from the others.
 * NOTIFY sluice_webhooks (from the trigger) wakes it; a poll finds the retries coming due, and a
 * timer the first token of a tenant that ran out.
 */
import { endSpan, propagationHeaders, SpanKind, startSpan, tracing, type Span } from '../tracing/tracer.ts';
import type { Sql } from '../db/client.ts';
import type { Logger } from '../log.ts';
import { WebhookClient, type DeliveryResult } from './deliver.ts';
import { TenantBudget, type TenantBudgetOptions } from './budget.ts';
import { afterAttempt, eventBody, isDelivered, shouldDisable, type RetryPolicy } from './policy.ts';
import { SecretBox, SecretKeyError } from './secret-box.ts';
import { signatureHeader } from './signature.ts';
import { claimDue, disableFailing, recordAttempts, type AttemptOutcome, type ClaimedDelivery } from './store.ts';

export const WEBHOOK_CHANNEL = 'sluice_webhooks';

export interface WebhookSenderOptions {
  sql: Sql;
  /**
   * The LISTEN for new deliveries runs here: a session to Postgres itself (DATABASE_DIRECT_URL). Default `sql`.
   * null: no LISTEN of its own; whoever holds it calls poke() on each notice (the sender's thread: the main thread's).
   */
  listenSql?: Sql | null;
  log: Logger;
  concurrency: number;
  perEndpoint: number;
  /** The whole attempt (deliver.ts); connect and headers have their own, shorter bounds. */
  timeoutMs: number;
  connectTimeoutMs: number;
  headersTimeoutMs: number;
  idleSocketTimeoutMs: number;
  /** Sockets of this sender across every host. */
  maxSockets: number;
  tenantBudget: TenantBudgetOptions;
  /** The keys that open endpoints' secrets (base64, 32 bytes each): the sealing key first (secret-box.ts). */
  secretKeys: string[];
  allowPrivate: boolean;
  retry: RetryPolicy;
  disableAfterMs: number;
  pollMs: number;
  /** After each attempt (metrics): its outcome and, for a 2xx, nothing else. */
  onAttempt?: (outcome: 'delivered' | 'failed') => void;
}

export class WebhookSender {
  private readonly client: WebhookClient;
  private inFlight = 0;
  private claiming = false;
  private again = false;
  private stopped = false;
  private timer: NodeJS.Timeout | null = null;
  private pending: AttemptOutcome[] = [];
  /** Attempts ended here and not yet recorded: their endpoint slots are free already (claimDue). */
  private readonly finished = new Set<string>();
  private flushing: Promise<void> | null = null;
  private unlisten: (() => Promise<void>) | null = null;
  private readonly idle = new Set<() => void>();

  private readonly budget: TenantBudget;
  private readonly box: SecretBox;

  private readonly o: WebhookSenderOptions;
  constructor(o: WebhookSenderOptions) {
    this.o = o;
    this.client = new WebhookClient({
      timeoutMs: o.timeoutMs,
      connectTimeoutMs: o.connectTimeoutMs,
      headersTimeoutMs: o.headersTimeoutMs,
      idleSocketTimeoutMs: o.idleSocketTimeoutMs,
      allowPrivate: o.allowPrivate,
      maxSockets: o.perEndpoint,
      maxTotalSockets: o.maxSockets,
    });
    this.budget = new TenantBudget(o.tenantBudget);
    this.box = new SecretBox(o.secretKeys.map((k) => Buffer.from(k, 'base64')));
  }

  /** Sockets this sender holds open now (tests: the global cap holds). */
  socketCount(): number {
    return this.client.socketCount();
  }

  async start(): Promise<void> {
    if (this.o.listenSql !== null) {
      const { unlisten } = await (this.o.listenSql ?? this.o.sql).listen(WEBHOOK_CHANNEL, () => this.poke());
      this.unlisten = unlisten;
    }
    this.poke();
  }

  /** Stops claiming; attempts in flight finish (each within the timeout) and are recorded. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.unlisten?.().catch(() => {});
    while (this.inFlight > 0 || this.claiming) await new Promise<void>((r) => this.idle.add(r));
    await this.flush();
    this.client.close();
  }

  /** Look for due deliveries now (a NOTIFY, a slot freed, the poll). */
  poke(): void {
    if (this.stopped) return;
    if (this.claiming) {
      this.again = true;
      return;
    }
    void this.claimRound();
  }

  /** Resolves stop()'s wait once nothing is claimed or in flight (and only then: it waits for exactly that). */
  private wakeIdle(): void {
    if (this.inFlight > 0 || this.claiming) return;
    for (const r of this.idle) r();
    this.idle.clear();
  }

  private async claimRound(): Promise<void> {
    this.claiming = true;
    try {
      do {
        this.again = false;
        const free = this.o.concurrency - this.inFlight;
        if (free <= 0 || this.stopped) break;
        const claimed = await claimDue(this.o.sql, {
          limit: free,
          perEndpoint: this.o.perEndpoint,
          claimSeconds: Math.ceil(this.o.timeoutMs / 1000) + 30,
          finished: [...this.finished],
          allowances: this.budget.allowances(performance.now()),
        });
        const now = performance.now();
        for (const d of claimed) {
          this.budget.took(d.tenantId, now);
          this.send(d);
        }
        // A full claim may leave more due: look again.
        if (claimed.length === free) this.again = true;
      } while (this.again && !this.stopped);
    } catch (err) {
      this.o.log.warn({ err }, 'webhook sender: claiming deliveries failed (retried at the next poll)');
    } finally {
      this.claiming = false;
      this.wakeIdle();
      if (!this.stopped) {
        if (this.timer) clearTimeout(this.timer);
        // A tenant out of tokens may have more waiting: look again when it has one.
        const token = this.budget.nextTokenInMs(performance.now());
        this.timer = setTimeout(() => this.poke(), token === null ? this.o.pollMs : Math.min(this.o.pollMs, Math.max(10, token)));
        this.timer.unref();
      }
    }
  }

  private send(d: ClaimedDelivery): void {
    this.inFlight++;
    void this.attempt(d)
      .then((outcome) => {
        this.pending.push(outcome);
        this.finished.add(outcome.id);
        this.o.onAttempt?.(outcome.delivered ? 'delivered' : 'failed');
      })
      .catch((err) => this.o.log.error({ err, delivery: d.id }, 'webhook sender: an attempt threw (its claim expires and it is tried again)'))
      .finally(() => {
        this.inFlight--;
        this.budget.done(d.tenantId);
        // Its slot is free now: claim beside the recording, not after it.
        this.poke();
        void this.flush().then(() => {
          this.wakeIdle();
          this.poke();
        });
      });
  }

  private async attempt(d: ClaimedDelivery): Promise<AttemptOutcome> {
    const base = { id: d.id, endpointId: d.endpointId };
    if (!d.payload) {
      return { ...base, status: 'FAILED', retryInMs: null, responseStatus: null, lastError: 'JOB_GONE: the job was deleted before its event was sent', delivered: null };
    }
    let secrets: string[];
    try {
      secrets = d.secrets.map((s) => this.box.open(s));
    } catch (err) {
      if (!(err instanceof SecretKeyError)) throw err;
      // The operator's configuration, not the tenant's doing: retried on the usual schedule, the endpoint not judged.
      this.o.log.error({ endpoint: d.endpointId, err: err.message }, 'webhook sender: an endpoint\'s signing secret does not open with the configured keys (WEBHOOK_SECRET_KEY, WEBHOOK_SECRET_KEY_PREVIOUS)');
      const next = afterAttempt(false, d.attempts, d.now.getTime() - d.createdAt.getTime(), this.o.retry);
      return { ...base, status: next.status === 'SUCCEEDED' ? 'FAILED' : next.status, retryInMs: next.status === 'PENDING' ? next.retryInMs : null, responseStatus: null, lastError: 'SECRET_UNAVAILABLE: the signing secret could not be read on the sending side (an operator must fix it)', delivered: null };
    }
    const body = eventBody(d.event, d.payload, d.createdAt);
    const timestamp = Math.floor(Date.now() / 1000);
    // A traced job's delivery attempt: a CLIENT span in the job's trace, its traceparent sent to
    // the receiver. The URL is the tenant's (it may carry a token): only its host is on the span.
    const span = tracing.on && d.payload.traceParent ? deliverySpan(d, d.payload.traceParent) : null;
    const result: DeliveryResult = await this.client.post(
      d.url,
      { ...(span ? propagationHeaders(span) : {}), 'webhook-id': d.id, 'webhook-timestamp': String(timestamp), 'webhook-signature': signatureHeader(secrets, d.id, timestamp, body) },
      body,
    );
    const ok = result.kind === 'answer' && isDelivered(result.status);
    if (span) {
      endSpan(span, {
        attributes: { 'http.response.status_code': result.kind === 'answer' ? result.status : null, 'sluice.webhook.delivered': ok },
        error: ok ? null : result.kind === 'answer' ? String(result.status) : result.error,
      });
    }
    const next = afterAttempt(ok, d.attempts, d.now.getTime() - d.createdAt.getTime(), this.o.retry);
    return {
      ...base,
      status: next.status,
      retryInMs: next.status === 'PENDING' ? next.retryInMs : null,
      responseStatus: result.kind === 'answer' ? result.status : null,
      lastError: ok ? null : result.kind === 'answer' ? `HTTP_${result.status}` : `${result.error}: ${result.message}`.slice(0, 500),
      delivered: ok,
    };
  }

  /** Records the finished attempts in one statement; disables the endpoints failing for too long. */
  private flush(): Promise<void> {
    if (this.flushing) return this.flushing.then(() => (this.pending.length > 0 ? this.flush() : undefined));
    if (this.pending.length === 0) return Promise.resolve();
    const batch = this.pending;
    this.pending = [];
    this.flushing = (async () => {
      try {
        const failing = await recordAttempts(this.o.sql, batch);
        for (const o of batch) this.finished.delete(o.id);
        const now = new Date();
        for (const e of failing) {
          if (!shouldDisable(e.failingSince, now, this.o.disableAfterMs)) continue;
          if (await disableFailing(this.o.sql, e.id, 'FAILING')) {
            this.o.log.error(
              { endpoint: e.id, tenant: e.tenantId, url: e.url, failingSince: e.failingSince },
              'ALERT: webhook endpoint disabled: every delivery failed since failingSince; its waiting deliveries are kept and sent when the tenant re-enables it (updateWebhookEndpoint enabled: true)',
            );
          }
        }
      } catch (err) {
        // The attempts stay SENDING until their claim expires, then they are sent again (at least once);
        // meanwhile their slots count as taken again.
        for (const o of batch) this.finished.delete(o.id);
        this.o.log.warn({ err, deliveries: batch.length }, 'webhook sender: recording attempts failed (they are retried when their claim expires)');
      } finally {
        this.flushing = null;
      }
    })();
    return this.flushing;
  }
}

/** The span of one delivery attempt, under the job's traceparent. */
function deliverySpan(d: ClaimedDelivery, traceParent: string): Span {
  let host: string | undefined;
  let port: number | undefined;
  try {
    const u = new URL(d.url);
    host = u.hostname;
    port = Number(u.port) || (u.protocol === 'https:' ? 443 : 80);
  } catch {
    // An unparseable URL fails its attempt (BAD_URL); the span names no host.
  }
  return startSpan('POST webhook', {
    parent: traceParent,
    kind: SpanKind.CLIENT,
    attributes: {
      'http.request.method': 'POST',
      'server.address': host,
      'server.port': port,
      'sluice.tenant.id': d.tenantId,
      'sluice.job.id': d.payload?.id,
      'sluice.webhook.endpoint.id': d.endpointId,
      'sluice.webhook.delivery.id': d.id,
      'sluice.webhook.event': d.event,
      'sluice.webhook.attempt': d.attempts,
    },
  });
}
