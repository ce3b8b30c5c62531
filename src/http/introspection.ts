/**
 * Who may introspect the schema (INTROSPECTION):
 *  - `public`: anyone (the default with NODE_ENV=development);
 *  - `keys`: a tenant key or the admin token (the default otherwise); an
 *    anonymous `__schema` or `__type` is refused 401 UNAUTHENTICATED before
 *    anything runs, so 30 aliases of `__schema` from nobody cost a parse and a
 *    validation, not megabytes of answer;
 *  - `off`: nobody: 403 INTROSPECTION_DISABLED.
 * `__typename` is never introspection here: clients add it everywhere.
 * A key's introspection is charged to its tenant's request budget, each alias
 * of `__schema`/`__type` on its own (src/graphql/cost.ts INTROSPECTION_PRICES),
 * and aliases of them count against MAX_ALIASES like any other field.
 */
import { GraphQLError, Kind, type DocumentNode, type FragmentDefinitionNode, type SelectionSetNode } from 'graphql';
import type { Plugin } from 'graphql-yoga';

export type IntrospectionMode = 'public' | 'keys' | 'off';

const INTROSPECTION_FIELDS = new Set(['__schema', '__type']);

/**
 * How many `__schema` and `__type` fields the chosen operation selects at its
 * root, each alias counted and fragments followed (once per spread). Pure.
 */
export function introspectionFieldCount(document: DocumentNode, operationName?: string | null): number {
  const operations = document.definitions.filter((d) => d.kind === Kind.OPERATION_DEFINITION);
  const op = operationName ? operations.find((o) => o.name?.value === operationName) : operations.length === 1 ? operations[0] : undefined;
  if (!op) return 0;
  const fragments = new Map(document.definitions.filter((d): d is FragmentDefinitionNode => d.kind === Kind.FRAGMENT_DEFINITION).map((f) => [f.name.value, f]));
  let count = 0;
  const walk = (set: SelectionSetNode, path: ReadonlySet<string>) => {
    for (const sel of set.selections) {
      if (sel.kind === Kind.FIELD) {
        if (INTROSPECTION_FIELDS.has(sel.name.value)) count++;
      } else if (sel.kind === Kind.INLINE_FRAGMENT) walk(sel.selectionSet, path);
      else if (!path.has(sel.name.value)) {
        const frag = fragments.get(sel.name.value);
        if (frag) walk(frag.selectionSet, new Set([...path, sel.name.value])); // a cycle is invalid; validation reports it
      }
    }
  };
  walk(op.selectionSet, new Set());
  return count;
}

/** The refusal of an operation with `count` introspection fields for this caller, or null. Pure. */
export function introspectionRefusal(mode: IntrospectionMode, callerKind: string | undefined, count: number): GraphQLError | null {
  if (count === 0 || mode === 'public') return null;
  if (mode === 'off') {
    return new GraphQLError('introspection (__schema, __type) is off on this server (INTROSPECTION=off): the schema is in schema/schema.graphql of the release', {
      extensions: { code: 'INTROSPECTION_DISABLED', http: { status: 403 } },
    });
  }
  if (callerKind === 'tenant' || callerKind === 'admin') return null;
  return new GraphQLError('introspection (__schema, __type) needs an API key: send Authorization: Bearer <api key> (in GraphiQL, in the Headers tab, then reload the docs)', {
    extensions: { code: 'UNAUTHENTICATED', http: { status: 401, headers: { 'www-authenticate': 'Bearer' } } },
  });
}

export function useIntrospectionPolicy(mode: IntrospectionMode): Plugin {
  const check = (args: { document: DocumentNode; operationName?: string | null | undefined; contextValue: unknown }) => {
    if (mode === 'public') return null;
    const auth = (args.contextValue as { auth?: { kind: string } }).auth;
    return introspectionRefusal(mode, auth?.kind, introspectionFieldCount(args.document, args.operationName));
  };
  return {
    onExecute({ args, setResultAndStopExecution }) {
      const refused = check(args);
      if (refused) setResultAndStopExecution({ errors: [refused] });
    },
    onSubscribe({ args, setResultAndStopExecution }) {
      const refused = check(args);
      if (refused) setResultAndStopExecution({ errors: [refused] });
    },
  };
}
