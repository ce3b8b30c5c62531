/**
 * The bench's clock for "commit": a process of its own that LISTENs on the job
 * events channel and stamps each final-state notification as it arrives.
 * Postgres delivers a NOTIFY only when its transaction commits, so the stamp
 * is the commit (plus one loopback hop, which Sluice's own LISTEN pays too).
 * Its own event loop, so the bench's thousands of WebSocket clients cannot
 * delay the stamp (which would flatter the latency). Sends
 * `{type: 'commit', jobId, state, at, carriesRow}` to the parent over IPC.
 */
import postgres from 'postgres';

const sql = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => {} });
await sql.listen(
  process.env.CHANNEL ?? 'sluice_job_events',
  (payload) => {
    const at = Date.now();
    const e = JSON.parse(payload) as { jobId: string; state: string; job?: unknown };
    if (e.state === 'SUCCEEDED' || e.state === 'FAILED' || e.state === 'CANCELLED') process.send!({ type: 'commit', jobId: e.jobId, state: e.state, at, carriesRow: e.job !== undefined });
  },
  () => process.send!({ type: 'listening' }),
);
process.on('message', (m: { type?: string }) => {
  if (m?.type === 'stop') void sql.end({ timeout: 2 }).finally(() => process.exit(0));
});
process.on('disconnect', () => void sql.end({ timeout: 2 }).finally(() => process.exit(0)));
