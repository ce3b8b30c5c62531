/**
 * Open graphql-ws operations of this process, for the caps
 * (MAX_SUBSCRIPTIONS_PER_TENANT, MAX_SUBSCRIPTIONS_PER_PROCESS, counted per
 * process: a tenant connected to N API processes may hold N × its cap).
 * Closing connections whose key was revoked is http/ws-auth.ts's job.
 */
import { GraphQLError } from 'graphql';
import { processRegularResult, type Plugin } from 'graphql-yoga';

interface Connection {
  tenantId: string | null;
  operations: Set<string>;
}

/** Whether one more operation may start; pure. */
export function subscriptionRefusal(counts: { tenant: number; process: number }, caps: { perTenant: number; perProcess: number }, isTenant: boolean): GraphQLError | null {
  if (counts.process >= caps.perProcess) {
    return new GraphQLError(`this server holds its maximum of ${caps.perProcess} open subscriptions; retry later or on another node`, {
      extensions: { code: 'TOO_MANY_SUBSCRIPTIONS', scope: 'PROCESS', limit: caps.perProcess },
    });
  }
  if (isTenant && counts.tenant >= caps.perTenant) {
    return new GraphQLError(`you have ${caps.perTenant} open subscriptions on this server, the maximum; complete one first`, {
      extensions: { code: 'TOO_MANY_SUBSCRIPTIONS', scope: 'TENANT', limit: caps.perTenant },
    });
  }
  return null;
}

export class SubscriptionRegistry {
  private readonly connections = new Map<object, Connection>();
  private readonly perTenant = new Map<string, number>();
  private total = 0;
  readonly caps: { perTenant: number; perProcess: number };

  constructor(caps: { perTenant: number; perProcess: number }) {
    this.caps = caps;
  }

  /** Open operations: per tenant and in all. */
  counts(tenantId: string | null): { tenant: number; process: number } {
    return { tenant: tenantId ? (this.perTenant.get(tenantId) ?? 0) : 0, process: this.total };
  }

  connected(key: object, tenantId: string | null): void {
    this.connections.set(key, { tenantId, operations: new Set() });
  }

  /** Registers an operation, or returns the refusal. */
  start(key: object, id: string): GraphQLError | null {
    const c = this.connections.get(key);
    if (!c) return null;
    const refusal = subscriptionRefusal(this.counts(c.tenantId), this.caps, c.tenantId !== null);
    if (refusal) return refusal;
    c.operations.add(id);
    this.total++;
    if (c.tenantId) this.perTenant.set(c.tenantId, (this.perTenant.get(c.tenantId) ?? 0) + 1);
    return null;
  }

  end(key: object, id: string): void {
    const c = this.connections.get(key);
    if (!c || !c.operations.delete(id)) return;
    this.total--;
    if (c.tenantId) {
      const n = (this.perTenant.get(c.tenantId) ?? 1) - 1;
      if (n <= 0) this.perTenant.delete(c.tenantId);
      else this.perTenant.set(c.tenantId, n);
    }
  }

  disconnected(key: object): void {
    const c = this.connections.get(key);
    if (!c) return;
    for (const id of [...c.operations]) this.end(key, id);
    this.connections.delete(key);
  }
}

/**
 * Subscriptions are served over graphql-ws only. Over HTTP (Yoga's SSE) they
 * would need every control above again (caps, closing on revocation,
 * suspension and deletion, the slow-consumer close, an abort when the client
 * goes away); one transport keeps them in one place. A subscription over HTTP
 * gets this coded error, whoever asks (before the operation-level
 * authorization) and before anything runs.
 */
export function sseRefusal(): GraphQLError {
  return new GraphQLError(
    'subscriptions are served over graphql-ws only: open a WebSocket to /graphql (protocol graphql-transport-ws) and send connectionParams.authorization = "Bearer <api key>"',
    { extensions: { code: 'SUBSCRIPTIONS_NEED_GRAPHQL_WS', http: { status: 400 } } },
  );
}

/** Whether a result is this refusal (a single result, not a stream). Pure. */
export function isSseRefusal(result: unknown): boolean {
  const errors = (result as { errors?: readonly { extensions?: { code?: unknown } }[] } | null)?.errors;
  return Array.isArray(errors) && errors.some((e) => e?.extensions?.code === 'SUBSCRIPTIONS_NEED_GRAPHQL_WS');
}

/**
 * Refuses subscriptions that did not come over graphql-ws (their context has no socket), and
 * answers the refusal as JSON with its 400 even to a client that asked for an event stream: a
 * 200 stream carrying one error event would look to it like a subscription that was accepted.
 */
export function useSubscriptionsOverWsOnly(): Plugin<{ socket?: unknown }> {
  return {
    onSubscribe({ args, setResultAndStopExecution }) {
      if (!(args.contextValue as { socket?: unknown }).socket) setResultAndStopExecution({ errors: [sseRefusal()] });
    },
    onResultProcess({ result, setResultProcessor }) {
      if (isSseRefusal(result)) setResultProcessor(processRegularResult, 'application/json');
    },
  };
}
