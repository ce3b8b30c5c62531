/**
 * Operation-level authorization. Every root field declares who may call it and
 * the key scopes it needs (`role()` in builder.ts), and fields below the root
 * that carry a job's input or output declare the scopes they need
 * (`needs()`). Before anything executes, the whole operation is walked (its
 * fragments included) and checked against the caller. A refused operation runs
 * nothing, so a caller never gets partial data: 401 UNAUTHENTICATED for a
 * missing or wrong credential, 403 FORBIDDEN for a field of the other role, or
 * for a tenant key without a scope a selected field needs (the message names
 * the field and the scope).
 *
 * A root field without a declaration is the admin's only: forgetting one never
 * opens a field to tenants (and test/scope-table.test.ts fails on it).
 */
import {
  GraphQLError,
  Kind,
  TypeInfo,
  visit,
  visitWithTypeInfo,
  type ASTNode,
  type DocumentNode,
  type FragmentDefinitionNode,
  type GraphQLField,
  type GraphQLSchema,
  type OperationDefinitionNode,
} from 'graphql';
import type { Plugin } from 'graphql-yoga';
import type { Auth, Context, Role } from './context.ts';
import type { FieldAccess } from './builder.ts';
import { missingScopes, type Scope } from '../tenants/api-keys.ts';

/** What one selected field asks of the caller: `Type.field`, its role (root fields) and the key scopes it needs. */
export interface Requirement {
  field: string;
  role?: Role;
  scopes: readonly Scope[];
}

function refusal(code: 'UNAUTHENTICATED' | 'FORBIDDEN', message: string, extra: Record<string, unknown> = {}): GraphQLError {
  return new GraphQLError(message, { extensions: { code, ...extra, http: { status: code === 'UNAUTHENTICATED' ? 401 : 403 } } });
}

/**
 * A field's declaration, or null when it has none. Introspection's root fields (`__schema`,
 * `__type`, `__typename`) are public so GraphiQL can load the docs.
 */
export function declaredAccess(field: Pick<GraphQLField<unknown, unknown>, 'name' | 'extensions'>, root: boolean): FieldAccess | null {
  if (root && field.name.startsWith('__')) return { role: 'public', scopes: [] };
  const access = (field.extensions as { access?: Partial<FieldAccess> } | null | undefined)?.access;
  if (!access || !Array.isArray(access.scopes)) return null;
  if (root && !access.role) return null;
  return { ...(access.role ? { role: access.role } : {}), scopes: access.scopes };
}

/** A root field's access: its declaration, else the admin's only (never open by omission). */
export function rootAccess(field: Pick<GraphQLField<unknown, unknown>, 'name' | 'extensions'>): FieldAccess & { role: Role } {
  const access = declaredAccess(field, true);
  return access?.role ? { role: access.role, scopes: access.scopes } : { role: 'admin', scopes: [] };
}

function selectedOperation(document: DocumentNode, operationName: string | null | undefined): OperationDefinitionNode | null {
  const operations = document.definitions.filter((d): d is OperationDefinitionNode => d.kind === Kind.OPERATION_DEFINITION);
  return (operationName ? operations.find((o) => o.name?.value === operationName) : operations.length === 1 ? operations[0] : undefined) ?? null;
}

/**
 * What the operation's selected fields ask of the caller: every root field (with its role) and
 * every field below that declares scopes, each once, through the fragments the operation uses.
 * Null when the document names no runnable operation (graphql-js reports that itself). Pure.
 */
export function operationRequirements(schema: GraphQLSchema, document: DocumentNode, operationName?: string | null): Requirement[] | null {
  const op = selectedOperation(document, operationName);
  if (!op) return null;
  const rootType = schema.getRootType(op.operation);
  if (!rootType) return null;
  const fragments = new Map(document.definitions.filter((d): d is FragmentDefinitionNode => d.kind === Kind.FRAGMENT_DEFINITION).map((f) => [f.name.value, f]));
  // The fragments the operation reaches, each walked once (however often it is spread).
  const reached = new Set<string>();
  const pending: ASTNode[] = [op];
  const found = new Map<string, Requirement>();
  const typeInfo = new TypeInfo(schema);
  while (pending.length > 0) {
    const node = pending.pop()!;
    visit(
      node,
      visitWithTypeInfo(typeInfo, {
        FragmentSpread(spread) {
          const name = spread.name.value;
          if (reached.has(name) || !fragments.has(name)) return;
          reached.add(name);
          pending.push(fragments.get(name)!);
        },
        Field() {
          const def = typeInfo.getFieldDef();
          const parent = typeInfo.getParentType();
          if (!def || !parent) return; // unknown fields are validation's to report
          const coordinate = `${parent.name}.${def.name}`;
          if (found.has(coordinate)) return;
          if (parent === rootType) {
            const access = rootAccess(def);
            found.set(coordinate, { field: coordinate, role: access.role, scopes: access.scopes });
            return;
          }
          const access = declaredAccess(def, false);
          if (access && access.scopes.length > 0) found.set(coordinate, { field: coordinate, scopes: access.scopes });
        },
      }),
    );
  }
  return [...found.values()];
}

/** The refusal of these requirements for this caller, or null when allowed. Pure. */
export function refusalFor(auth: Auth, requirements: readonly Requirement[]): GraphQLError | null {
  if (auth.kind === 'invalid') return refusal('UNAUTHENTICATED', 'invalid credential: send Authorization: Bearer <api key>');
  for (const { role: r } of requirements) {
    if (r === undefined || r === 'public') continue;
    if (auth.kind === 'anonymous') return refusal('UNAUTHENTICATED', 'missing credential: send Authorization: Bearer <api key>');
    if (r === 'tenantOrAdmin') continue;
    if (r !== auth.kind) {
      return refusal('FORBIDDEN', r === 'admin' ? 'this operation needs the admin token' : 'this operation needs a tenant API key');
    }
  }
  if (auth.kind !== 'tenant') return null;
  const lacking = requirements.map((q) => ({ field: q.field, missing: missingScopes(auth.key, q.scopes) })).filter((x) => x.missing.length > 0);
  if (lacking.length === 0) return null;
  const missing = [...new Set(lacking.flatMap((x) => x.missing))];
  const detail = lacking.map((x) => `${x.field} needs ${x.missing.join(' and ')}`).join('; ');
  return refusal('FORBIDDEN', `this API key lacks the ${missing.join(' and ')} scope${missing.length > 1 ? 's' : ''} this operation needs (${detail})`, {
    missingScopes: missing,
    fields: lacking.map((x) => x.field),
  });
}

/** The refusal for this caller and these root fields' roles and scopes, or null when allowed. Pure. */
export function authorize(auth: Auth, roles: readonly Role[], scopes: readonly Scope[] = []): GraphQLError | null {
  return refusalFor(auth, [...roles.map((role, i) => ({ field: `field ${i + 1}`, role, scopes: [] })), { field: 'the operation', scopes }]);
}

/**
 * operationRequirements, once per (schema, parsed document, operation name). Yoga's parser cache
 * hands every request with the same query text the same DocumentNode, so the walk with TypeInfo
 * (a fifth of a refused submission's GraphQL work under load) runs once per document, not once
 * per request. Weakly held: a document the parser cache drops takes its entry with it. The
 * requirements depend on nothing else (not the caller, not the variables), so sharing them is exact.
 */
const requirementsMemo = new WeakMap<GraphQLSchema, WeakMap<DocumentNode, Map<string, Requirement[] | null>>>();

export function memoizedRequirements(schema: GraphQLSchema, document: DocumentNode, operationName?: string | null): readonly Requirement[] | null {
  let bySchema = requirementsMemo.get(schema);
  if (!bySchema) requirementsMemo.set(schema, (bySchema = new WeakMap()));
  let byName = bySchema.get(document);
  if (!byName) bySchema.set(document, (byName = new Map()));
  const key = operationName ?? '';
  if (byName.has(key)) return byName.get(key)!;
  const found = operationRequirements(schema, document, operationName);
  byName.set(key, found);
  return found;
}

/** The refusal of this operation for its context's caller, or null (graphql-ws also uses it to close the connection). */
export function operationRefusal(args: { schema: GraphQLSchema; document: DocumentNode; operationName?: string | null | undefined; contextValue: unknown }): GraphQLError | null {
  const requirements = memoizedRequirements(args.schema, args.document, args.operationName);
  if (!requirements) return null; // graphql-js reports the missing operation itself
  return refusalFor((args.contextValue as Context).auth, requirements);
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
