/**
 * Per-request memos and batches for resolvers, keyed by the request's context
 * object (one per HTTP request, one per graphql-ws operation), so a read that
 * many objects of one answer share runs once. The cost model
 * (src/graphql/cost.ts) counts each such read once per operation; these keep
 * that true.
 */
const memos = new WeakMap<object, Map<string, unknown>>();

function memoOf(ctx: object): Map<string, unknown> {
  let m = memos.get(ctx);
  if (!m) memos.set(ctx, (m = new Map()));
  return m;
}

/** `load()` once per request and key; every later caller gets the same promise. */
export function perRequest<T>(ctx: object, key: string, load: () => Promise<T>): Promise<T> {
  const m = memoOf(ctx);
  let p = m.get(key) as Promise<T> | undefined;
  if (!p) m.set(key, (p = load()));
  return p;
}

interface Batch<K, V> {
  keys: Set<K>;
  result: Promise<Map<K, V>>;
}

/**
 * DataLoader's shape, per request: the keys asked for while resolvers of one
 * answer are being started are loaded by one `loadMany` call. graphql-js
 * starts the resolvers of a list's items in one synchronous pass, so the
 * batch is sent on setImmediate, after every item has asked. A key asked for
 * after a batch left starts the next batch.
 */
export function batchLoad<K, V>(ctx: object, key: string, loadMany: (keys: K[]) => Promise<Map<K, V>>, k: K): Promise<V | undefined> {
  const m = memoOf(ctx);
  let batch = m.get(key) as Batch<K, V> | undefined;
  if (!batch) {
    const keys = new Set<K>();
    const result = new Promise<Map<K, V>>((resolve, reject) =>
      setImmediate(() => {
        if (m.get(key) === batch) m.delete(key);
        loadMany([...keys]).then(resolve, reject);
      }),
    );
    m.set(key, (batch = { keys, result }));
  }
  batch.keys.add(k);
  return batch.result.then((r) => r.get(k));
}
