/**
 * What an operation costs a tenant's request budget, in cost points. Pure: the
 * schema, the document and its variables give the requested cost before
 * anything runs; the same walk over the result's data gives the actual cost
 * after (Shopify's GraphQL Admin API does the same: requested vs actual).
 *
 * A point is one object returned or one SQL statement run:
 * - every object field costs 1 per object (scalars and enums cost 0); Relay's
 *   edge and PageInfo wrappers cost 0 (the node is the object);
 * - `first`/`last` multiply what is selected under the field (a page of 500
 *   jobs is 500 objects), a plain list counts `listSize` items (FIELD_PRICES),
 *   else DEFAULT_LIST_SIZE;
 * - a field that reads the database adds what it reads, in statements
 *   (READ_STATEMENTS). Reads are memoised per request (src/graphql/memo.ts),
 *   so each is counted once per operation however many objects share it: a
 *   page's `waitReason` reads the queue status once, not once per job.
 * Introspection is not walked: each `__schema` costs INTROSPECTION_PRICES.__schema
 * (the whole schema: hundreds of objects) and each `__type` its price, every alias
 * on its own, so 30 aliases of `__schema` cost 30 times one. Admin operations are
 * never priced (the budget is for tenants).
 */
import {
  getArgumentValues,
  getNamedType,
  getNullableType,
  isCompositeType,
  isListType,
  isObjectType,
  Kind,
  type DocumentNode,
  type FieldNode,
  type FragmentDefinitionNode,
  type GraphQLField,
  type GraphQLNamedType,
  type GraphQLSchema,
  type OperationDefinitionNode,
  type SelectionSetNode,
} from 'graphql';

/** Statements run by each memoised read (once per operation, whoever asks first). */
export const READ_STATEMENTS = {
  /** listJobs: one page. */
  jobPage: 1,
  /** countJobs, only when totalCount is selected. */
  jobCount: 1,
  /** getJob. */
  job: 1,
  /**
   * tenantQueueStatus: five reads (queues, scheduler row, windows, account, breakers) and one
   * busy-weight read per class with waiting work (three classes).
   */
  queueStatus: 8,
  /** One window-function query for the positions of a page's waiting jobs. */
  queuePositions: 1,
  /** The ledger row for the period. */
  usage: 1,
  usageHistory: 1,
  /** A submission: admission, insert, counters, commit (group commit shares more). */
  submit: 4,
  cancel: 4,
  /** webhookEndpoints, or one page of webhookDeliveries. */
  webhookEndpoints: 1,
  webhookDeliveryPage: 1,
  /** A webhook endpoint change: a count or lookup and the write. */
  webhookChange: 2,
} as const;
export type ReadName = keyof typeof READ_STATEMENTS;

/**
 * Introspection fields, by name: `__schema` answers about 300 types, fields and
 * arguments (GraphiQL's full query is 0.1 MB); `__type` one type. Any other `__`
 * field (there is none but `__typename`, free) costs 1.
 */
export const INTROSPECTION_PRICES: Readonly<Record<string, number>> = { __schema: 100, __type: 5 };

export interface FieldPrice {
  /** The memoised reads this field needs. */
  reads?: readonly ReadName[];
  /** Items a plain list returns at most (when it takes no `first`/`last`). */
  listSize?: number;
  /** Page size when `first`/`last` is not given (the resolver's default). */
  defaultPage?: number;
  /** Extra points from the arguments (e.g. the items of a bulk submission). */
  byArgs?: (args: Record<string, unknown>) => number;
}

/** Fields priced beyond "1 per object", by `Type.field`. */
export const FIELD_PRICES: Readonly<Record<string, FieldPrice>> = {
  'Query.job': { reads: ['job'] },
  'Query.jobs': { reads: ['jobPage'], defaultPage: 50 },
  'JobConnection.totalCount': { reads: ['jobCount'] },
  'JobConnection.edges': { listSize: 1 }, // the page size already multiplies what is under the connection
  'Job.waitReason': { reads: ['queueStatus'] },
  'Job.estimatedStartAt': { reads: ['queueStatus', 'queuePositions'] },
  'Me.queues': { reads: ['queueStatus'], listSize: 3 },
  'Me.estimatedDrainSeconds': { reads: ['queueStatus'] },
  'Me.usage': { reads: ['usage'] },
  'Me.usageHistory': { reads: ['usageHistory'], listSize: 50 },
  'Mutation.submitJob': { reads: ['submit'] },
  // A bulk submission writes every item: one point per 100 items on top of the statements.
  'Mutation.submitJobs': { reads: ['submit'], byArgs: (a) => Math.ceil(((a.input as { jobs?: unknown[] } | undefined)?.jobs?.length ?? 0) / 100) },
  'Mutation.cancelJob': { reads: ['cancel'] },
  'Subscription.tenantUsage': { reads: ['usage', 'queueStatus'] },
  'Subscription.jobUpdated': { reads: ['job'] },
  'TenantUsage.queues': { listSize: 3 },
  'Query.webhookEndpoints': { reads: ['webhookEndpoints'] },
  'Query.webhookDeliveries': { reads: ['webhookDeliveryPage'], defaultPage: 50 },
  'WebhookDeliveryConnection.edges': { listSize: 1 },
  'Mutation.createWebhookEndpoint': { reads: ['webhookChange'] },
  'Mutation.updateWebhookEndpoint': { reads: ['webhookChange'] },
  'Mutation.deleteWebhookEndpoint': { reads: ['webhookChange'] },
  'Mutation.rotateWebhookSecret': { reads: ['webhookChange'] },
};

export const DEFAULT_LIST_SIZE = 10;

/** Object types that only wrap others (no I/O of their own, no object worth a point). */
function isWrapper(type: GraphQLNamedType): boolean {
  return type.name === 'PageInfo' || type.name.endsWith('Edge');
}

export interface OperationCost {
  /** Points in all. */
  total: number;
  /** Of which objects returned. */
  objects: number;
  /** Of which statements (reads) run. */
  statements: number;
}

interface Walk {
  schema: GraphQLSchema;
  fragments: Map<string, FragmentDefinitionNode>;
  variables: Record<string, unknown>;
  reads: Set<ReadName>;
  objects: number;
  extra: number;
}

/** The operation the request runs: the named one, or the only one. */
export function selectOperation(document: DocumentNode, operationName?: string | null): OperationDefinitionNode | null {
  const ops = document.definitions.filter((d): d is OperationDefinitionNode => d.kind === Kind.OPERATION_DEFINITION);
  if (operationName) return ops.find((o) => o.name?.value === operationName) ?? null;
  return ops.length === 1 ? ops[0]! : null;
}

function fieldNodes(w: Walk, set: SelectionSetNode, out: FieldNode[] = [], seen = new Set<string>()): FieldNode[] {
  for (const s of set.selections) {
    if (s.kind === Kind.FIELD) out.push(s);
    else if (s.kind === Kind.INLINE_FRAGMENT) fieldNodes(w, s.selectionSet, out, seen);
    else if (!seen.has(s.name.value)) {
      seen.add(s.name.value); // a fragment spread twice in one selection is the same fields
      const f = w.fragments.get(s.name.value);
      if (f) fieldNodes(w, f.selectionSet, out, seen);
    }
  }
  return out;
}

function argsOf(field: GraphQLField<unknown, unknown>, node: FieldNode, variables: Record<string, unknown>): Record<string, unknown> {
  try {
    return getArgumentValues(field, node, variables);
  } catch {
    return {}; // invalid arguments: execution refuses them; priced as none
  }
}

function pageSize(args: Record<string, unknown>, price: FieldPrice | undefined): number | null {
  const n = typeof args.first === 'number' ? args.first : typeof args.last === 'number' ? args.last : null;
  if (n !== null) return Math.max(0, n);
  return price?.defaultPage ?? null;
}

/**
 * Walks a selection. Without `data`, every list is as long as it may be
 * (requested); with `data`, lists are as long as they were and only fields
 * that were resolved count (actual).
 */
function walk(w: Walk, typeName: string, set: SelectionSetNode, multiplier: number, data: unknown[] | null): void {
  const parent = w.schema.getType(typeName);
  if (!parent || !isObjectType(parent)) return;
  for (const node of fieldNodes(w, set)) {
    const name = node.name.value;
    if (name === '__typename') continue;
    const key = node.alias?.value ?? name;
    if (name.startsWith('__')) {
      w.extra += multiplier * (INTROSPECTION_PRICES[name] ?? 1);
      continue;
    }
    const field = parent.getFields()[name];
    if (!field) continue;
    // Actual: only parents that exist and resolved this field (present in their data).
    const values = data === null ? null : data.filter((d) => d !== null && typeof d === 'object' && key in (d as object)).map((d) => (d as Record<string, unknown>)[key]);
    if (values !== null && values.length === 0) continue;
    const price = FIELD_PRICES[`${parent.name}.${name}`];
    for (const r of price?.reads ?? []) w.reads.add(r);
    if (price?.byArgs) w.extra += price.byArgs(argsOf(field, node, w.variables));
    const named = getNamedType(field.type);
    if (!isCompositeType(named) || !node.selectionSet) continue;
    const list = isListType(getNullableType(field.type));
    const objectPoint = isWrapper(named) ? 0 : 1;
    if (values === null) {
      const page = pageSize(argsOf(field, node, w.variables), price);
      const items = list ? (price?.listSize ?? DEFAULT_LIST_SIZE) : 1;
      w.objects += multiplier * items * objectPoint;
      walk(w, named.name, node.selectionSet, multiplier * items * (page ?? 1), null);
    } else {
      const children = values.flatMap((v) => (Array.isArray(v) ? v : [v])).filter((v) => v !== null && v !== undefined);
      w.objects += children.length * objectPoint;
      walk(w, named.name, node.selectionSet, 1, children);
    }
  }
}

function cost(schema: GraphQLSchema, document: DocumentNode, variables: Record<string, unknown> | null | undefined, operationName: string | null | undefined, data: Record<string, unknown> | null | undefined): OperationCost | null {
  const op = selectOperation(document, operationName);
  if (!op) return null;
  const root = op.operation === 'query' ? schema.getQueryType() : op.operation === 'mutation' ? schema.getMutationType() : schema.getSubscriptionType();
  if (!root) return null;
  const fragments = new Map(document.definitions.filter((d): d is FragmentDefinitionNode => d.kind === Kind.FRAGMENT_DEFINITION).map((f) => [f.name.value, f]));
  const w: Walk = { schema, fragments, variables: variables ?? {}, reads: new Set(), objects: 0, extra: 0 };
  walk(w, root.name, op.selectionSet, 1, data === undefined ? null : data === null ? [] : [data]);
  const statements = [...w.reads].reduce((s, r) => s + READ_STATEMENTS[r], 0);
  const objects = Math.ceil(w.objects);
  // Every operation costs at least a point: answering it is never free.
  return { total: Math.max(1, objects + statements + w.extra), objects, statements };
}

/** What an operation may cost at most, from its document and variables (before it runs). */
export function requestedCost(schema: GraphQLSchema, document: DocumentNode, variables?: Record<string, unknown> | null, operationName?: string | null): OperationCost | null {
  return cost(schema, document, variables, operationName, undefined);
}

/** What it did cost: lists as long as they came back, fields as far as they resolved. Never more than requested. */
export function actualCost(
  schema: GraphQLSchema,
  document: DocumentNode,
  data: Record<string, unknown> | null | undefined,
  variables?: Record<string, unknown> | null,
  operationName?: string | null,
): OperationCost | null {
  const requested = requestedCost(schema, document, variables, operationName);
  const actual = cost(schema, document, variables, operationName, data ?? null);
  if (!requested || !actual) return actual;
  return actual.total > requested.total ? requested : actual;
}
