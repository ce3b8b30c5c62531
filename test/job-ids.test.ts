import { test } from 'node:test';
import assert from 'node:assert/strict';
import { formatV7, newJobIds, nextStamp } from '../src/jobs/ids.ts';

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

test('job ids are version-7 UUIDs, unique and ascending in the order they were made (also across calls)', () => {
  const ids = [...newJobIds(20_000), ...newJobIds(1), ...newJobIds(5_000)];
  for (const id of ids) assert.match(id, UUID_V7);
  assert.equal(new Set(ids).size, ids.length);
  for (let i = 1; i < ids.length; i++) assert.ok(ids[i - 1]! < ids[i]!, `${ids[i - 1]} < ${ids[i]}`);
  // The leading 48 bits are the creation time in milliseconds.
  const ms = parseInt(ids[0]!.replace(/-/g, '').slice(0, 12), 16);
  assert.ok(Math.abs(ms - Date.now()) < 60_000);
});

test('a full millisecond borrows the next one; a clock that steps back does not reorder ids', () => {
  const full = { ms: 1000, counter: 2 ** 30 - 1 };
  assert.deepEqual(nextStamp(full, 1000, 0), { ms: 1001, counter: 0 });
  assert.deepEqual(nextStamp({ ms: 1000, counter: 5 }, 900, 0.5), { ms: 1000, counter: 6 });
  const r = new Uint8Array(6).fill(0xff);
  const a = formatV7({ ms: 1000, counter: 2 ** 30 - 1 }, r);
  const b = formatV7(nextStamp({ ms: 1000, counter: 2 ** 30 - 1 }, 1000, 0), new Uint8Array(6));
  assert.ok(a < b);
  assert.match(a, UUID_V7);
});

test('small batches (drawn from the random pool, across its refills) never share random bytes', () => {
  const ids: string[] = [];
  for (let i = 0; i < 6_000; i++) ids.push(...newJobIds(1 + (i % 3)));
  assert.equal(new Set(ids).size, ids.length);
  for (let i = 1; i < ids.length; i++) assert.ok(ids[i - 1]! < ids[i]!, `${ids[i - 1]} < ${ids[i]}`);
  // The last 11 hex digits are 44 random bits: bytes handed out twice would repeat them.
  const tails = ids.map((id) => id.slice(-11));
  assert.equal(new Set(tails).size, tails.length, 'a random tail repeated');
});
