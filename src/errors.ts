/**
 * Every refusal Sluice gives carries a machine-readable code. Resolvers and
 * services throw SluiceError; the GraphQL layer turns it into a GraphQLError
 * with `extensions.code` (and an HTTP status where the whole request fails).
 */
export const ERROR_CODES = [
  'UNAUTHENTICATED',
  'FORBIDDEN',
  'NOT_FOUND',
  'BAD_USER_INPUT',
  'UNKNOWN_API',
  'MISSING_PARAMS',
  'BAD_PRIORITY',
  'TOO_MANY_ITEMS',
  'BODY_TOO_LARGE',
  'IDEMPOTENCY_CONFLICT',
  'NOT_CANCELLABLE',
  'BAD_RUN_AT',
  'NOT_RETRYABLE',
  'QUOTA_EXCEEDED',
  'QUEUE_FULL',
  'TENANT_SUSPENDED',
  'TENANT_BUSY',
  // Reserved shares (src/tenants/store.ts): the sum over tenants stays <= RESERVED_MAX (scheduler/lease.ts).
  'RESERVATION_OVERCOMMITTED',
  // Webhook endpoints (src/graphql/schema/webhooks.ts):
  'BAD_WEBHOOK_URL',
  'TOO_MANY_WEBHOOK_ENDPOINTS',
  // Refused before execution by the front door (src/http/hardening.ts):
  'QUERY_TOO_DEEP',
  'QUERY_TOO_COSTLY',
  'TOO_MANY_ALIASES',
  'TOO_MANY_TOKENS',
  'CSRF_PREVENTED',
  // Survive the real world (src/db/availability.ts, src/http/input.ts):
  'DATABASE_UNAVAILABLE',
  'BAD_REQUEST',
  'NOT_ACCEPTABLE',
  'UNSUPPORTED_MEDIA_TYPE',
  'HEADERS_TOO_LARGE',
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

export class SluiceError extends Error {
  override name = 'SluiceError';
  readonly code: ErrorCode;
  readonly extensions: Record<string, unknown>;
  readonly httpStatus: number | undefined;
  /** HTTP headers for the response (e.g. Retry-After); ignored over WebSocket. */
  readonly httpHeaders: Record<string, string> | undefined;
  constructor(code: ErrorCode, message: string, extensions: Record<string, unknown> = {}, httpStatus?: number, httpHeaders?: Record<string, string>) {
    super(message);
    this.code = code;
    this.extensions = extensions;
    this.httpStatus = httpStatus;
    this.httpHeaders = httpHeaders;
  }
}

/**
 * `make()` with no stack trace captured: for an expected answer (a QUEUE_FULL refusal and its
 * GraphQL form), whose stack nobody reads or logs, and which under pressure is built thousands of
 * times a second (capturing one was several times the cost of the error itself).
 */
export function withoutStack<T>(make: () => T): T {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return make();
  } finally {
    Error.stackTraceLimit = limit;
  }
}
