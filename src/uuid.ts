/**
 * The one UUID check every id argument goes through (src/graphql/ids.ts, the usage routes, the
 * operator's job search). Strict on purpose: the canonical 8-4-4-4-12 hex form only. Postgres'
 * uuid cast accepts more (braces, no hyphens) and refuses less strict patterns with an error, so
 * anything that reaches a query as a uuid must have passed this first.
 */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Whether `value` is a UUID in canonical form (any case). Pure. */
export function isUuid(value: string): boolean {
  return UUID.test(value);
}
