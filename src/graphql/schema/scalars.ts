import { GraphQLError, Kind, type ValueNode } from 'graphql';
import { builder } from '../builder.ts';

function literalToValue(node: ValueNode): unknown {
  switch (node.kind) {
    case Kind.STRING:
    case Kind.BOOLEAN:
      return node.value;
    case Kind.INT:
    case Kind.FLOAT:
      return Number(node.value);
    case Kind.NULL:
      return null;
    case Kind.LIST:
      return node.values.map(literalToValue);
    case Kind.OBJECT:
      return Object.fromEntries(node.fields.map((f) => [f.name.value, literalToValue(f.value)]));
    default:
      throw new GraphQLError('variables inside JSON literals are not supported', { extensions: { code: 'BAD_USER_INPUT' } });
  }
}

builder.scalarType('JSON', {
  description: 'Any JSON value (job params and results are JSON objects).',
  serialize: (v) => v,
  parseValue: (v) => v,
  parseLiteral: (node) => literalToValue(node),
});

builder.scalarType('DateTime', {
  description: 'An ISO-8601 timestamp in UTC.',
  serialize: (v) => (v instanceof Date ? v.toISOString() : new Date(v as string).toISOString()),
  parseValue: (v) => {
    const d = new Date(v as string);
    if (Number.isNaN(d.getTime())) throw new GraphQLError('invalid DateTime', { extensions: { code: 'BAD_USER_INPUT' } });
    return d;
  },
});
