/**
 * Named API keys: `createApiKey`, `apiKeys`, `revokeApiKey`. A tenant manages
 * its own keys (with a key holding both scopes: a read-only dashboard key
 * cannot mint itself a SUBMIT key), and a key it makes never outlives or
 * outranks the key that made it (tenants/api-keys.ts boundByMaker); the admin
 * manages any tenant's, naming it with `tenantId`, unbounded. `rotateTenantKey`
 * (schema/tenants.ts) issues a key and gives the old ones an expiry.
 */
import { SluiceError } from '../../errors.ts';
import { checkNewKey, MANAGE, SCOPES, type ApiKeyRecord } from '../../tenants/api-keys.ts';
import { builder, role } from '../builder.ts';
import { tenantInScope, type Context } from '../context.ts';
import { asId } from '../ids.ts';

export const ApiKeyScopeEnum = builder.enumType('ApiKeyScope', {
  values: {
    SUBMIT: { description: 'Submit and cancel jobs.' },
    READ: { description: 'Queries and subscriptions (a dashboard).' },
  },
});

export const ApiKeyRef = builder.objectRef<ApiKeyRecord>('ApiKey').implement({
  description: 'A tenant API key (never its secret).',
  fields: (t) => ({
    id: t.exposeID('id'),
    name: t.exposeString('name'),
    prefix: t.exposeString('prefix', { description: 'The first characters of the secret, to tell keys apart.' }),
    scopes: t.field({ type: [ApiKeyScopeEnum], resolve: (k) => SCOPES.filter((s) => k.scopes.includes(s)) }),
    createdAt: t.field({ type: 'DateTime', resolve: (k) => k.createdAt }),
    expiresAt: t.field({ type: 'DateTime', nullable: true, description: 'The key stops working at this instant; null: until revoked.', resolve: (k) => k.expiresAt }),
    lastUsedAt: t.field({
      type: 'DateTime',
      nullable: true,
      description: 'When the key last authenticated, to within about a minute (it is written at most once a minute); null: never used.',
      resolve: (k) => k.lastUsedAt,
    }),
    revokedAt: t.field({ type: 'DateTime', nullable: true, resolve: (k) => k.revokedAt }),
  }),
});

const CreateApiKeyInput = builder.inputType('CreateApiKeyInput', {
  fields: (t) => ({
    name: t.string({ required: true, description: '1 to 100 characters, e.g. "dashboard".' }),
    scopes: t.field({ type: [ApiKeyScopeEnum], required: true, description: 'At least one.' }),
    expiresAt: t.field({
      type: 'DateTime',
      description: "In the future; left out: the key works until revoked. Made with a tenant key, it is at most that key's own expiry (see CreatedApiKey.expiresAtShortened).",
    }),
    tenantId: t.id({ description: 'The admin names the tenant; a tenant key leaves it out (its own tenant).' }),
  }),
});

const CreatedApiKey = builder.objectRef<{ key: ApiKeyRecord; secret: string; expiresAtShortened: boolean }>('CreatedApiKey').implement({
  description: 'A new key and its secret. The secret is shown only here, once; Sluice stores only its hash.',
  fields: (t) => ({
    key: t.field({ type: ApiKeyRef, resolve: (x) => x.key }),
    secret: t.exposeString('secret', { description: 'Send it as Authorization: Bearer <secret>.' }),
    expiresAtShortened: t.exposeBoolean('expiresAtShortened', {
      description:
        "True when the key was given an earlier expiresAt than asked for: a key made with a tenant key ends no later than that key (for a key in a rotation's overlap, the overlap's end), so a key asked for without an end, or with a later one, gets the maker's. Keys the admin token makes are not bounded.",
    }),
  }),
});

/** The tenant whose keys this call manages: the caller's own, or the one the admin names. */
const keysTenant = (ctx: Context, tenantId: string | number | null | undefined): string => tenantInScope(ctx, tenantId, 'keys');

builder.queryFields((t) => ({
  apiKeys: t.field({
    ...role('tenantOrAdmin', ['READ']),
    type: [ApiKeyRef],
    description: "A tenant's keys, oldest first, revoked and expired ones included. A tenant key lists its own; the admin names the tenant.",
    args: { tenantId: t.arg.id() },
    resolve: async (_r, { tenantId }, ctx) => {
      const id = keysTenant(ctx, tenantId);
      if (ctx.auth.kind === 'admin' && !(await ctx.services.tenants.get(id))) throw new SluiceError('NOT_FOUND', `no tenant with id ${id}`);
      return ctx.services.tenants.listKeys(id);
    },
  }),
}));

builder.mutationFields((t) => ({
  createApiKey: t.field({
    ...role('tenantOrAdmin', MANAGE),
    type: CreatedApiKey,
    description:
      "A new named key with scopes, and optionally an expiry. A tenant key needs both scopes to create keys, and the key it makes never outlives it: its expiresAt is at most the maker's (expiresAtShortened says when it was cut).",
    args: { input: t.arg({ type: CreateApiKeyInput, required: true }) },
    resolve: (_r, { input }, ctx) => {
      const tenantId = keysTenant(ctx, input.tenantId);
      const checked = checkNewKey({ name: input.name, scopes: input.scopes, expiresAt: input.expiresAt }, new Date());
      return ctx.services.tenants.createKey(tenantId, checked, ctx.auth.kind === 'tenant' ? ctx.auth.key.id : null);
    },
  }),
  revokeApiKey: t.field({
    ...role('tenantOrAdmin', MANAGE),
    type: ApiKeyRef,
    description: "Revokes a key at once: requests with it get UNAUTHENTICATED and its subscriptions are closed (4401) on every node. A tenant revokes its own keys, the admin anyone's.",
    args: { id: t.arg.id({ required: true }) },
    resolve: (_r, { id }, ctx) => ctx.services.tenants.revokeKey(ctx.auth.kind === 'tenant' ? ctx.auth.tenant.id : null, asId(id, 'API key')),
  }),
}));
