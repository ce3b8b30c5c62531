/**
 * Which waiting settlements one settlement flusher takes (pure; the dispatcher's flush loop is the
 * I/O around it).
 *
 * A settlement transaction locks its tenants' sched_tenants rows (the lock order). Two flushers of
 * the same process settling the same tenant would only queue behind each other on those rows, each
 * holding a pool connection idle in transaction meanwhile: with 10 tenants and 12 flushers, about
 * half of the sampled busy backends of bench dispatch waited on row locks. So a flusher takes, in
 * queue order, only units none of whose tenants another flusher of this process is settling, up to
 * `max` attempts (a first unit always fits). A unit it skips waits for the flusher that holds its
 * tenant, which looks at the queue again when its transaction ends.
 */
export interface SettleUnitShape {
  tenants: readonly string[];
  size: number;
}

/** Indices (ascending) of the units to take; `one`: a single unit (a flusher after a failure). */
export function pickSettleUnits(units: readonly SettleUnitShape[], busy: ReadonlySet<string>, max: number, one: boolean): number[] {
  const picked: number[] = [];
  let count = 0;
  for (let i = 0; i < units.length; i++) {
    const u = units[i]!;
    if (u.tenants.some((t) => busy.has(t))) continue;
    if (picked.length > 0 && (one || count + u.size > max)) break;
    picked.push(i);
    count += u.size;
  }
  return picked;
}
