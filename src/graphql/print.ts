import { lexicographicSortSchema, printSchema } from 'graphql';
import { schema } from './schema.ts';

/** The schema as committed in schema/schema.graphql: sorted, so reordering code does not churn the file. */
export function printedSchema(): string {
  return printSchema(lexicographicSortSchema(schema)) + '\n';
}
