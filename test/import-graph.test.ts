/**
 * The modules under src/ import each other without circles (type-only imports included: a
 * circle of types is still two modules that cannot be understood one without the other), the
 * pure decision modules load no I/O library, and imports run down the floors (FLOORS below,
 * docs/ARCHITECTURE.md "Floors"): an import of a higher floor fails unless UPWARD names it with
 * its reason.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../src', import.meta.url));

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = path.join(dir, f);
    return statSync(p).isDirectory() ? sourceFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

const IMPORT = /^(?:import|export)\s[^;]*?\sfrom\s+'([^']+)'/gms;

function imports(file: string): string[] {
  return [...readFileSync(file, 'utf8').matchAll(IMPORT)].map((m) => m[1]!);
}

/** What a module loads when it runs: its imports less the type-only ones (erased at run time). */
function runtimeImports(file: string): string[] {
  return [...readFileSync(file, 'utf8').matchAll(IMPORT)].filter((m) => !/^(?:import|export)\s+type\s/.test(m[0])).map((m) => m[1]!);
}

/** Strongly connected components of more than one module (Tarjan). */
function circles(graph: Map<string, string[]>): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string) => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1) out.push(component.sort());
    }
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return out;
}

const files = sourceFiles(SRC);
const graph = new Map(
  files.map((f) => [
    path.relative(SRC, f),
    imports(f)
      .filter((s) => s.startsWith('.'))
      .map((s) => path.relative(SRC, path.resolve(path.dirname(f), s))),
  ]),
);

test('src/ has no import circles', () => {
  assert.deepEqual(circles(graph), []);
});

test('the circle finder finds a circle', () => {
  assert.deepEqual(circles(new Map([['a', ['b']], ['b', ['c']], ['c', ['a']], ['d', ['a']]])), [['a', 'b', 'c']]);
});

test('pure decision modules load no I/O library, directly or through our modules', () => {
  const pure = ['scheduler/fair.ts', 'scheduler/pacer.ts', 'scheduler/pool.ts', 'scheduler/ledger.ts', 'scheduler/lease.ts', 'scheduler/waits.ts', 'admission/rules.ts', 'admission/plan.ts', 'admission/edge.ts', 'dispatch/retry.ts', 'dispatch/batching.ts', 'provider/classify.ts'];
  const io = /^(pg-boss|postgres|drizzle-orm|graphql-yoga|ws|node:http|node:net)$/;
  for (const start of pure) {
    const seen = new Set<string>();
    const walk = (m: string) => {
      if (seen.has(m)) return;
      seen.add(m);
      const file = path.join(SRC, m);
      const specs = runtimeImports(file);
      const bad = specs.filter((s) => io.test(s));
      assert.deepEqual(bad, [], `${start} loads ${bad.join(', ')} through ${m}`);
      for (const s of specs.filter((x) => x.startsWith('.'))) walk(path.relative(SRC, path.resolve(path.dirname(file), s)));
    };
    walk(start);
  }
});

/**
 * Each module's floor: the longest matching prefix wins. Low to high:
 * 0 leaves: configuration, errors, logging, tracing, the provider's contract, pure string and
 *   secret helpers, the commit gate's type;
 * 1 pure models (no I/O): the scheduler's arithmetic, admission's rules, dispatch's rules, validation;
 * 2 the store: pools, schema, migrations, settings, the SQL-function gateway;
 * 3 table owners (each table's one writing module) and the event bus;
 * 4 services built on the owners (jobs' submit and cancel);
 * 5 processes: dispatch loops, sweeper, reconcile, the tenant lifecycle, retention;
 * 6 visibility; 7 GraphQL (and the request budget, a Yoga plugin); 8 HTTP and metrics;
 * 9 the process: server, app, main, scripts, the simulator.
 */
export const FLOORS: [prefix: string, floor: number][] = [
  ['config/', 0], ['errors.ts', 0], ['uuid.ts', 0], ['log.ts', 0], ['tracing/', 0], ['provider/', 0],
  ['http/input.ts', 0], ['http/client-address.ts', 0], ['http/deadline.ts', 0], ['tenants/keys.ts', 0],
  ['scheduler/', 1], ['admission/rules.ts', 1], ['admission/plan.ts', 1], ['admission/edge.ts', 1], ['dispatch/retry.ts', 1],
  ['dispatch/batching.ts', 1], ['dispatch/liveness.ts', 1], ['dispatch/settle-groups.ts', 1], ['jobs/validate.ts', 1],
  ['tenants/policy.ts', 1], ['tenants/api-keys.ts', 1], ['graphql/cost.ts', 1], ['db/availability.ts', 1],
  ['db/', 2],
  ['scheduler/sql/', 3], ['jobs/store.ts', 3], ['tenants/', 3], ['admission/', 3], ['alerts/', 3], ['usage/', 3],
  ['queue/', 3], ['webhooks/', 3], ['events/', 3],
  ['jobs/', 4],
  ['dispatch/', 5], ['scheduler/sweeper.ts', 5], ['scheduler/sweeper-duties.ts', 5], ['scheduler/reconcile.ts', 5], ['tenants/lifecycle.ts', 5], ['retention/', 5],
  ['visibility/', 6],
  ['graphql/', 7], ['http/budget.ts', 7],
  ['http/', 8], ['metrics.ts', 8], ['metrics-snapshot.ts', 8],
  ['server.ts', 9], ['app.ts', 9], ['upstream.ts', 9], ['main.ts', 9], ['scripts/', 9], ['simulator/', 9],
];

export function floorOf(module: string): number {
  let best: [string, number] | undefined;
  for (const entry of FLOORS) if (module.startsWith(entry[0]) && (!best || entry[0].length > best[0].length)) best = entry;
  if (!best) throw new Error(`${module} has no floor: add it to FLOORS in test/import-graph.test.ts`);
  return best[1];
}

/** The imports allowed to run up a floor, each with why (docs/ARCHITECTURE.md "Floors"). At most 3. */
const UPWARD: Record<string, string> = {
  'visibility/status.ts -> graphql/context.ts':
    'type only: the reads take the composed `Services` bag (sql, catalog, windows, jobs) the GraphQL context carries; erased at run time',
  'visibility/console.ts -> graphql/context.ts':
    'type only: the tenantTable page query takes the same `Services` bag as the status reads; erased at run time',
};

function upwardImports(g: Map<string, string[]>): string[] {
  return [...g].flatMap(([from, tos]) => tos.filter((to) => floorOf(to) > floorOf(from)).map((to) => `${from} -> ${to}`)).sort();
}

const upward = upwardImports(graph);

test('the floor check sees an import running up', () => {
  assert.deepEqual(upwardImports(new Map([['db/settings.ts', ['tenants/store.ts', 'config/env.ts']], ['graphql/x.ts', ['db/client.ts']]])), ['db/settings.ts -> tenants/store.ts']);
});

test('every module has a floor', () => {
  for (const m of graph.keys()) floorOf(m);
});

test('imports run down the floors, but for the few named with their reason', () => {
  assert.ok(Object.keys(UPWARD).length <= 3, 'at most 3 upward imports may be allowed');
  assert.deepEqual(upward.filter((u) => !(u in UPWARD)), [], 'an import runs up a floor: move the code down, or name it in UPWARD with why');
  assert.deepEqual(Object.keys(UPWARD).filter((u) => !upward.includes(u)), [], 'an allowed upward import no longer exists: remove it from UPWARD');
});
