/**
 * Front-door hardening: Yoga plugins that refuse abusive requests before
 * anything executes.
 *
 * - Query limits (graphql-armor's rules): depth, cost, aliases in validation,
 *   tokens while parsing. Each refusal is HTTP 400 with its own
 *   `extensions.code`, whatever the client's Accept header (Yoga would answer a
 *   plain `application/json` validation error with 200; Sluice's refusals keep
 *   one status, like 401/403/413). Limits count the document, never the
 *   variables: bulk input (10,000 jobs in `submitJobs`) belongs in variables.
 * - CSRF prevention (@graphql-yoga/plugin-csrf-prevention): a request a browser
 *   could send cross-site without a CORS preflight (a GET, or a POST with a
 *   "simple" content type: form-urlencoded, multipart/form-data, text/plain)
 *   must carry a header a page cannot set without a preflight:
 *   `x-graphql-yoga-csrf` or `authorization`. Refused with 403 CSRF_PREVENTED.
 *   JSON POSTs (GraphiQL's, every client's) and graphql-ws are not affected.
 */
import { GraphQLError, Kind, validate, visit, type ASTNode, type DocumentNode, type GraphQLSchema, type ParseOptions, type Source, type ValidationContext } from 'graphql';
import type { Plugin } from 'graphql-yoga';
import { useCSRFPrevention } from '@graphql-yoga/plugin-csrf-prevention';
import { costLimitRule } from '@escape.tech/graphql-armor-cost-limit';
import { maxAliasesRule } from '@escape.tech/graphql-armor-max-aliases';
import { maxDepthRule } from '@escape.tech/graphql-armor-max-depth';
import { MaxTokensParserWLexer } from '@escape.tech/graphql-armor-max-tokens';

export interface QueryLimits {
  /** Nested field levels (`{ me { usage { quota } } }` is 3); `__schema` introspection is exempt. */
  maxDepth: number;
  /**
   * graphql-armor's cost: 1 per scalar, 2 per object, children × 1.5 per level,
   * a `first:`/`last:` multiplies its subtree, whether written as a literal or passed as a
   * variable (`jobs(first: $n)` counts the value of `$n`). A full page of `jobs(first: 500)`
   * with every field costs about 41,000.
   */
  maxCost: number;
  /** Aliased fields in one operation (`__typename` aliases are free). */
  maxAliases: number;
  /** Lexical tokens in the document (not the variables). GraphiQL's introspection is about 200. */
  maxTokens: number;
}

/** The defaults (src/config/env.ts has the same numbers; a test checks they agree). */
export const DEFAULT_QUERY_LIMITS: QueryLimits = { maxDepth: 12, maxCost: 50_000, maxAliases: 30, maxTokens: 5_000 };

export function queryLimitsFromEnv(env: { MAX_QUERY_DEPTH: number; MAX_QUERY_COST: number; MAX_ALIASES: number; MAX_TOKENS: number }): QueryLimits {
  return { maxDepth: env.MAX_QUERY_DEPTH, maxCost: env.MAX_QUERY_COST, maxAliases: env.MAX_ALIASES, maxTokens: env.MAX_TOKENS };
}

export const LIMIT_CODES = {
  depth: 'QUERY_TOO_DEEP',
  cost: 'QUERY_TOO_COSTLY',
  aliases: 'TOO_MANY_ALIASES',
  tokens: 'TOO_MANY_TOKENS',
} as const;
export type LimitCode = (typeof LIMIT_CODES)[keyof typeof LIMIT_CODES];

const LIMIT_CODE_SET = new Set<unknown>(Object.values(LIMIT_CODES));

function limitError(code: LimitCode, armorError: GraphQLError, limit: number): GraphQLError {
  return new GraphQLError(armorError.message.replace(/^Syntax Error: /, ''), { extensions: { code, limit, http: { status: 400 } } });
}

/** Reports a validation-rule refusal as a validation error (so nothing executes) with our code. */
function reportAs(code: LimitCode, limit: number) {
  return (ctx: ValidationContext | null, err: GraphQLError) => {
    const error = limitError(code, err, limit);
    if (ctx) ctx.reportError(error);
    else throw error;
  };
}

/**
 * The document with every `first:`/`last:` argument given as a variable
 * replaced by the variable's value (or its declared default), as an integer
 * literal, so the cost rule multiplies by what the request really asks for.
 * graphql-armor's rule only sees literals: 30 aliases of `jobs(first: $n)`
 * would otherwise cost as if each took one item. Pure.
 */
export function inlinePageSizes(document: DocumentNode, variables: Record<string, unknown> | null | undefined): DocumentNode {
  const defaults = new Map<string, ASTNode>();
  for (const def of document.definitions) {
    if (def.kind !== Kind.OPERATION_DEFINITION) continue;
    for (const v of def.variableDefinitions ?? []) if (v.defaultValue) defaults.set(v.variable.name.value, v.defaultValue);
  }
  return visit(document, {
    Argument(node) {
      if ((node.name.value !== 'first' && node.name.value !== 'last') || node.value.kind !== Kind.VARIABLE) return undefined;
      const name = node.value.name.value;
      const given = variables?.[name];
      const fallback = defaults.get(name);
      const n = typeof given === 'number' ? given : fallback?.kind === Kind.INT ? Number(fallback.value) : NaN;
      if (!Number.isInteger(n)) return undefined;
      return { ...node, value: { kind: Kind.INT, value: String(n) } };
    },
  });
}

/**
 * The cost of a request whose page sizes come from variables, checked when it
 * executes (variables are known then; validation results are cached per
 * document, so a variable-dependent verdict must not be made there).
 * Returns the refusal, or null. Documents without a variable page size cost
 * what validation already measured.
 */
export function variableCostRefusal(schema: GraphQLSchema, document: DocumentNode, variables: Record<string, unknown> | null | undefined, maxCost: number): GraphQLError | null {
  if (!hasVariablePageSize(document)) return null;
  let refusal: GraphQLError | null = null;
  const rule = costLimitRule({
    exposeLimits: true,
    propagateOnRejection: false,
    maxCost,
    onReject: [(_ctx: unknown, err: GraphQLError) => (refusal = limitError(LIMIT_CODES.cost, err, maxCost))],
  });
  validate(schema, inlinePageSizes(document, variables), [rule]);
  return refusal;
}

/**
 * Yoga's parse cache hands out the same DocumentNode for the same query text, so the answer is kept
 * per document: the walk was ~3 % of a single submission's CPU when done on every request.
 */
const pageSizeVariables = new WeakMap<DocumentNode, boolean>();

function hasVariablePageSize(document: DocumentNode): boolean {
  let known = pageSizeVariables.get(document);
  if (known === undefined) pageSizeVariables.set(document, (known = findVariablePageSize(document)));
  return known;
}

function findVariablePageSize(document: DocumentNode): boolean {
  let found = false;
  visit(document, {
    Argument(node) {
      if ((node.name.value === 'first' || node.name.value === 'last') && node.value.kind === Kind.VARIABLE) found = true;
    },
  });
  return found;
}

export function useQueryLimits(limits: QueryLimits): Plugin {
  const common = { exposeLimits: true, propagateOnRejection: false } as const;
  const rules = [
    maxDepthRule({ ...common, n: limits.maxDepth, onReject: [reportAs(LIMIT_CODES.depth, limits.maxDepth)] }),
    costLimitRule({ ...common, maxCost: limits.maxCost, onReject: [reportAs(LIMIT_CODES.cost, limits.maxCost)] }),
    maxAliasesRule({ ...common, n: limits.maxAliases, onReject: [reportAs(LIMIT_CODES.aliases, limits.maxAliases)] }),
  ];
  const tokenReject = reportAs(LIMIT_CODES.tokens, limits.maxTokens); // no validation context while parsing: it throws
  const parseWithTokenLimit = (source: string | Source, options?: ParseOptions) => {
    const body = typeof source === 'string' ? source : source.body;
    // The parser recurses once per nesting level: bound the nesting before it runs, so a few KB of
    // `{a:{a:…` is refused, not a stack overflow (it is a 500 otherwise).
    const nesting = maxNesting(body);
    if (nesting > MAX_DOCUMENT_NESTING) throw nestingError(nesting);
    const parser = new MaxTokensParserWLexer(body, {
      ...options,
      n: limits.maxTokens,
      exposeLimits: true,
      onReject: [tokenReject],
      propagateOnRejection: true,
    });
    try {
      return parser.parseDocument();
    } catch (err) {
      if (err instanceof RangeError) throw nestingError(nesting); // a stack this small should not happen; still never a 500
      throw err;
    }
  };
  return {
    onParse({ setParseFn }) {
      setParseFn(parseWithTokenLimit);
    },
    onValidate({ addValidationRule }) {
      for (const rule of rules) addValidationRule(rule);
    },
    onExecute({ args, setResultAndStopExecution }) {
      const refusal = variableCostRefusal(args.schema, args.document, args.variableValues, limits.maxCost);
      if (refusal) setResultAndStopExecution({ errors: [refusal] });
    },
    onSubscribe({ args, setResultAndStopExecution }) {
      const refusal = variableCostRefusal(args.schema, args.document, args.variableValues, limits.maxCost);
      if (refusal) setResultAndStopExecution({ errors: [refusal] });
    },
    onResultProcess({ result, setResult }) {
      // Yoga marks parse and validation errors `http.spec`, which makes an application/json answer 200;
      // a status on the result itself wins, so a limit refusal is 400 for every client.
      if (Array.isArray(result) || Symbol.asyncIterator in result) return;
      if (!result.errors?.some((e) => LIMIT_CODE_SET.has(e.extensions?.code))) return;
      const extensions = (result.extensions ?? {}) as Record<string, unknown>;
      setResult({ ...result, extensions: { ...extensions, http: { ...(extensions.http as object | undefined), status: 400 } } });
    },
  };
}

/**
 * Deepest bracket nesting ({, [, ( ) in a document, outside strings and
 * comments. Pure and linear: it runs before the (recursive) parser. Unbalanced
 * input counts what it opened.
 */
export function maxNesting(doc: string): number {
  let depth = 0;
  let max = 0;
  for (let i = 0; i < doc.length; i++) {
    const c = doc[i];
    if (c === '#') {
      while (i < doc.length && doc[i] !== '\n' && doc[i] !== '\r') i++;
    } else if (c === '"') {
      if (doc.startsWith('"""', i)) {
        const end = doc.indexOf('"""', i + 3);
        i = end < 0 ? doc.length : end + 2;
      } else {
        for (i++; i < doc.length && doc[i] !== '"' && doc[i] !== '\n'; i++) if (doc[i] === '\\') i++;
      }
    } else if (c === '{' || c === '[' || c === '(') {
      if (++depth > max) max = depth;
    } else if (c === '}' || c === ']' || c === ')') {
      depth = Math.max(0, depth - 1);
    }
  }
  return max;
}

/** Far above any real operation (MAX_QUERY_DEPTH is 12), far below where the parser's recursion overflows. */
export const MAX_DOCUMENT_NESTING = 128;

function nestingError(nesting: number): GraphQLError {
  return new GraphQLError(`the document nests ${nesting} levels of brackets; at most ${MAX_DOCUMENT_NESTING}`, {
    extensions: { code: LIMIT_CODES.depth, limit: MAX_DOCUMENT_NESTING, http: { status: 400 } },
  });
}

/** Headers a cross-site page cannot add without a CORS preflight; one of them marks a request as not forged. */
export const CSRF_HEADERS = ['x-graphql-yoga-csrf', 'authorization'];

/** @graphql-yoga/plugin-csrf-prevention, with its refusal given a code (403 CSRF_PREVENTED). */
export function useCsrfPrevention(requestHeaders: string[] = CSRF_HEADERS): Plugin {
  const inner = useCSRFPrevention({ requestHeaders }) as Plugin;
  const check = inner.onRequestParse!;
  return {
    onRequestParse(payload) {
      try {
        return check(payload);
      } catch (err) {
        if (!(err instanceof GraphQLError)) throw err;
        throw new GraphQLError(
          `${err.message}: a GET or a form/text POST must carry one of these headers: ${requestHeaders.join(', ')} (or send a JSON POST)`,
          { extensions: { code: 'CSRF_PREVENTED', http: { status: 403 } } },
        );
      }
    },
  };
}

/** Every hardening plugin, in the order src/server.ts registers them. */
export function hardeningPlugins(limits: QueryLimits = DEFAULT_QUERY_LIMITS): Plugin[] {
  return [useCsrfPrevention(), useQueryLimits(limits)];
}
