/**
 * The webhook sender's thread (node:worker_threads; WebhookThread in sender-thread.ts starts it).
 * Its own event loop, so the POSTs, the HMAC signing and the claim/record statements never queue
 * beside the dispatcher's leases and settlements on the main thread. It opens its own pool (the
 * main thread's settings) and its own logger. The LISTEN stays on the main thread's direct
 * session (one per node): the main thread forwards each notice as a `poke`. Attempts are counted
 * here and posted to the main thread's metrics a few times a second.
 */
import { parentPort, threadId, workerData } from 'node:worker_threads';
import { connectDedicated } from '../db/client.ts';
import { createLogger } from '../log.ts';
import { WebhookSender } from './sender.ts';
import { startTracing, stopTracing } from '../tracing/tracer.ts';
import type { FromThread, ToThread, WebhookThreadData } from './sender-thread.ts';

const port = parentPort;
if (!port) throw new Error('src/webhooks/thread.ts runs as a worker thread: WebhookThread starts it');
const data = workerData as WebhookThreadData;
const post = (m: FromThread) => port.postMessage(m);
// This thread's own SDK (a thread has its own modules): its delivery spans join their jobs' traces.
if (data.tracing) startTracing(data.tracing, { 'sluice.role': 'worker', 'sluice.thread': 'webhooks' });
const log = createLogger(data.logLevel).child({ thread: 'webhooks', threadId });
const sql = connectDedicated(data.databaseUrl, data.pool);

// Counted here, posted in batches: one message per attempt would put a task on the main loop per delivery.
const counts = { delivered: 0, failed: 0 };
let countTimer: NodeJS.Timeout | null = null;
function postCounts(): void {
  if (countTimer) clearTimeout(countTimer);
  countTimer = null;
  if (counts.delivered + counts.failed === 0) return;
  post({ type: 'attempts', delivered: counts.delivered, failed: counts.failed });
  counts.delivered = 0;
  counts.failed = 0;
}

const sender = new WebhookSender({
  ...data.sender,
  sql,
  listenSql: null,
  log,
  onAttempt: (outcome) => {
    counts[outcome]++;
    countTimer ??= setTimeout(postCounts, data.countFlushMs);
  },
});

let stopping: Promise<void> | null = null;
function stop(): Promise<void> {
  return (stopping ??= (async () => {
    await sender.stop();
    postCounts();
    await sql.end({ timeout: 5 });
    await stopTracing();
    post({ type: 'stopped' });
    // Nothing keeps the loop alive now: the thread exits.
    port!.close();
  })());
}

port.on('message', (m: ToThread) => {
  if (m.type === 'poke') sender.poke();
  else if (m.type === 'stop') void stop();
});

await sender.start();
log.debug('webhook sender thread started');
post({ type: 'ready', threadId });
