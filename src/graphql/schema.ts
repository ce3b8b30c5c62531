/**
 * The whole schema: the builder plus one file per domain.
 */
import { builder } from './builder.ts';
import './schema/scalars.ts';
import './schema/tenants.ts';
import './schema/keys.ts';
import './schema/jobs.ts';
import './schema/me.ts';
import './schema/apis.ts';
import './schema/system.ts';
import './schema/usage.ts';
import './schema/console.ts';
import './schema/budget.ts';
import './schema/webhooks.ts';

builder.queryType({});
builder.mutationType({});
builder.subscriptionType({});

export const schema = builder.toSchema({ sortSchema: false });
