/**
 * The modules under src/ import each other without circles (type-only imports included: a
 * circle of types is still two modules that cannot be understood one without the other), and
 * the pure decision modules load no I/O library.
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
  const pure = ['scheduler/fair.ts', 'scheduler/pacer.ts', 'scheduler/pool.ts', 'scheduler/ledger.ts', 'scheduler/lease.ts', 'scheduler/waits.ts', 'admission/rules.ts', 'admission/plan.ts', 'dispatch/retry.ts', 'dispatch/batching.ts', 'provider/classify.ts'];
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
