/**
 * A small Sluice client: submits jobs (honouring Retry-After when the queue is
 * full), waits for each through the jobUpdated subscription, then reads the
 * tenant's usage. Run it against a running Sluice:
 *
 *   SLUICE_URL=http://localhost:4000/graphql SLUICE_KEY=slc_… npm run example:client
 *   … npm run example:client -- --api emailvalidator --param email=jane@mailinator.com --count 3
 *
 * Exit code 0 when every job SUCCEEDED, 1 otherwise.
 */
import { parseArgs } from 'node:util';
import { print } from 'graphql';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { graphql, type ResultOf, type VariablesOf } from './graphql.ts';
import { queueFullDelaySeconds, type GraphQLErrorLike } from './retry.ts';

const SubmitJob = graphql(`
  mutation SubmitJob($input: JobInput!) {
    submitJob(input: $input) { job { id state } }
  }
`);

const JobUpdated = graphql(`
  subscription JobUpdated($id: ID!) {
    jobUpdated(id: $id) { id state result error { code message } creditsBilled }
  }
`);

const MyUsage = graphql(`
  query MyUsage {
    me { tenant { name } usage { creditsUsed creditsReserved creditsRemaining quota periodEnd } }
  }
`);

type Document = Parameters<typeof print>[0];

const url = process.env.SLUICE_URL ?? 'http://localhost:4000/graphql';
const key = process.env.SLUICE_KEY;
if (!key) {
  console.error('Set SLUICE_KEY to a tenant API key (slc_…), and SLUICE_URL if Sluice is not on localhost:4000.');
  process.exit(2);
}
const { values } = parseArgs({
  options: {
    api: { type: 'string', default: 'dnslookup' },
    param: { type: 'string', multiple: true, default: ['domain=example.com'] },
    priority: { type: 'string', default: 'STANDARD' },
    count: { type: 'string', default: '1' },
    'max-tries': { type: 'string', default: '20' },
  },
});

/** One GraphQL request over HTTP; throws on errors, except the caller's own handling of QUEUE_FULL. */
async function request<R, V>(doc: Document, variables: V): Promise<{ status: number; headers: Headers; data?: R; errors?: GraphQLErrorLike[] }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ query: print(doc), variables }),
  });
  const body = (await res.json()) as { data?: R; errors?: GraphQLErrorLike[] };
  return { status: res.status, headers: res.headers, ...body };
}

const sleep = (s: number) => new Promise((r) => setTimeout(r, s * 1000));

/** Submits one job; on QUEUE_FULL waits what Retry-After says and tries again. */
async function submit(input: VariablesOf<typeof SubmitJob>['input']): Promise<string> {
  const maxTries = Number(values['max-tries']);
  for (let attempt = 1; ; attempt++) {
    const r = await request<ResultOf<typeof SubmitJob>, VariablesOf<typeof SubmitJob>>(SubmitJob, { input });
    if (r.data) return r.data.submitJob.job.id;
    const wait = queueFullDelaySeconds(r.status, r.headers.get('retry-after'), r.errors);
    if (wait === null || attempt >= maxTries) throw new Error(`submitJob failed: ${JSON.stringify(r.errors)}`);
    console.log(`QUEUE_FULL (HTTP ${r.status}): retrying in ${wait} s as Retry-After says (attempt ${attempt})`);
    await sleep(wait);
  }
}

const ws = createClient({ url: url.replace(/^http/, 'ws'), webSocketImpl: WebSocket, connectionParams: { authorization: `Bearer ${key}` } });

/** Resolves with the job's final state, printing every change jobUpdated pushes. */
function waitFor(id: string): Promise<ResultOf<typeof JobUpdated>['jobUpdated']> {
  return new Promise((resolve, reject) => {
    let last: ResultOf<typeof JobUpdated>['jobUpdated'] | null = null;
    ws.subscribe<ResultOf<typeof JobUpdated>>(
      { query: print(JobUpdated), variables: { id } satisfies VariablesOf<typeof JobUpdated> },
      {
        next: (msg) => {
          if (msg.errors) return reject(new Error(msg.errors[0]!.message));
          last = msg.data!.jobUpdated;
          console.log(`job ${id} ${last.state}${last.error ? ` (${last.error.code}: ${last.error.message})` : ''}`);
        },
        error: (err) => reject(err instanceof Error ? err : new Error(JSON.stringify(err))),
        complete: () => (last ? resolve(last) : reject(new Error(`jobUpdated for ${id} completed without an event`))),
      },
    );
  });
}

try {
  const params = Object.fromEntries(values.param!.map((p) => [p.slice(0, p.indexOf('=')), p.slice(p.indexOf('=') + 1)]));
  const finals = [];
  const ids: string[] = [];
  for (let i = 0; i < Number(values.count); i++) {
    const id = await submit({ api: values.api!, params, priority: values.priority as 'STANDARD' });
    console.log(`submitted ${values.api} job ${id}`);
    ids.push(id);
  }
  for (const id of ids) finals.push(await waitFor(id));

  const usage = await request<ResultOf<typeof MyUsage>, Record<string, never>>(MyUsage, {});
  if (!usage.data) throw new Error(`me failed: ${JSON.stringify(usage.errors)}`);
  const u = usage.data.me.usage;
  console.log(`${usage.data.me.tenant.name}: ${u.creditsUsed} of ${u.quota} credits used (${u.creditsReserved} reserved, ${u.creditsRemaining} left until ${u.periodEnd})`);
  const ok = finals.every((j) => j.state === 'SUCCEEDED');
  console.log(ok ? 'all jobs SUCCEEDED' : 'some jobs did not succeed');
  process.exitCode = ok ? 0 : 1;
} catch (err) {
  console.error((err as Error).message);
  process.exitCode = 1;
} finally {
  await ws.dispose();
}
