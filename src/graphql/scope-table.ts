/**
 * The scope table: who may call each root field and which key scopes it needs, and the fields
 * below the root that need a scope of their own, printed from the declarations on the fields
 * (`role()` and `needs()` in builder.ts) into the README between SCOPE_TABLE_BEGIN and
 * SCOPE_TABLE_END. `node src/scripts/print-schema.ts` rewrites that block and `--check` (npm run
 * schema:check) fails when it is out of date, as for schema/schema.graphql.
 */
import { isObjectType, type GraphQLSchema } from 'graphql';
import { declaredAccess, rootAccess } from './auth-plugin.ts';

export const SCOPE_TABLE_BEGIN = '<!-- scope-table:begin (printed by `node src/scripts/print-schema.ts`; do not edit) -->';
export const SCOPE_TABLE_END = '<!-- scope-table:end -->';

const scopesCell = (scopes: readonly string[]) => (scopes.length === 0 ? 'any' : scopes.map((s) => `\`${s}\``).join(' + '));

/** The markdown tables (root fields, then scoped fields below the root), sorted by name. Pure. */
export function scopeTable(schema: GraphQLSchema): string {
  const lines = ['| Operation | Root field | Who | Key scopes |', '|---|---|---|---|'];
  for (const [kind, type] of [['query', schema.getQueryType()], ['mutation', schema.getMutationType()], ['subscription', schema.getSubscriptionType()]] as const) {
    if (!type) continue;
    for (const field of Object.values(type.getFields()).sort((a, b) => a.name.localeCompare(b.name))) {
      const declared = declaredAccess(field, true);
      const access = rootAccess(field);
      const who = declared ? access.role : '**undeclared** (admin)';
      // Scopes are what a tenant key holds: they mean nothing to the admin token or a public field.
      const scopes = access.role === 'admin' || access.role === 'public' ? '—' : scopesCell(access.scopes);
      lines.push(`| ${kind} | \`${field.name}\` | ${who} | ${scopes} |`);
    }
  }
  const roots = new Set([schema.getQueryType(), schema.getMutationType(), schema.getSubscriptionType()].filter(Boolean).map((t) => t!.name));
  const nested: string[] = [];
  for (const type of Object.values(schema.getTypeMap()).sort((a, b) => a.name.localeCompare(b.name))) {
    if (!isObjectType(type) || roots.has(type.name) || type.name.startsWith('__')) continue;
    for (const field of Object.values(type.getFields()).sort((a, b) => a.name.localeCompare(b.name))) {
      const access = declaredAccess(field, false);
      if (access && access.scopes.length > 0) nested.push(`| \`${type.name}.${field.name}\` | ${scopesCell(access.scopes)} |`);
    }
  }
  lines.push('', '| Field (in any operation) | Key scopes |', '|---|---|', ...nested);
  return lines.join('\n');
}

/** `readme` with the block between the markers replaced by `table`; null when the markers are missing. Pure. */
export function withScopeTable(readme: string, table: string): string | null {
  const begin = readme.indexOf(SCOPE_TABLE_BEGIN);
  const end = readme.indexOf(SCOPE_TABLE_END);
  if (begin < 0 || end < begin) return null;
  return `${readme.slice(0, begin)}${SCOPE_TABLE_BEGIN}\n${table}\n${readme.slice(end)}`;
}
