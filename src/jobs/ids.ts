/**
 * Job ids: time-ordered UUIDs (version 7, RFC 9562), monotonic within a process.
 *
 * Why not random (v4) ids: a job id is the primary key of `jobs` and, with its queue name, of
 * `pgboss.job`. Random keys land on random btree leaf pages, so a 10,000-job submission touches
 * (and dirties, and logs) leaf pages all over both primary keys; ids that grow with time append to
 * the rightmost leaves instead. Measured on 10,000-row inserts in a rolled-back transaction
 * (bench/README.md, ingest): about 20 % less time for each of the two inserts.
 *
 * Layout: 48-bit Unix milliseconds | version 7 | a 30-bit counter (12 bits of rand_a and the top
 * 18 bits of rand_b) | variant | 44 random bits. The counter starts at a random value below 2^29
 * in each new millisecond and counts up within it, so ids of one process sort in the order they
 * were made (the jobs of one submission in submission order; their `created_at` is the same) and
 * 2^29 ids fit in a millisecond; past that the millisecond borrows from the next one. 44 random
 * bits (plus the counter's random start) keep ids unguessable across processes and collisions
 * out of reach, as v4 did; nothing reads meaning from a job id.
 */
import { randomBytes } from 'node:crypto';

const COUNTER_BITS = 30;
const COUNTER_MAX = 2 ** COUNTER_BITS - 1;

/** The generator's state: the millisecond of the last id and the counter within it. */
export interface IdClock {
  ms: number;
  counter: number;
}

/**
 * The (ms, counter) of the next id after `last`, at wall time `now`: pure, so its ordering can be
 * checked. `seed` is a random value in [0, 1) for a new millisecond's counter start.
 */
export function nextStamp(last: IdClock, now: number, seed: number): IdClock {
  if (now > last.ms) return { ms: now, counter: Math.floor(seed * 2 ** (COUNTER_BITS - 1)) };
  // Same millisecond (or the clock stepped back): count on, borrowing the next millisecond when full.
  if (last.counter < COUNTER_MAX) return { ms: last.ms, counter: last.counter + 1 };
  return { ms: last.ms + 1, counter: Math.floor(seed * 2 ** (COUNTER_BITS - 1)) };
}

const HEX = Array.from({ length: 256 }, (_, i) => i.toString(16).padStart(2, '0'));

/** The UUID text of a stamp and 6 random bytes (44 bits used). Pure. */
export function formatV7(stamp: IdClock, rand: Uint8Array, offset = 0): string {
  const ms = stamp.ms;
  const hi = Math.floor(ms / 2 ** 16); // the top 32 of the 48 time bits
  const c = stamp.counter; // 30 bits: 12 into rand_a, 18 into the top of rand_b
  return (
    HEX[(hi >>> 24) & 0xff]! + HEX[(hi >>> 16) & 0xff]! + HEX[(hi >>> 8) & 0xff]! + HEX[hi & 0xff]! + '-' +
    HEX[(ms >>> 8) & 0xff]! + HEX[ms & 0xff]! + '-' +
    HEX[0x70 | ((c >>> 26) & 0x0f)]! + HEX[(c >>> 18) & 0xff]! + '-' +
    HEX[0x80 | ((c >>> 12) & 0x3f)]! + HEX[(c >>> 4) & 0xff]! + '-' +
    HEX[((c & 0x0f) << 4) | (rand[offset]! & 0x0f)]! +
    HEX[rand[offset + 1]!]! + HEX[rand[offset + 2]!]! + HEX[rand[offset + 3]!]! + HEX[rand[offset + 4]!]! + HEX[rand[offset + 5]!]!
  );
}

let clock: IdClock = { ms: 0, counter: 0 };

/**
 * Random bytes for small batches, drawn from a pool refilled 8 KiB at a time: one
 * `randomBytes` call per submission (a getrandom system call and a new Buffer) was a visible
 * share of a single submission's CPU under load. Large batches draw their own. Bytes are never
 * handed out twice.
 */
const POOL_BYTES = 8192;
let pool = Buffer.alloc(0);
let poolAt = 0;

function randomChunk(size: number): { bytes: Buffer; at: number } {
  if (size > POOL_BYTES / 4) return { bytes: randomBytes(size), at: 0 };
  if (poolAt + size > pool.length) {
    pool = randomBytes(POOL_BYTES);
    poolAt = 0;
  }
  const at = poolAt;
  poolAt += size;
  return { bytes: pool, at };
}

/** `n` new job ids, ascending. */
export function newJobIds(n: number): string[] {
  const { bytes: rand, at } = randomChunk(6 * n + 8);
  const out: string[] = new Array(n);
  const now = Date.now();
  for (let i = 0; i < n; i++) {
    clock = nextStamp(clock, now, rand.readUInt32BE(at + 6 * n + (i % 2) * 4) / 2 ** 32);
    out[i] = formatV7(clock, rand, at + 6 * i);
  }
  return out;
}
