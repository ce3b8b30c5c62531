/**
 * The scope table, checked against the running server: every root field of the
 * printed schema (schema/schema.graphql) × every caller (no key, a SUBMIT-only
 * key, a READ-only key, a key with both, the admin token), over real HTTP and
 * graphql-ws for subscriptions. A field without a declaration fails, and so
 * does an answer that disagrees with the declaration (allowed, or refused with
 * UNAUTHENTICATED / FORBIDDEN before anything runs). Also: what an operation
 * returns is limited by the key's scopes (Job.params and its kin need READ,
 * through fragments and over graphql-ws too), and the README's printed table is
 * the one the schema declares.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  buildSchema,
  getNamedType,
  GraphQLObjectType,
  GraphQLSchema,
  GraphQLString,
  isCompositeType,
  isEnumType,
  isInputObjectType,
  isListType,
  isNonNullType,
  isScalarType,
  parse,
  type GraphQLField,
  type GraphQLInputType,
  type OperationTypeNode,
} from 'graphql';
import { createClient, type Client } from 'graphql-ws';
import WebSocket from 'ws';
import { ADMIN_TOKEN, startTestApp, type TestApp } from './helpers/app.ts';
import { schema as builtSchema } from '../src/graphql/schema.ts';
import { declaredAccess, operationRefusal, rootAccess } from '../src/graphql/auth-plugin.ts';
import { scopeTable, withScopeTable } from '../src/graphql/scope-table.ts';
import type { Auth } from '../src/graphql/context.ts';
import type { Scope } from '../src/tenants/api-keys.ts';

const printed = buildSchema(readFileSync(new URL('../schema/schema.graphql', import.meta.url), 'utf8'));
const ROOTS = [
  ['query', printed.getQueryType()!],
  ['mutation', printed.getMutationType()!],
  ['subscription', printed.getSubscriptionType()!],
] as const;
const ZERO_ID = '00000000-0000-4000-8000-000000000000';

/** The built schema's field (where the declarations are: SDL has no extensions). */
const builtField = (kind: string, name: string) => builtSchema.getRootType(kind as OperationTypeNode)!.getFields()[name];

type Caller = { name: string; token: string | null; kind: 'anonymous' | 'tenant' | 'admin'; scopes: Scope[] };
type Outcome = 'allowed' | 'UNAUTHENTICATED' | 'FORBIDDEN';

/** A value of the right type for a required argument (or input field): valid in type, meaningless in content. */
function placeholder(type: GraphQLInputType): unknown {
  if (isNonNullType(type)) return placeholder(type.ofType);
  if (isListType(type)) return [];
  if (isEnumType(type)) return type.getValues()[0]!.name;
  if (isInputObjectType(type)) {
    const out: Record<string, unknown> = {};
    for (const f of Object.values(type.getFields())) if (isNonNullType(f.type) && f.defaultValue === undefined) out[f.name] = placeholder(f.type);
    return out;
  }
  if (isScalarType(type)) {
    switch (type.name) {
      case 'ID':
        return ZERO_ID;
      case 'String':
        return 'x';
      case 'Int':
        return 1;
      case 'Float':
        return 0.5;
      case 'Boolean':
        return false;
      case 'DateTime':
        return '2030-01-01T00:00:00.000Z';
      case 'JSON':
        return {};
    }
  }
  throw new Error(`no placeholder for ${String(type)}`);
}

/** The smallest valid operation calling this root field: its required arguments as variables, `__typename` below an object. */
function minimalDocument(kind: string, field: GraphQLField<unknown, unknown>): { query: string; variables: Record<string, unknown> } {
  const required = field.args.filter((a) => isNonNullType(a.type) && a.defaultValue === undefined);
  const defs = required.map((a) => `$${a.name}: ${String(a.type)}`).join(', ');
  const args = required.map((a) => `${a.name}: $${a.name}`).join(', ');
  const selection = isCompositeType(getNamedType(field.type)) ? ' { __typename }' : '';
  const query = `${kind} Probe${defs ? `(${defs})` : ''} { ${field.name}${args ? `(${args})` : ''}${selection} }`;
  return { query, variables: Object.fromEntries(required.map((a) => [a.name, placeholder(a.type)])) };
}

/** What the table says this caller gets. */
function expected(access: { role: string; scopes: readonly Scope[] }, caller: Caller): Outcome {
  if (access.role === 'public') return 'allowed';
  if (caller.kind === 'anonymous') return 'UNAUTHENTICATED';
  if (caller.kind === 'admin') return access.role === 'tenant' ? 'FORBIDDEN' : 'allowed';
  if (access.role === 'admin') return 'FORBIDDEN';
  return access.scopes.every((s) => caller.scopes.includes(s)) ? 'allowed' : 'FORBIDDEN';
}

/** Runs `fn` over `items`, at most `limit` at a time. */
async function pool<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    while (next < items.length) await fn(items[next++]!);
  }));
}

function wsClient(url: string, token: string | null): { client: Client; closed: () => { code: number; reason: string } | null } {
  let closed: { code: number; reason: string } | null = null;
  const client = createClient({
    url: url.replace(/^http/, 'ws'),
    webSocketImpl: WebSocket,
    connectionParams: token ? { authorization: `Bearer ${token}` } : {},
    retryAttempts: 0,
    lazy: true,
    // Kept open between operations: one socket carries them in turn (a refused one leaves it open).
    lazyCloseTimeout: 60_000,
    on: { closed: (e) => void (closed ??= { code: (e as { code: number }).code, reason: String((e as { reason: string }).reason) }) },
  });
  return { client, closed: () => closed };
}

/** A graphql-ws operation's first word: data, an error (its code), a close (its code), or nothing within `quietMs`. */
function firstAnswer(client: Client, query: string, variables: Record<string, unknown>, quietMs = 1_500): Promise<{ kind: 'next' | 'error' | 'complete' | 'quiet'; code?: unknown; message?: string; value?: unknown }> {
  return new Promise((resolve) => {
    let done = false;
    const finish = (v: Parameters<typeof resolve>[0]) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      dispose();
      resolve(v);
    };
    const timer = setTimeout(() => finish({ kind: 'quiet' }), quietMs);
    const dispose = client.subscribe(
      { query, variables },
      {
        next: (v) => finish({ kind: 'next', code: v.errors?.[0]?.extensions?.code, message: v.errors?.[0]?.message, value: v }),
        error: (e) => {
          if (Array.isArray(e)) finish({ kind: 'error', code: e[0]?.extensions?.code, message: e[0]?.message });
          else finish({ kind: 'error', code: (e as { code?: unknown }).code, message: String((e as { reason?: unknown }).reason ?? e) });
        },
        complete: () => finish({ kind: 'complete' }),
      },
    );
  });
}

describe('the scope table: every root field × every caller', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  const callers: Caller[] = [];

  before(async () => {
    t = await startTestApp({ SLUICE_ROLE: 'api' });
    tenant = await t.createTenant('scoped', 'ENTERPRISE');
    const key = async (name: string, scopes: Scope[]) => {
      const r = await t.gql(`mutation($i: CreateApiKeyInput!) { createApiKey(input: $i) { secret } }`, { i: { tenantId: tenant.id, name, scopes } });
      return r.body.data.createApiKey.secret as string;
    };
    callers.push(
      { name: 'no key', token: null, kind: 'anonymous', scopes: [] },
      { name: 'SUBMIT key', token: await key('submit', ['SUBMIT']), kind: 'tenant', scopes: ['SUBMIT'] },
      { name: 'READ key', token: await key('read', ['READ']), kind: 'tenant', scopes: ['READ'] },
      { name: 'SUBMIT+READ key', token: tenant.apiKey, kind: 'tenant', scopes: ['SUBMIT', 'READ'] },
      { name: 'admin token', token: ADMIN_TOKEN, kind: 'admin', scopes: [] },
    );
  });
  after(() => t.stop());

  test('every root field of the printed schema declares who may call it and its scopes', () => {
    const undeclared: string[] = [];
    for (const [kind, type] of ROOTS) {
      for (const name of Object.keys(type.getFields())) {
        const field = builtField(kind, name);
        assert.ok(field, `${type.name}.${name} is printed but not built: run npm run schema:print`);
        if (!declaredAccess(field, true)) undeclared.push(`${type.name}.${name}`);
      }
    }
    assert.deepEqual(undeclared, [], 'root fields without role() (they would be admin-only)');
  });

  test('the least privilege the table promises: what matters most, pinned', () => {
    const access = (kind: string, name: string) => rootAccess(builtField(kind, name)!);
    const both = ['SUBMIT', 'READ'];
    for (const name of ['createWebhookEndpoint', 'updateWebhookEndpoint', 'rotateWebhookSecret', 'deleteWebhookEndpoint', 'createApiKey', 'revokeApiKey']) {
      assert.deepEqual([...access('mutation', name).scopes].sort(), [...both].sort(), `${name} needs SUBMIT and READ`);
    }
    for (const name of ['webhookEndpoints', 'webhookDeliveries', 'jobs', 'job', 'usageEvents', 'apiKeys', 'me']) assert.deepEqual(access('query', name).scopes, ['READ'], `${name} needs READ`);
    // Every mutation a tenant key may call needs SUBMIT; every query or subscription but rateLimit needs READ.
    for (const [kind, type] of ROOTS) {
      for (const name of Object.keys(type.getFields())) {
        const a = access(kind, name);
        if (a.role === 'admin' || a.role === 'public') continue;
        if (kind === 'mutation') assert.ok(a.scopes.includes('SUBMIT'), `${name} needs SUBMIT`);
        else if (name !== 'rateLimit') assert.ok(a.scopes.includes('READ'), `${name} needs READ`);
      }
    }
    const job = builtSchema.getType('Job') as GraphQLObjectType;
    for (const name of ['params', 'result', 'error', 'idempotencyKey', 'fairnessKey']) assert.deepEqual(declaredAccess(job.getFields()[name]!, false)?.scopes, ['READ'], `Job.${name} needs READ`);
    for (const name of ['id', 'state']) assert.equal(declaredAccess(job.getFields()[name]!, false), null, `Job.${name} is for any key that reaches the job`);
  });

  test('queries and mutations over HTTP answer as the table says, for every caller', async () => {
    const cases: { field: string; caller: Caller; doc: ReturnType<typeof minimalDocument>; want: Outcome }[] = [];
    for (const [kind, type] of ROOTS) {
      if (kind === 'subscription') continue;
      for (const field of Object.values(type.getFields())) {
        const want = (c: Caller) => expected(rootAccess(builtField(kind, field.name)!), c);
        for (const caller of callers) cases.push({ field: `${type.name}.${field.name}`, caller, doc: minimalDocument(kind, field), want: want(caller) });
      }
    }
    assert.ok(cases.length >= 5 * 30, `every field × every caller: ${cases.length}`);
    const wrong: string[] = [];
    await pool(cases, 4, async (c) => {
      const r = await t.gql(c.doc.query, c.doc.variables, c.caller.token);
      const code = r.body.errors?.[0]?.extensions?.code;
      // Refused by the auth check: 401/403, the code, and nothing ran (no data at all).
      const got: Outcome = r.status === 401 && code === 'UNAUTHENTICATED' && r.body.data === undefined ? 'UNAUTHENTICATED' : r.status === 403 && code === 'FORBIDDEN' && r.body.data === undefined ? 'FORBIDDEN' : 'allowed';
      if (got !== c.want) wrong.push(`${c.field} by ${c.caller.name}: expected ${c.want}, got ${got} (${r.status} ${JSON.stringify(r.body).slice(0, 200)})`);
      // Allowed is an answer the resolver gave: a coded refusal of the placeholder (NOT_FOUND, BAD_USER_INPUT…), never a crash.
      else if (got === 'allowed' && (code === 'INTERNAL_SERVER_ERROR' || r.status >= 500)) wrong.push(`${c.field} by ${c.caller.name}: ${r.status} ${JSON.stringify(r.body).slice(0, 200)}`);
    });
    assert.deepEqual(wrong, []);
  });

  test('subscriptions over graphql-ws answer as the table says, for every caller', async () => {
    const fields = Object.values(printed.getSubscriptionType()!.getFields());
    const wrong: string[] = [];
    const clients = callers.map((c) => ({ caller: c, ...wsClient(t.url, c.token) }));
    try {
      await Promise.all(
        clients.flatMap(({ caller, client }) =>
          fields.map(async (field) => {
            const want = expected(rootAccess(builtField('subscription', field.name)!), caller);
            const doc = minimalDocument('subscription', field);
            const a = await firstAnswer(caller.kind === 'anonymous' ? wsClient(t.url, null).client : client, doc.query, doc.variables);
            // No key: the connection itself is refused (4401); a refused operation is an error with its code.
            const got: Outcome = a.kind === 'error' && (a.code === 4401 || a.code === 'UNAUTHENTICATED') ? 'UNAUTHENTICATED' : a.kind === 'error' && a.code === 'FORBIDDEN' ? 'FORBIDDEN' : 'allowed';
            if (got !== want) wrong.push(`Subscription.${field.name} by ${caller.name}: expected ${want}, got ${got} (${JSON.stringify(a).slice(0, 200)})`);
          }),
        ),
      );
    } finally {
      await Promise.all(clients.map((c) => c.client.dispose()));
    }
    assert.deepEqual(wrong, []);
  });

  test('a SUBMIT-only key submits, cancels and retries with ids and states, and is refused params, result and error up front (fragments too)', async () => {
    const submitKey = callers.find((c) => c.name === 'SUBMIT key')!.token!;
    const submitted = await t.gql(`mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id state } } }`, { i: { jobs: [{ api: 'dnslookup', params: { domain: 'a.example' } }, { api: 'dnslookup', params: { domain: 'b.example' } }] } }, submitKey);
    const [a, b] = submitted.body.data.submitJobs.jobs as { id: string; state: string }[];
    assert.equal(a!.state, 'QUEUED');

    for (const query of [
      `mutation($id: ID!) { cancelJob(id: $id) { id params } }`,
      `mutation($id: ID!) { cancelJob(id: $id) { id ...Data } } fragment Data on Job { state ... on Job { result } }`,
      `mutation($id: ID!) { cancelJob(id: $id) { id error { code message } } }`,
    ]) {
      const refused = await t.gql(query, { id: a!.id }, submitKey);
      assert.equal(refused.status, 403, JSON.stringify(refused.body));
      assert.equal(refused.body.errors[0].extensions.code, 'FORBIDDEN');
      assert.equal(refused.body.data, undefined, 'nothing ran');
      assert.match(refused.body.errors[0].message, /READ scope/);
      assert.match(refused.body.errors[0].message, /Job\.(params|result|error) needs READ/);
      assert.deepEqual(refused.body.errors[0].extensions.missingScopes, ['READ']);
    }
    const still = await t.gql(`query($id: ID!) { job(id: $id) { state } }`, { id: a!.id }, tenant.apiKey);
    assert.equal(still.body.data.job.state, 'QUEUED', 'the refused cancellations did not run');

    const cancelled = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id state } }`, { id: a!.id }, submitKey);
    assert.deepEqual(cancelled.body.data.cancelJob, { id: a!.id, state: 'CANCELLED' });
    const retryRefused = await t.gql(`mutation($id: ID!) { retryJob(id: $id) { id params } }`, { id: a!.id }, submitKey);
    assert.equal(retryRefused.body.errors[0].extensions.code, 'FORBIDDEN');
    const retried = await t.gql(`mutation($id: ID!) { retryJob(id: $id) { id state retryOf } }`, { id: a!.id }, submitKey);
    assert.equal(retried.body.data.retryJob.state, 'QUEUED');
    assert.equal(retried.body.data.retryJob.retryOf, a!.id);
    // The key with both scopes sees everything, and so does the admin token.
    const full = await t.gql(`mutation($id: ID!) { cancelJob(id: $id) { id params idempotencyKey fairnessKey } }`, { id: b!.id }, tenant.apiKey);
    assert.deepEqual(full.body.data.cancelJob.params, { domain: 'b.example' });
    const admin = await t.gql(`mutation($id: ID!) { retryJob(id: $id) { id params } }`, { id: b!.id });
    assert.deepEqual(admin.body.data.retryJob.params, { domain: 'b.example' });

    // Over graphql-ws the same walk refuses the operation alone.
    const { client } = wsClient(t.url, submitKey);
    try {
      const submittedWs = await firstAnswer(client, `mutation { submitJob(input: {api: "dnslookup", params: {domain: "c.example"}}) { job { id state } } }`, {}, 10_000);
      const cId = ((submittedWs.value as { data: { submitJob: { job: { id: string } } } }).data.submitJob.job.id);
      const refusedWs = await firstAnswer(client, `mutation($id: ID!) { cancelJob(id: $id) { ...F } } fragment F on Job { id params }`, { id: cId }, 10_000);
      assert.equal(refusedWs.kind, 'error');
      assert.equal(refusedWs.code, 'FORBIDDEN');
      assert.match(refusedWs.message!, /Job\.params needs READ/);
      const cancelledWs = await firstAnswer(client, `mutation($id: ID!) { cancelJob(id: $id) { id state } }`, { id: cId }, 10_000);
      assert.equal(cancelledWs.kind, "next", JSON.stringify(cancelledWs));
      assert.equal((cancelledWs.value as { data?: { cancelJob: { state: string } } }).data?.cancelJob.state, 'CANCELLED', `the refused cancellation had not run: ${JSON.stringify(cancelledWs)}`);
    } finally {
      await client.dispose();
    }
  });

  test("README.md's printed table is the schema's (npm run schema:print rewrites it)", () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    assert.equal(withScopeTable(readme, scopeTable(builtSchema)), readme);
  });
});

describe('a root field without a declaration', () => {
  const schema = new GraphQLSchema({
    query: new GraphQLObjectType({
      name: 'Query',
      fields: {
        forgotten: { type: GraphQLString },
        declared: { type: GraphQLString, extensions: { access: { role: 'tenant', scopes: ['READ'] } } },
        scopesOnly: { type: GraphQLString, extensions: { access: { scopes: [] } } },
      },
    }),
  });
  const tenant: Auth = { kind: 'tenant', tenant: { id: 't' } as never, key: { id: 'k', scopes: ['SUBMIT', 'READ'], expiresAtMs: null } };
  const refusal = (auth: Auth, query: string) => operationRefusal({ schema, document: parse(query), contextValue: { auth } })?.extensions.code ?? null;

  test('is the admin\'s only: refused to every key and to no key, never open by omission', () => {
    for (const q of ['{ forgotten }', '{ scopesOnly }', '{ declared forgotten }', 'query { ...F } fragment F on Query { forgotten }']) {
      assert.equal(refusal(tenant, q), 'FORBIDDEN', q);
      assert.equal(refusal({ kind: 'anonymous' }, q), 'UNAUTHENTICATED', q);
    }
    for (const q of ['{ forgotten }', '{ scopesOnly }', 'query { ...F } fragment F on Query { forgotten }']) assert.equal(refusal({ kind: 'admin' }, q), null, q);
    assert.equal(refusal(tenant, '{ declared }'), null);
  });

  test('one parsed document (as the parser cache shares it) is judged per caller and per operation it names', () => {
    // The requirements are remembered per document: the same object must still refuse or allow by
    // the caller, and by which of its operations the request selects.
    const document = parse('query A { declared } query B { forgotten }');
    const judge = (auth: Auth, operationName: string) => operationRefusal({ schema, document, operationName, contextValue: { auth } })?.extensions.code ?? null;
    for (let round = 0; round < 2; round++) {
      assert.equal(judge(tenant, 'A'), null);
      assert.equal(judge(tenant, 'B'), 'FORBIDDEN');
      assert.equal(judge({ kind: 'admin' }, 'B'), null);
      assert.equal(judge({ kind: 'anonymous' }, 'A'), 'UNAUTHENTICATED');
      assert.equal(judge({ ...tenant, key: { ...tenant.key, scopes: ['SUBMIT'] } } as Auth, 'A'), 'FORBIDDEN');
    }
  });

  test('is printed as undeclared in the table', () => {
    assert.match(scopeTable(schema), /`forgotten` \| \*\*undeclared\*\*/);
  });
});
