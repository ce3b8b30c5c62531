/**
 * The Pothos builder: set up here, nothing defined here. Each domain file in
 * ./schema/ defines its types next to their queries and mutations.
 */
import SchemaBuilder from '@pothos/core';
import RelayPlugin from '@pothos/plugin-relay';
import type { Context, Role } from './context.ts';
import type { Scope } from '../tenants/api-keys.ts';

export interface SchemaTypes {
  Context: Context;
  // Fields are non-null unless they say otherwise: clients should not null-check what is always there.
  DefaultFieldNullability: false;
  Scalars: {
    JSON: { Input: unknown; Output: unknown };
    DateTime: { Input: Date; Output: Date };
  };
}

export const builder = new SchemaBuilder<SchemaTypes>({
  plugins: [RelayPlugin],
  defaultFieldNullability: false,
  relay: {
    // Job ids are plain UUIDs shared with pg-boss; no global Node ids.
    nodeQueryOptions: false,
    nodesQueryOptions: false,
    cursorType: 'String',
  },
});

/**
 * Who may call a root field and which key scopes it needs: declared on every root field of
 * Query, Mutation and Subscription, with `role()`. There is no default: the auth plugin
 * (auth-plugin.ts) treats a root field without a declaration as the admin's only, and
 * test/scope-table.test.ts fails on one. The README's scope table is printed from these.
 */
export interface FieldAccess {
  /** Root fields only: who may call it. */
  role?: Role;
  /** Every one of these a tenant key must hold (none: any tenant key). The admin token holds all. */
  scopes: readonly Scope[];
}

/**
 * A root field's declaration: `role('tenant', ['READ'])`. Admin-only and public fields name no
 * scopes (scopes are what a tenant key holds): `role('admin')`, `role('public')`. The plugin
 * reads it before execution and refuses the whole operation, so a caller never gets partial data.
 */
export function role(r: 'admin' | 'public'): { extensions: { access: FieldAccess } };
export function role(r: 'tenant' | 'tenantOrAdmin', scopes: readonly Scope[]): { extensions: { access: FieldAccess } };
export function role(r: Role, scopes: readonly Scope[] = []): { extensions: { access: FieldAccess } } {
  return { extensions: { access: { role: r, scopes } } };
}

/**
 * The scopes a tenant key needs to select a field below the root: a job's params and result, what
 * the provider answered. The plugin walks the whole operation (fragments included) and refuses it
 * up front, naming the field, when the key lacks one; the admin token sees every field.
 */
export const needs = (scopes: readonly Scope[]): { extensions: { access: FieldAccess } } => ({ extensions: { access: { scopes } } });
