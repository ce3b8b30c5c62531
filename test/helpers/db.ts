import { randomBytes } from 'node:crypto';
import postgres from 'postgres';

/**
 * DB_POOL_MAX for every Sluice process of the suite: at most 15 connections each
 * (poolSizes; 16 with a dispatcher's lease-refresh connection), so two files at once (one with three API processes) fit under a
 * stock max_connections of 100.
 */
export const TEST_DB_POOL_MAX = '8';

export function adminUrl(): string {
  const url = process.env.TEST_DATABASE_URL;
  if (!url) throw new Error('TEST_DATABASE_URL is not set: run tests with `npm test`');
  return url;
}

/** A fresh database on the test server, dropped by `drop()`. */
export async function createTestDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `sluice_t_${randomBytes(5).toString('hex')}`;
  const admin = postgres(adminUrl(), { max: 1, onnotice: () => {} });
  await admin.unsafe(`create database ${name}`);
  await admin.end();
  const url = new URL(adminUrl());
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    async drop() {
      const a = postgres(adminUrl(), { max: 1, onnotice: () => {} });
      await a.unsafe(`drop database if exists ${name} with (force)`);
      await a.end();
    },
  };
}
