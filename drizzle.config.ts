import { defineConfig } from 'drizzle-kit';

export default defineConfig({
  dialect: 'postgresql',
  schema: './src/db/schema.ts',
  out: './drizzle',
  // Generating migrations needs no database; applying them happens at start (src/db/migrate.ts).
  dbCredentials: { url: process.env.DATABASE_URL ?? 'postgres://localhost/sluice' },
});
