import { SluiceError } from '../errors.ts';
import { isUuid } from '../uuid.ts';

/**
 * An id argument, checked: a malformed one is the caller's mistake, BAD_USER_INPUT naming the
 * argument (`field`), never a database error. A well-formed id that names nothing is for the
 * caller to report (NOT_FOUND, or null where the field says so).
 */
export function asId(value: string | number, what: string, field = 'id'): string {
  const s = String(value);
  if (!isUuid(s)) throw new SluiceError('BAD_USER_INPUT', `${field} is not a ${what} id: ids are UUIDs (8-4-4-4-12 hex digits)`, { field });
  return s.toLowerCase();
}
