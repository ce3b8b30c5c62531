/**
 * Where Postgres spends its time during a measurement: samples
 * pg_stat_activity of the benchmark's database every `everyMs` and tallies the
 * non-idle backends by application (sluice / sluice-pgboss), wait event and
 * statement. Cheap (one small query per sample) and read-only.
 */
import type postgres from 'postgres';

export interface ActivitySummary {
  samples: number;
  everyMs: number;
  activeBackendsMean: number;
  byApplication: Record<string, number>;
  byWait: Record<string, number>;
  topStatements: Array<{ statement: string; share: number }>;
  note: string;
}

export function sampleActivity(sql: postgres.Sql, everyMs = 200): { stop(): Promise<ActivitySummary> } {
  let samples = 0;
  let active = 0;
  const byApp = new Map<string, number>();
  const byWait = new Map<string, number>();
  const byStmt = new Map<string, number>();
  let running = true;
  const bump = (m: Map<string, number>, k: string) => m.set(k, (m.get(k) ?? 0) + 1);
  const loop = (async () => {
    while (running) {
      const t = Date.now();
      try {
        const rows = await sql`
          select application_name as app, state, coalesce(wait_event_type || ':' || wait_event, 'CPU/none') as wait,
            left(regexp_replace(query, '\\s+', ' ', 'g'), 60) as q
          from pg_stat_activity
          where datname = current_database() and pid <> pg_backend_pid() and state <> 'idle' and backend_type = 'client backend'`;
        samples++;
        for (const r of rows) {
          active++;
          bump(byApp, String(r.app || '?'));
          bump(byWait, `${r.wait as string} (${r.state as string})`);
          bump(byStmt, String(r.state === 'idle in transaction' ? '(idle in transaction: waiting for the client)' : (r.q as string).trim()));
        }
      } catch {
        // the database is going away
      }
      await new Promise((r) => setTimeout(r, Math.max(1, everyMs - (Date.now() - t))));
    }
  })();
  const shares = (m: Map<string, number>) =>
    Object.fromEntries([...m.entries()].sort((a, b) => b[1] - a[1]).map(([k, v]) => [k, Math.round((v / Math.max(1, active)) * 1000) / 1000]));
  return {
    async stop() {
      running = false;
      await loop;
      return {
        samples,
        everyMs,
        activeBackendsMean: Math.round((active / Math.max(1, samples)) * 100) / 100,
        byApplication: shares(byApp),
        byWait: Object.fromEntries(Object.entries(shares(byWait)).slice(0, 8)),
        topStatements: [...byStmt.entries()].sort((a, b) => b[1] - a[1]).slice(0, 10).map(([statement, v]) => ({ statement, share: Math.round((v / Math.max(1, active)) * 1000) / 1000 })),
        note: 'shares of non-idle client backends over pg_stat_activity samples of this database (sluice = Sluice\'s own SQL, sluice-pgboss = pg-boss\'s pool incl. its maintenance)',
      };
    },
  };
}
