/**
 * Flag parsing for `npm run bench -- <name> [--flags]`: `--key value`,
 * `--key=value` and bare `--flag` (true). Unknown flags are an error, so a
 * typo does not silently run the default.
 */
export type Flags = Record<string, string | true>;

export function parseArgs(argv: readonly string[]): { name: string | undefined; flags: Flags } {
  const flags: Flags = {};
  let name: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a.startsWith('--')) {
      const eq = a.indexOf('=');
      if (eq > 0) {
        flags[a.slice(2, eq)] = a.slice(eq + 1);
        continue;
      }
      const key = a.slice(2);
      const next = argv[i + 1];
      if (next !== undefined && !next.startsWith('--')) {
        flags[key] = next;
        i++;
      } else flags[key] = true;
    } else if (name === undefined) name = a;
    else throw new Error(`unexpected argument "${a}"`);
  }
  return { name, flags };
}

export class FlagReader {
  private readonly flags: Flags;
  private readonly used = new Set<string>();
  constructor(flags: Flags) {
    this.flags = flags;
  }
  number(key: string, def: number): number {
    this.used.add(key);
    const v = this.flags[key];
    if (v === undefined) return def;
    const n = Number(v);
    if (v === true || !Number.isFinite(n)) throw new Error(`--${key} needs a number`);
    return n;
  }
  string(key: string, def: string): string {
    this.used.add(key);
    const v = this.flags[key];
    if (v === undefined) return def;
    if (v === true) throw new Error(`--${key} needs a value`);
    return v;
  }
  optionalString(key: string): string | undefined {
    this.used.add(key);
    const v = this.flags[key];
    if (v === true) throw new Error(`--${key} needs a value`);
    return v;
  }
  bool(key: string): boolean {
    this.used.add(key);
    const v = this.flags[key];
    return v === true || v === 'true' || v === '1' || v === 'yes';
  }
  /** Throws on flags nobody asked for. */
  done(): void {
    const unknown = Object.keys(this.flags).filter((k) => !this.used.has(k));
    if (unknown.length > 0) throw new Error(`unknown flag(s): ${unknown.map((k) => `--${k}`).join(', ')}`);
  }
}
