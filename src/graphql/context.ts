/**
 * Who is calling, and the services resolvers use. The same context is built
 * for HTTP requests (Authorization header) and graphql-ws connections
 * (`connectionParams.authorization`).
 */
import type { ApiCatalog } from '../config/apis.ts';
import type { Sql } from '../db/client.ts';
import type { EventBus, SubscriberSocket } from '../events/bus.ts';
import type { JobService } from '../jobs/service.ts';
import { bearerToken, hashSecret, sameHash, tenantKeyShape } from '../tenants/keys.ts';
import type { TenantRecord } from '../tenants/policy.ts';
import type { TenantStore } from '../tenants/store.ts';
import type { KeyCache } from '../tenants/key-cache.ts';
import { keyLive, type KeyGrant } from '../tenants/api-keys.ts';
import type { SecretBox } from '../webhooks/secret-box.ts';
import type { KeyUseRecorder } from '../tenants/key-use.ts';
import type { WindowSpec } from '../scheduler/windows.ts';
import type { CommitGate } from '../http/deadline.ts';
import type { LifecycleDeps } from '../tenants/lifecycle.ts';
import type { JobClass } from '../config/classes.ts';
import type { BudgetState, RequestBudget } from '../http/budget.ts';
import type { WindowHistory } from '../visibility/history.ts';
import { SluiceError } from '../errors.ts';
import { asId } from './ids.ts';

export type Auth =
  | { kind: 'anonymous' }
  /** A credential was presented and matched nothing. */
  | { kind: 'invalid' }
  | { kind: 'admin' }
  /** A tenant's API key: its tenant, and what the key may do (its scopes). */
  | { kind: 'tenant'; tenant: TenantRecord; key: KeyGrant };

/** Who may call a root field; `tenantOrAdmin`: a tenant for itself, or the admin naming the tenant. */
export type Role = 'public' | 'tenant' | 'admin' | 'tenantOrAdmin';

export interface Services {
  sql: Sql;
  tenants: TenantStore;
  /** Tenant API keys → tenants, cached per process (AUTH_CACHE_TTL_MS), invalidated by the sluice_auth notice. */
  apiKeys: KeyCache;
  /** Notes each key's use, written at most once a minute per key (absent: lastUsedAt is not kept). */
  keyUse?: KeyUseRecorder;
  /** KEY_ROTATION_OVERLAP_SECONDS: how long rotateTenantKey leaves the old keys working. */
  keyRotationOverlapSeconds: number;
  jobs: JobService;
  bus: EventBus;
  catalog: ApiCatalog;
  /** The windows (keys) and the classes they carry. */
  windows: readonly WindowSpec[];
  adminTokenHash: string;
  /** The installation's key checksum secret (tenants/keys.ts): a token with a wrong checksum is refused without a lookup. */
  keyChecksumSecret: string;
  queuePolicy: { retryLimit: number; retryDelaySeconds: number; expireInSeconds: number };
  /** What suspendTenant, resumeTenant and deleteTenant need (pg-boss to drop queues). */
  lifecycle: LifecycleDeps;
  /** CLASS_AGE_PROMISE_SECONDS: how old a class's oldest job may grow (shown beside its age). */
  agePromiseSeconds?: Partial<Record<JobClass, number>>;
  /** Tenants' request budgets (src/http/budget.ts); absent: requests are not charged (REQUEST_BUDGET_ENABLED=false). */
  budget?: RequestBudget;
  /** Webhook endpoints' rules (WEBHOOK_ALLOW_PRIVATE, WEBHOOK_MAX_ENDPOINTS, WEBHOOK_SECRET_OVERLAP_SECONDS). */
  /** box: seals the signing secrets before they are stored (webhooks/secret-box.ts). */
  webhooks: { allowPrivate: boolean; maxEndpoints: number; secretOverlapSeconds: number; box: SecretBox };
  /** TRACE_URL_TEMPLATE: a job's trace link in the tracing UI, `{traceId}` replaced (tracing/traceparent.ts). */
  traceUrlTemplate?: string | undefined;
  /** This node's chart history of the windows (API processes; visibility/history.ts). */
  history?: WindowHistory;
  /** After a tenant is created or changed: its pg-boss queues exist and the scheduler has its limits. */
  tenantChanged(tenant: TenantRecord): Promise<void>;
}

export interface Context {
  auth: Auth;
  services: Services;
  /** HTTP only: the request deadline's commit gate (a submission must not commit once the deadline answered). */
  gate?: CommitGate;
  /** The graphql-ws socket of a subscription (absent over HTTP): closed if the subscriber falls behind. */
  socket?: SubscriberSocket;
  /** The operation's charge to its tenant's request budget, once it is priced (src/http/budget.ts). */
  budget?: BudgetState;
  /** The client's address (the socket's peer, or what trusted proxies say: TRUST_PROXY), for the audit log; null when unknown. */
  address?: string | null;
}

/**
 * The credential a graphql-ws connection presents: `connectionParams.authorization`
 * (any case, also under `headers`, the shape GraphiQL's Headers tab sends), else the
 * WebSocket upgrade request's Authorization header (clients outside a browser can set it).
 */
export function connectionAuthorization(params: unknown, upgradeHeader: string | string[] | null | undefined): string | null {
  const fromObject = (o: unknown): string | null => {
    if (!o || typeof o !== 'object') return null;
    for (const [k, v] of Object.entries(o)) if (k.toLowerCase() === 'authorization' && typeof v === 'string' && v !== '') return v;
    return null;
  };
  const fromParams = fromObject(params) ?? fromObject((params as { headers?: unknown } | null | undefined)?.headers);
  if (fromParams) return fromParams;
  const header = Array.isArray(upgradeHeader) ? upgradeHeader[0] : upgradeHeader;
  return header ? header : null;
}

/** Who presents this credential. `fresh` bypasses the key cache (ws-auth's re-validation after a notice). */
export async function authenticate(services: Services, authorization: string | null | undefined, opts: { fresh?: boolean } = {}): Promise<Auth> {
  if (authorization === null || authorization === undefined || authorization === '') return { kind: 'anonymous' };
  const token = bearerToken(authorization);
  if (!token) return { kind: 'invalid' };
  const hash = hashSecret(token); // once per request: the admin check and the key lookup share it
  if (sameHash(hash, services.adminTokenHash)) return { kind: 'admin' };
  // A forged checksum or a token of no key's shape is refused here: it never costs a database read.
  if (tenantKeyShape(token, services.keyChecksumSecret) === 'forged') return { kind: 'invalid' };
  const holder = await services.apiKeys.lookup(hash, opts);
  // The cache keeps a key until its entry expires; the key's own expiry is checked on every use.
  if (!holder || !keyLive(holder.key, Date.now())) return { kind: 'invalid' };
  services.keyUse?.seen(holder.key.id);
  return { kind: 'tenant', tenant: holder.tenant, key: holder.key };
}

/** The calling tenant; resolvers of tenant fields run only after the operation-level check, so this holds. */
export function tenantOf(ctx: Context): TenantRecord {
  if (ctx.auth.kind !== 'tenant') throw new Error('tenant field resolved without a tenant (auth plugin bypassed)');
  return ctx.auth.tenant;
}

/**
 * The tenant a tenantOrAdmin field acts for: a tenant key's own (naming another is FORBIDDEN, so a
 * key learns nothing about other tenants' ids), or the one the admin names (required). `what` says
 * what is managed, for the messages ("keys", "webhook endpoints").
 */
export function tenantInScope(ctx: Context, tenantId: string | number | null | undefined, what: string): string {
  if (ctx.auth.kind === 'tenant') {
    const own = ctx.auth.tenant.id;
    if (tenantId !== null && tenantId !== undefined && asId(tenantId, 'tenant', 'tenantId') !== own) {
      throw new SluiceError('FORBIDDEN', `a tenant key reaches only its own ${what}: leave tenantId out`, { field: 'tenantId' });
    }
    return own;
  }
  if (tenantId === null || tenantId === undefined) throw new SluiceError('BAD_USER_INPUT', 'the admin token names the tenant: tenantId', { field: 'tenantId' });
  return asId(tenantId, 'tenant', 'tenantId');
}
