/**
 * Operation-level authorization. Every root field declares a role (see
 * `role()` in builder.ts); before anything executes, the operation's root
 * fields are checked against the caller. A refused operation runs nothing, so
 * a caller never gets partial data: 401 UNAUTHENTICATED for a missing or wrong
 * credential, 403 FORBIDDEN for a field of the other role, or for a tenant
 * key without a scope the operation needs (SUBMIT for mutations, READ for
 * queries and subscriptions, unless the field says otherwise: `role()`).
 */
import { GraphQLError, Kind, type DocumentNode, type FragmentDefinitionNode, type GraphQLSchema, type SelectionSetNode } from 'graphql';
import type { Plugin } from 'graphql-yoga';
import type { Auth, Context, Role } from './context.ts';
import { missingScopes, type Scope } from '../tenants/api-keys.ts';

function rootFieldNames(document: DocumentNode, operationName: string | null | undefined): { type: 'query' | 'mutation' | 'subscription'; fields: string[] } | null {
  const operations = document.definitions.filter((d) => d.kind === Kind.OPERATION_DEFINITION);
  const op = operationName ? operations.find((o) => o.name?.value === operationName) : operations.length === 1 ? operations[0] : undefined;
  if (!op) return null;
  const fragments = new Map(
    document.definitions.filter((d): d is FragmentDefinitionNode => d.kind === Kind.FRAGMENT_DEFINITION).map((f) => [f.name.value, f]),
  );
  const fields: string[] = [];
  const seen = new Set<string>();
  const walk = (set: SelectionSetNode) => {
    for (const sel of set.selections) {
      if (sel.kind === Kind.FIELD) fields.push(sel.name.value);
      else if (sel.kind === Kind.INLINE_FRAGMENT) walk(sel.selectionSet);
      else if (!seen.has(sel.name.value)) {
        seen.add(sel.name.value);
        const frag = fragments.get(sel.name.value);
        if (frag) walk(frag.selectionSet);
      }
    }
  };
  walk(op.selectionSet);
  return { type: op.operation, fields };
}

function refusal(code: 'UNAUTHENTICATED' | 'FORBIDDEN', message: string): GraphQLError {
  return new GraphQLError(message, { extensions: { code, http: { status: code === 'UNAUTHENTICATED' ? 401 : 403 } } });
}

/** The refusal for this caller and these root fields (and the key scopes they need), or null when allowed. Pure. */
export function authorize(auth: Auth, roles: readonly Role[], scopes: readonly Scope[] = []): GraphQLError | null {
  if (auth.kind === 'invalid') return refusal('UNAUTHENTICATED', 'invalid credential: send Authorization: Bearer <api key>');
  for (const r of roles) {
    if (r === 'public') continue;
    if (auth.kind === 'anonymous') return refusal('UNAUTHENTICATED', 'missing credential: send Authorization: Bearer <api key>');
    if (r === 'tenantOrAdmin') continue;
    if (r !== auth.kind) {
      return refusal('FORBIDDEN', r === 'admin' ? 'this operation needs the admin token' : 'this operation needs a tenant API key');
    }
  }
  if (auth.kind === 'tenant') {
    const missing = missingScopes(auth.key, scopes);
    if (missing.length > 0) return refusal('FORBIDDEN', `this API key lacks the ${missing.join(' and ')} scope${missing.length > 1 ? 's' : ''} this operation needs`);
  }
  return null;
}

function rootFields(schema: GraphQLSchema, type: 'query' | 'mutation' | 'subscription') {
  const root = type === 'query' ? schema.getQueryType() : type === 'mutation' ? schema.getMutationType() : schema.getSubscriptionType();
  return root?.getFields() ?? {};
}

export function rolesOf(schema: GraphQLSchema, type: 'query' | 'mutation' | 'subscription', fields: readonly string[]): Role[] {
  const defs = rootFields(schema, type);
  // Introspection (__schema, __type, __typename) is public so GraphiQL can load the docs.
  return fields.map((name) => (name.startsWith('__') ? 'public' : ((defs[name]?.extensions as { role?: Role } | undefined)?.role ?? 'admin')));
}

/** The key scopes these root fields need: the field's own (`role(r, scopes)`), else SUBMIT for a mutation and READ otherwise. */
export function scopesOf(schema: GraphQLSchema, type: 'query' | 'mutation' | 'subscription', fields: readonly string[]): Scope[] {
  const defs = rootFields(schema, type);
  const needed = new Set<Scope>();
  for (const name of fields) {
    if (name.startsWith('__')) continue;
    const ext = defs[name]?.extensions as { role?: Role; scopes?: readonly Scope[] } | undefined;
    if (ext?.role === 'public') continue;
    for (const s of ext?.scopes ?? [type === 'mutation' ? 'SUBMIT' : 'READ']) needed.add(s);
  }
  return [...needed];
}

/** The refusal of this operation for its context's caller, or null (graphql-ws also uses it to close the connection). */
export function operationRefusal(args: { schema: GraphQLSchema; document: DocumentNode; operationName?: string | null | undefined; contextValue: unknown }): GraphQLError | null {
  const op = rootFieldNames(args.document, args.operationName);
  if (!op) return null; // graphql-js reports the missing operation itself
  return authorize((args.contextValue as Context).auth, rolesOf(args.schema, op.type, op.fields), scopesOf(args.schema, op.type, op.fields));
}

export function useOperationAuth(): Plugin<Context> {
  return {
    onExecute({ args, setResultAndStopExecution }) {
      const error = operationRefusal(args);
      if (error) setResultAndStopExecution({ errors: [error] });
    },
    onSubscribe({ args, setResultAndStopExecution }) {
      const error = operationRefusal(args);
      if (error) setResultAndStopExecution({ errors: [error] });
    },
  };
}
