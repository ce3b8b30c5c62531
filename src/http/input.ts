/**
 * Input hardening at the GraphQL layer, for HTTP and graphql-ws alike:
 *  - strings with a NUL byte or a lone UTF-16 surrogate are refused with
 *    BAD_USER_INPUT naming the field (Postgres cannot store either in text or
 *    jsonb, so they used to surface as INTERNAL_SERVER_ERROR), in variables and
 *    in literals written into the document;
 *  - a GET whose `variables` or `extensions` is not a JSON object is refused
 *    with 400 BAD_REQUEST before Yoga sees it (it answered 500);
 *  - Yoga's bodiless 406 and 415 get a body with a code.
 * The checks are pure functions; the plugin only wires them in.
 */
import { GraphQLError, Kind, type ASTNode, type ASTVisitor, type ValidationContext } from 'graphql';
import type { Plugin } from 'graphql-yoga';

/** Why a string is refused, or null. */
export function badString(s: string): string | null {
  if (s.includes('\u0000')) return 'contains a NUL byte (\\u0000)';
  if (!s.isWellFormed()) return 'contains a lone UTF-16 surrogate (not valid Unicode)';
  return null;
}

/** The first bad string (or object key) in a JSON-like value, with its path, or null. */
export function findBadString(value: unknown, path: string, depth = 0): { field: string; reason: string } | null {
  if (depth > 64) return null; // deeper values are refused elsewhere (params are flat); do not recurse without bound
  if (typeof value === 'string') {
    const reason = badString(value);
    return reason ? { field: path, reason } : null;
  }
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = findBadString(value[i], `${path}[${i}]`, depth + 1);
      if (found) return found;
    }
    return null;
  }
  if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      const keyReason = badString(k);
      if (keyReason) return { field: `${path} (a key)`, reason: keyReason };
      const found = findBadString(v, path ? `${path}.${k}` : k, depth + 1);
      if (found) return found;
    }
  }
  return null;
}

export function badInput(field: string, reason: string): GraphQLError {
  return new GraphQLError(`${field} ${reason}`, { extensions: { code: 'BAD_USER_INPUT', field, http: { status: 400 } } });
}

/** The argument path of a literal (`submitJob.input.params.domain`), from the validation visitor's ancestors. */
function literalPath(ancestors: ReadonlyArray<ASTNode | ReadonlyArray<ASTNode>>): string {
  const names: string[] = [];
  for (const a of ancestors) {
    if (Array.isArray(a)) continue;
    const node = a as ASTNode;
    if (node.kind === Kind.FIELD) names.length = 0, names.push(node.name.value);
    else if (node.kind === Kind.ARGUMENT || node.kind === Kind.OBJECT_FIELD) names.push(node.name.value);
  }
  return names.join('.') || 'a string literal';
}

/** A validation rule: string literals in the document must be storable text. */
export function storableStringsRule(context: ValidationContext): ASTVisitor {
  return {
    StringValue(node, _key, _parent, _path, ancestors) {
      const reason = badString(node.value);
      if (reason) context.reportError(badInput(literalPath(ancestors as ReadonlyArray<ASTNode>), reason));
    },
  };
}

function checkVariables(variables: unknown): GraphQLError | null {
  const found = findBadString(variables ?? {}, '');
  return found ? badInput(found.field ? `$${found.field}` : 'variables', found.reason) : null;
}

export function useInputHardening(): Plugin {
  return {
    onValidate({ addValidationRule }) {
      addValidationRule(storableStringsRule);
    },
    onExecute({ args, setResultAndStopExecution }) {
      const error = checkVariables(args.variableValues);
      if (error) setResultAndStopExecution({ errors: [error] });
    },
    onSubscribe({ args, setResultAndStopExecution }) {
      const error = checkVariables(args.variableValues);
      if (error) setResultAndStopExecution({ errors: [error] });
    },
  };
}

type CodedError = { message: string; extensions: { code: string } & Record<string, unknown> };

/** A GET's `variables` and `extensions` must be JSON objects when present: the refusal, or null. */
export function checkGetRequest(params: URLSearchParams): CodedError | null {
  for (const name of ['variables', 'extensions']) {
    const raw = params.get(name);
    if (raw === null || raw === '') continue;
    let value: unknown;
    try {
      value = JSON.parse(raw);
    } catch {
      return { message: `the ${name} query parameter is not valid JSON`, extensions: { code: 'BAD_REQUEST', field: name } };
    }
    if (value !== null && (typeof value !== 'object' || Array.isArray(value))) {
      return { message: `the ${name} query parameter must be a JSON object`, extensions: { code: 'BAD_REQUEST', field: name } };
    }
  }
  return null;
}

/** A body for Yoga's empty-bodied refusals. */
export function codedEmptyError(status: number): CodedError | null {
  if (status === 406) return { message: 'no acceptable response type: accept application/json, application/graphql-response+json or text/event-stream', extensions: { code: 'NOT_ACCEPTABLE' } };
  if (status === 415) return { message: 'unsupported content type: send application/json (or a GET)', extensions: { code: 'UNSUPPORTED_MEDIA_TYPE' } };
  return null;
}
