/**
 * `npm run bench -- <name> [--flags]`: runs one benchmark and prints ONE JSON
 * object on stdout (progress goes to stderr). See bench/README.md.
 *
 * A benchmark is a module with `description` and `run(pg, flags)`; add one to
 * BENCHMARKS below.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { FlagReader, parseArgs } from './lib/args.ts';
import { progress } from './lib/log.ts';
import { machine } from './lib/machine.ts';
import { benchPostgres, type BenchPostgres } from './lib/pg.ts';
import type { Check } from './lib/stats.ts';
import * as fairness from './fairness.ts';
import * as fairnessKeys from './fairness-keys.ts';
import * as badDay from './bad-day.ts';
import * as dispatch from './dispatch.ts';
import * as overload from './overload.ts';
import * as batching from './batching.ts';
import * as ingest from './ingest.ts';
import * as fanout from './fanout.ts';
import * as cluster from './cluster.ts';
import * as consoleReads from './console.ts';
import * as maintenance from './maintenance.ts';
import * as chaos from './chaos.ts';
import * as noisyNeighbor from './noisy-neighbor.ts';
import * as learnedPace from './learned-pace.ts';
import * as providerTrust from './provider-trust.ts';
import * as webhooks from './webhooks.ts';
import * as reservedShare from './reserved-share.ts';

interface Benchmark {
  description: string;
  run(pg: BenchPostgres, flags: FlagReader): Promise<{ summary: unknown; targets: Record<string, Check>; [k: string]: unknown }>;
}

const BENCHMARKS: Record<string, Benchmark> = {
  fairness,
  'fairness-keys': fairnessKeys,
  'bad-day': badDay,
  dispatch,
  overload,
  batching,
  ingest,
  fanout,
  cluster,
  console: consoleReads,
  maintenance,
  chaos,
  'noisy-neighbor': noisyNeighbor,
  'learned-pace': learnedPace,
  'provider-trust': providerTrust,
  webhooks,
  'reserved-share': reservedShare,
};

function usage(): string {
  return [
    'usage: npm run bench -- <name> [--flags]   (one JSON object on stdout; see bench/README.md)',
    ...Object.entries(BENCHMARKS).map(([n, b]) => `  ${n.padEnd(10)} ${b.description}`),
    '  common flags: --inproc (Sluice in the bench process), --env K=V,K=V (extra Sluice settings), --strict (exit 1 when a target fails), --out FILE (also write the JSON there), --pg embedded (a private embedded Postgres instead of BENCH_DATABASE_URL / the local server)',
  ].join('\n');
}

const { name, flags: raw } = parseArgs(process.argv.slice(2));
if (!name || name === 'help' || raw.help) {
  process.stderr.write(usage() + '\n');
  process.exit(name ? 0 : 2);
}
const bench = BENCHMARKS[name];
if (!bench) {
  process.stderr.write(`unknown benchmark "${name}"\n${usage()}\n`);
  process.exit(2);
}
const flags = new FlagReader(raw);
/** The code measured: HEAD, uncommitted changes under src/ and drizzle/ (read-only git), and a hash of their contents. */
function sourceState() {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const hash = createHash('sha256');
  for (const dir of ['src', 'drizzle']) {
    for (const f of (readdirSync(path.join(root, dir), { recursive: true }) as string[]).sort()) {
      const p = path.join(root, dir, f);
      if (statSync(p).isFile()) hash.update(f).update(readFileSync(p));
    }
  }
  let git: { commit: string; uncommittedInSrc: string[] } | null = null;
  try {
    const run = (...a: string[]) => execFileSync('git', a, { cwd: root, encoding: 'utf8' }).trim();
    git = { commit: run('rev-parse', '--short', 'HEAD'), uncommittedInSrc: run('status', '--porcelain', '--', 'src', 'drizzle').split('\n').filter(Boolean) };
  } catch {
    // not a git checkout
  }
  return { ...git, contentHash: hash.digest('hex').slice(0, 16) };
}
const sourceAtStart = sourceState();
const strict = flags.bool('strict');
const outFile = flags.optionalString('out');
const before = machine();
const startedAt = new Date();
const pgChoice = flags.string('pg', 'auto');
if (pgChoice !== 'auto' && pgChoice !== 'embedded') throw new Error('--pg is auto or embedded');
const pg = await benchPostgres(pgChoice);
progress(`${name}: Postgres ${pg.version} (${pg.source}); ${before.cores} cores, load ${before.loadavg.join(' ')}`);
let exitCode = 0;
try {
  const result = await bench.run(pg, flags);
  const targets = result.targets;
  const judged = Object.values(targets).filter((t) => t.pass !== null);
  const failed = Object.entries(targets).filter(([, t]) => t.pass === false).map(([k]) => k);
  const out = {
    benchmark: name,
    startedAt: startedAt.toISOString(),
    durationS: Math.round((Date.now() - startedAt.getTime()) / 100) / 10,
    flags: raw,
    machine: { ...before, loadavgAfter: machine().loadavg },
    source: (() => {
      const end = sourceState();
      return { ...sourceAtStart, changedDuringRun: end.contentHash !== sourceAtStart.contentHash, ...(end.contentHash !== sourceAtStart.contentHash ? { atEnd: end } : {}) };
    })(),
    postgres: { source: pg.source, version: pg.version, settings: pg.settings },
    allTargetsPass: judged.length > 0 && failed.length === 0,
    failedTargets: failed,
    ...result,
  };
  const text = JSON.stringify(out, null, 2) + '\n';
  process.stdout.write(text);
  if (outFile) writeFileSync(outFile, text);
  if (strict && failed.length > 0) exitCode = 1;
} catch (err) {
  process.stderr.write(`benchmark ${name} failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  exitCode = 1;
} finally {
  await pg.stop();
}
process.exit(exitCode);
