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
 * Root fields declare who may call them, and which scopes a tenant key needs
 * for them (default: SUBMIT for a mutation, READ for a query or subscription).
 * The auth plugin reads this before execution and refuses the whole
 * operation, so a caller never gets partial data.
 */
export const role = (r: Role, scopes?: readonly Scope[]) => ({ extensions: scopes ? { role: r, scopes } : { role: r } });
