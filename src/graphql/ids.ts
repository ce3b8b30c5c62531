import { SluiceError } from '../errors.ts';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** An id that is not a UUID names nothing: say NOT_FOUND rather than leak a database error. */
export function asId(value: string | number, what: string): string {
  const s = String(value);
  if (!UUID.test(s)) throw new SluiceError('NOT_FOUND', `no ${what} with id ${s}`);
  return s.toLowerCase();
}
