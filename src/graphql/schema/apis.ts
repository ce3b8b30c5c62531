import type { ApiSpec } from '../../config/apis.ts';
import { builder, role } from '../builder.ts';

const ApiRef = builder.objectRef<ApiSpec>('Api').implement({
  description: 'An upstream API jobs can call.',
  fields: (t) => ({
    name: t.exposeString('name'),
    creditCost: t.exposeInt('creditCost', { description: 'Credits one successful call bills.' }),
    method: t.exposeString('method'),
    requiredParams: t.exposeStringList('requiredParams'),
  }),
});

builder.queryFields((t) => ({
  apis: t.field({
    ...role('tenant', ['READ']),
    type: [ApiRef],
    description: 'The APIs Sluice can call, with their credit costs.',
    resolve: (_r, _a, ctx) => [...ctx.services.catalog.values()],
  }),
}));
