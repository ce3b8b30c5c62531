/**
 * Which errors are the caller's, for the log: a caller's mistake (a malformed id, an unknown job,
 * a refused field, a variable of the wrong type) is answered with its code and never logged above
 * info level; only what nobody meant to throw (a bug, a database error) is logged as an error.
 */
import { GraphQLError } from 'graphql';
import { SluiceError } from '../errors.ts';

/**
 * Whether an error reaching the error mask was made on purpose for the caller: a SluiceError, or
 * a GraphQLError down to its innermost cause (graphql-js wraps what a resolver or a scalar threw;
 * a validation or coercion error is a GraphQLError all the way). The same test decides that the
 * mask shows the error as it is rather than as INTERNAL_SERVER_ERROR. Pure.
 */
export function isCallerError(error: unknown): boolean {
  let e: unknown = error;
  for (let depth = 0; depth < 10; depth++) {
    if (e instanceof SluiceError) return true;
    if (!(e instanceof GraphQLError)) return false;
    if (e.originalError == null) return true;
    e = e.originalError;
  }
  return false;
}
