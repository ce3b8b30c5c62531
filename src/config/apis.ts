/**
 * The API catalog and cost map: one line per upstream API.
 *
 * This is the single place credit costs live. The client (to know what a call
 * costs when the provider's headers are missing), the ledger (to reserve at
 * dispatch) and the simulator (to bill) all read it, so a pricing change is a
 * one-line edit here. Public figures disagree on some costs (Email Validator
 * shows 5 on its page, the lesson that Sluice grew from uses 20): the figure
 * here is the one we bill by, and `API_COSTS` overrides it at start.
 */
export interface ApiSpec {
  /** Path segment under /v1/, e.g. `emailvalidator`. */
  readonly name: string;
  /** Credits one successful (HTTP 200) call bills. */
  readonly creditCost: number;
  readonly method: 'GET' | 'POST';
  readonly requiredParams: readonly string[];
  /** Batching (POST /v1/<api>/batch): whether to use it and how big a batch may be. */
  readonly batch: { readonly enabled: boolean; readonly maxSize: number; readonly minSize: number };
}

const batchOn = { enabled: true, maxSize: 200, minSize: 2 } as const;

export const API_CATALOG: readonly ApiSpec[] = [
  { name: 'emailvalidator', creditCost: 5, method: 'GET', requiredParams: ['email'], batch: batchOn },
  { name: 'exchangerate', creditCost: 1, method: 'GET', requiredParams: ['currency1', 'currency2'], batch: batchOn },
  { name: 'dnslookup', creditCost: 1, method: 'GET', requiredParams: ['domain'], batch: batchOn },
];

export type ApiCatalog = ReadonlyMap<string, ApiSpec>;

/**
 * Builds the catalog, applying cost overrides written as `name=cost,name=cost`.
 * Throws on an unknown name or a cost that is not a positive integer, so a typo
 * in configuration stops start-up instead of silently billing the default.
 */
export function buildCatalog(costOverrides = '', batchDisabled = ''): ApiCatalog {
  const map = new Map(API_CATALOG.map((spec) => [spec.name, spec]));
  // `BATCH_DISABLED_APIS`: APIs always called one by one (a provider's batch endpoint misbehaving, or tests).
  for (const name of batchDisabled.split(',').map((s) => s.trim()).filter(Boolean)) {
    const spec = map.get(name);
    if (!spec) throw new Error(`unknown api "${name}" in BATCH_DISABLED_APIS`);
    map.set(name, { ...spec, batch: { ...spec.batch, enabled: false } });
  }
  for (const part of costOverrides.split(',').map((s) => s.trim()).filter(Boolean)) {
    const [name, raw] = part.split('=').map((s) => s.trim());
    const spec = name ? map.get(name) : undefined;
    const cost = Number(raw);
    if (!spec) throw new Error(`unknown api "${name}" in cost overrides`);
    if (!Number.isInteger(cost) || cost < 1) throw new Error(`cost for "${name}" must be a positive integer, got "${raw}"`);
    map.set(spec.name, { ...spec, creditCost: cost });
  }
  return map;
}

export const DEFAULT_CATALOG: ApiCatalog = buildCatalog();
