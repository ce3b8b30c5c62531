/**
 * Completion webhooks (Standard Webhooks): a tenant's endpoints and the record of their
 * deliveries. Tenant-scoped throughout: another tenant's endpoint is NOT_FOUND, and a tenant key
 * naming another tenant is FORBIDDEN. The admin reads any tenant's endpoints and deliveries
 * (naming it) and may enable or disable an endpoint (an operator re-enabling one that failed);
 * its url, events and secret stay the tenant's.
 */
import { SluiceError } from '../../errors.ts';
import { DELIVERY_STATUSES, WEBHOOK_EVENTS, urlRefusal } from '../../webhooks/policy.ts';
import { newWebhookSecret } from '../../webhooks/signature.ts';
import { deleteEndpoint, endpointBacklogs, insertEndpoint, listDeliveries, listEndpoints, rotateSecret, updateEndpoint, type DeliveryRow, type EndpointRow } from '../../webhooks/store.ts';
import { MANAGE } from '../../tenants/api-keys.ts';
import { builder, role } from '../builder.ts';
import { tenantInScope, tenantOf, type Context } from '../context.ts';
import { asId } from '../ids.ts';
import { pageArgs, pageOf } from '../pages.ts';

export const WebhookEventEnum = builder.enumType('WebhookEvent', {
  description: 'A job event an endpoint can receive (the body\'s `type` is `job.succeeded`, `job.failed` or `job.cancelled`).',
  values: WEBHOOK_EVENTS,
});
const DeliveryStatusEnum = builder.enumType('WebhookDeliveryStatus', {
  values: {
    PENDING: { description: 'Waiting for its first attempt or its next retry (see nextAttemptAt).' },
    SENDING: { description: 'An attempt is in flight.' },
    SUCCEEDED: { description: 'The endpoint answered 2xx.' },
    FAILED: { description: 'Given up: still failing WEBHOOK_RETRY_FOR_SECONDS after the event (about a day), or its job was gone.' },
  },
});

/**
 * An endpoint's backlog, one query per request for every endpoint it shows (gathered over a tick):
 * count and oldest event of its PENDING and SENDING deliveries.
 */
const backlogLoaders = new WeakMap<Context, { ids: Set<string>; result: Promise<Map<string, { pending: number; oldestAt: Date | null }>> | null }>();
function backlogOf(ctx: Context, endpointId: string): Promise<{ pending: number; oldestAt: Date | null }> {
  let loader = backlogLoaders.get(ctx);
  if (!loader || (loader.result && !loader.ids.has(endpointId))) {
    loader = { ids: new Set(), result: null };
    backlogLoaders.set(ctx, loader);
  }
  const l = loader;
  l.ids.add(endpointId);
  l.result ??= new Promise<void>((r) => setImmediate(r)).then(() => endpointBacklogs(ctx.services.sql, [...l.ids]));
  return l.result.then((m) => m.get(endpointId) ?? { pending: 0, oldestAt: null });
}

const EndpointRef = builder.objectRef<EndpointRow>('WebhookEndpoint').implement({
  fields: (t) => ({
    id: t.exposeID('id'),
    url: t.exposeString('url'),
    events: t.field({ type: [WebhookEventEnum], resolve: (e) => e.events }),
    enabled: t.exposeBoolean('enabled', { description: 'False when you disabled it, or when it failed every delivery for WEBHOOK_DISABLE_AFTER_SECONDS (see disabledReason); enable it with updateWebhookEndpoint.' }),
    disabledReason: t.string({ nullable: true, description: 'FAILING (disabled after failing too long), DISABLED_BY_TENANT or DISABLED_BY_OPERATOR; null while enabled.', resolve: (e) => e.disabledReason }),
    disabledAt: t.field({ type: 'DateTime', nullable: true, resolve: (e) => e.disabledAt }),
    failingSince: t.field({ type: 'DateTime', nullable: true, description: 'Start of the current run of failed attempts; null after any success.', resolve: (e) => e.failingSince }),
    createdAt: t.field({ type: 'DateTime', resolve: (e) => e.createdAt }),
    pendingDeliveries: t.int({
      description: 'Deliveries waiting to be sent (PENDING or SENDING): the backlog. Each tenant is sent at most WEBHOOK_TENANT_DELIVERIES_PER_SECOND deliveries a second.',
      resolve: async (e, _a, ctx) => (await backlogOf(ctx, e.id)).pending,
    }),
    oldestPendingAt: t.field({
      type: 'DateTime',
      nullable: true,
      description: 'When the oldest waiting delivery\'s event happened; null when none waits.',
      resolve: async (e, _a, ctx) => (await backlogOf(ctx, e.id)).oldestAt,
    }),
  }),
});

const EndpointWithSecret = builder.objectRef<{ endpoint: EndpointRow; secret: string }>('WebhookEndpointWithSecret').implement({
  description: 'An endpoint and its signing secret (`whsec_` + base64 of the key), shown only here, once.',
  fields: (t) => ({
    endpoint: t.field({ type: EndpointRef, resolve: (x) => x.endpoint }),
    secret: t.exposeString('secret'),
  }),
});

const DeliveryRef = builder.objectRef<DeliveryRow>('WebhookDelivery').implement({
  fields: (t) => ({
    id: t.exposeID('id', { description: 'Also the `webhook-id` header of every attempt: deduplicate on it.' }),
    endpointId: t.exposeID('endpointId'),
    event: t.field({ type: WebhookEventEnum, resolve: (d) => d.event }),
    jobId: t.exposeID('jobId'),
    status: t.field({ type: DeliveryStatusEnum, resolve: (d) => d.status }),
    attempts: t.exposeInt('attempts'),
    lastAttemptAt: t.field({ type: 'DateTime', nullable: true, resolve: (d) => d.lastAttemptAt }),
    nextAttemptAt: t.field({ type: 'DateTime', nullable: true, description: 'While PENDING: when it is tried next.', resolve: (d) => (d.status === 'PENDING' ? d.nextAttemptAt : null) }),
    responseStatus: t.int({ nullable: true, description: "The last attempt's HTTP status; null when it got no answer.", resolve: (d) => d.responseStatus }),
    lastError: t.string({ nullable: true, description: 'Why the last attempt failed (HTTP_500, TIMEOUT: …, ADDRESS_REFUSED: …, CONNECTION_FAILED: …). It never names an address the host name resolved to.', resolve: (d) => d.lastError }),
    createdAt: t.field({ type: 'DateTime', description: 'When the job event happened.', resolve: (d) => d.createdAt }),
  }),
});

const CreateInput = builder.inputType('CreateWebhookEndpointInput', {
  fields: (t) => ({
    url: t.string({ required: true, description: 'https only (plain http, loopback and private addresses only with WEBHOOK_ALLOW_PRIVATE=true).' }),
    events: t.field({ type: [WebhookEventEnum], required: true }),
  }),
});
const UpdateInput = builder.inputType('UpdateWebhookEndpointInput', {
  description: 'Fields left out are unchanged. enabled: true re-enables a disabled endpoint and sends the deliveries it kept waiting. The admin may change only enabled.',
  fields: (t) => ({
    id: t.id({ required: true }),
    url: t.string(),
    events: t.field({ type: [WebhookEventEnum] }),
    enabled: t.boolean(),
  }),
});
const DeliveryFilter = builder.inputType('WebhookDeliveryFilter', {
  fields: (t) => ({
    endpointId: t.id(),
    status: t.field({ type: DeliveryStatusEnum }),
    jobId: t.id(),
  }),
});

function checkUrl(ctx: Context, url: string): string {
  const refusal = urlRefusal(url.trim(), ctx.services.webhooks.allowPrivate);
  if (refusal) throw new SluiceError('BAD_WEBHOOK_URL', refusal, { field: 'url' });
  return url.trim();
}

function checkEvents(events: readonly string[]): string[] {
  const unique = [...new Set(events)];
  if (unique.length === 0) throw new SluiceError('BAD_USER_INPUT', 'events must name at least one event', { field: 'events' });
  return unique;
}

function ownEndpoint(ctx: Context, id: string | number): { tenantId: string; id: string } {
  return { tenantId: tenantOf(ctx).id, id: asId(id, 'webhook endpoint') };
}

const notFound = (id: string) => new SluiceError('NOT_FOUND', `no webhook endpoint with id ${id}`);

/** The tenant these endpoints belong to: the caller's own, or the one the admin names (which must exist). */
async function hooksTenant(ctx: Context, tenantId: string | number | null | undefined): Promise<string> {
  const id = tenantInScope(ctx, tenantId, 'webhook endpoints');
  if (ctx.auth.kind === 'admin' && !(await ctx.services.tenants.get(id))) throw new SluiceError('NOT_FOUND', `no tenant with id ${id}`);
  return id;
}

builder.queryFields((t) => ({
  webhookEndpoints: t.field({
    ...role('tenantOrAdmin', ['READ']),
    type: [EndpointRef],
    description: "Your webhook endpoints, oldest first. The admin names the tenant with tenantId.",
    args: { tenantId: t.arg.id() },
    resolve: async (_r, { tenantId }, ctx) => listEndpoints(ctx.services.sql, await hooksTenant(ctx, tenantId)),
  }),
  webhookDeliveries: t.connection(
    {
      ...role('tenantOrAdmin', ['READ']),
      type: DeliveryRef,
      description: "Your endpoints' deliveries, newest first. The admin names the tenant with tenantId.",
      args: { tenantId: t.arg.id(), filter: t.arg({ type: DeliveryFilter }) },
      resolve: async (_r, args, ctx) => {
        const tenantId = await hooksTenant(ctx, args.tenantId);
        const { first, after } = pageArgs(args, 'delivery');
        const f = args.filter;
        const uuidOr = (v: string | number | null | undefined, what: string, field: string) => (v === null || v === undefined ? undefined : asId(v, what, field));
        const filter = { endpointId: uuidOr(f?.endpointId, 'webhook endpoint', 'filter.endpointId'), status: f?.status ?? undefined, jobId: uuidOr(f?.jobId, 'job', 'filter.jobId') };
        return pageOf(await listDeliveries(ctx.services.sql, tenantId, filter, first + 1, after), first, after);
      },
    },
    { name: 'WebhookDeliveryConnection' },
  ),
}));

builder.mutationFields((t) => ({
  createWebhookEndpoint: t.field({
    ...role('tenant', MANAGE),
    type: EndpointWithSecret,
    description: "Your jobs' chosen final states are POSTed to url, signed per Standard Webhooks with the secret returned here (once).",
    args: { input: t.arg({ type: CreateInput, required: true }) },
    resolve: async (_r, { input }, ctx) => {
      const tenantId = tenantOf(ctx).id;
      const url = checkUrl(ctx, input.url);
      const events = checkEvents(input.events);
      const max = ctx.services.webhooks.maxEndpoints;
      const secret = newWebhookSecret();
      // Counted and inserted under one lock on the tenant's endpoints: parallel creates never pass the limit.
      const endpoint = await insertEndpoint(ctx.services.sql, { tenantId, url, events, secret: ctx.services.webhooks.box.seal(secret) }, max);
      if (!endpoint) throw new SluiceError('TOO_MANY_WEBHOOK_ENDPOINTS', `a tenant may have at most ${max} webhook endpoints`, { max });
      return { endpoint, secret };
    },
  }),
  updateWebhookEndpoint: t.field({
    ...role('tenantOrAdmin', MANAGE),
    type: EndpointRef,
    description: "Changes an endpoint of yours. The admin may enable or disable any tenant's endpoint (only enabled): an operator re-enabling one that failed.",
    args: { input: t.arg({ type: UpdateInput, required: true }) },
    resolve: async (_r, { input }, ctx) => {
      const admin = ctx.auth.kind === 'admin';
      if (admin && ((input.url ?? null) !== null || (input.events ?? null) !== null)) {
        throw new SluiceError('FORBIDDEN', "the admin may only enable or disable an endpoint: its url and events are the tenant's", { field: input.url != null ? 'url' : 'events' });
      }
      // The admin reaches any tenant's endpoint by its id; a tenant only its own.
      const tenantId = admin ? null : tenantOf(ctx).id;
      const id = asId(input.id, 'webhook endpoint', 'input.id');
      const change = {
        url: input.url === null || input.url === undefined ? undefined : checkUrl(ctx, input.url),
        events: input.events === null || input.events === undefined ? undefined : checkEvents(input.events),
        enabled: input.enabled ?? undefined,
      };
      const row = await updateEndpoint(ctx.services.sql, tenantId, id, change, admin ? 'DISABLED_BY_OPERATOR' : 'DISABLED_BY_TENANT');
      if (!row) throw notFound(id);
      return row;
    },
  }),
  deleteWebhookEndpoint: t.field({
    ...role('tenant', MANAGE),
    type: 'ID',
    description: 'Deletes the endpoint and its deliveries (waiting ones are not sent); returns its id.',
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, args, ctx) => {
      const { tenantId, id } = ownEndpoint(ctx, args.id);
      if (!(await deleteEndpoint(ctx.services.sql, tenantId, id))) throw notFound(id);
      return id;
    },
  }),
  rotateWebhookSecret: t.field({
    ...role('tenant', MANAGE),
    type: EndpointWithSecret,
    description:
      'A new signing secret (shown once). For WEBHOOK_SECRET_OVERLAP_SECONDS (default a day) deliveries carry two signatures, the new and the old, so receivers can switch without missing one.',
    args: { id: t.arg.id({ required: true }) },
    resolve: async (_r, args, ctx) => {
      const { tenantId, id } = ownEndpoint(ctx, args.id);
      const secret = newWebhookSecret();
      const endpoint = await rotateSecret(ctx.services.sql, tenantId, id, ctx.services.webhooks.box.seal(secret), ctx.services.webhooks.secretOverlapSeconds);
      if (!endpoint) throw notFound(id);
      return { endpoint, secret };
    },
  }),
}));
