/**
 * The audit log: every admin mutation (createTenant, rotateTenantKey,
 * suspendTenant, updateTenant, …) writes one info line `admin action` with
 * the action (the root field), the tenant it concerned, whether it succeeded,
 * and who: the admin role and the client's address. Never a secret: no
 * argument values beyond the tenant id, no result beyond it (a created or
 * rotated key is in the result, so results are not logged).
 */
import { Kind, getArgumentValues, getOperationAST, type FieldNode, type GraphQLSchema } from 'graphql';
import type { Plugin } from 'graphql-yoga';
import type { Logger } from 'pino';
import type { Context } from '../graphql/context.ts';

export interface AuditLine {
  audit: true;
  action: string;
  tenantId: string | null;
  ok: boolean;
  who: { role: 'admin'; address: string | null };
}

/** The tenant a mutation concerned: its `id` argument, its input's `id`, else the id in its result. Pure. */
export function auditedTenantId(args: Record<string, unknown>, result: unknown): string | null {
  const input = args.input as { id?: unknown; tenantId?: unknown } | undefined;
  const fromArgs = args.id ?? input?.id ?? input?.tenantId;
  if (typeof fromArgs === 'string') return fromArgs;
  const r = result as { tenant?: { id?: unknown }; id?: unknown } | null | undefined;
  const fromResult = r?.tenant?.id ?? r?.id;
  return typeof fromResult === 'string' ? fromResult : null;
}

const NOT_A_TENANT_ID = new Set(['revokeApiKey', 'updateWebhookEndpoint']);

/** One line per root field of an admin mutation. */
export function auditLines(schema: GraphQLSchema, args: { document: Parameters<typeof getOperationAST>[0]; operationName?: string | null | undefined; variableValues?: Record<string, unknown> | null | undefined }, data: Record<string, unknown> | null | undefined, errors: readonly { path?: readonly (string | number)[] | undefined }[] | undefined, address: string | null): AuditLine[] {
  const op = getOperationAST(args.document, args.operationName ?? undefined);
  const mutation = schema.getMutationType();
  if (!op || op.operation !== 'mutation' || !mutation) return [];
  const lines: AuditLine[] = [];
  for (const sel of op.selectionSet.selections) {
    if (sel.kind !== Kind.FIELD) continue;
    const field = mutation.getFields()[sel.name.value];
    if (!field) continue;
    const key = sel.alias?.value ?? sel.name.value;
    let values: Record<string, unknown> = {};
    try {
      values = getArgumentValues(field, sel as FieldNode, args.variableValues ?? {});
    } catch {
      // Invalid arguments were refused before execution; nothing to read.
    }
    const failed = (errors ?? []).some((e) => e.path?.[0] === key);
    // These ids name a key or a webhook endpoint, not a tenant.
    const tenantId = NOT_A_TENANT_ID.has(sel.name.value) ? null : auditedTenantId(values, data?.[key]);
    lines.push({ audit: true, action: sel.name.value, tenantId, ok: !failed && data?.[key] != null, who: { role: 'admin', address } });
  }
  return lines;
}

export function useAdminAudit(log: Logger): Plugin<Context & { address?: string | null }> {
  return {
    onExecute({ args }) {
      const ctx = args.contextValue as Context & { address?: string | null };
      if (ctx.auth?.kind !== 'admin') return;
      return {
        onExecuteDone({ result }) {
          if (!result || Symbol.asyncIterator in (result as object)) return;
          const r = result as { data?: Record<string, unknown> | null; errors?: readonly { path?: readonly (string | number)[] }[] };
          for (const line of auditLines(args.schema, args, r.data, r.errors, ctx.address ?? null)) log.info(line, 'admin action');
        },
      };
    },
  };
}
