/**
 * Fan-out of final job states: the NOTIFY of a final state carries
 * the committed row, so every process delivers it without a read; a row too
 * big for a NOTIFY payload travels as ids and is read once per process per
 * event. Real Sluice, real Postgres, real graphql-ws clients: the events must
 * carry exactly what `job(id)` reads, by either path.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import postgres from 'postgres';
import { collect, eventually, startTestApp, type TestApp } from './helpers/app.ts';
import { EventBus, JOB_EVENTS_CHANNEL, publishJobEvents, type JobEvent } from '../src/events/bus.ts';
import { getJob, type JobRow } from '../src/jobs/store.ts';

const FIELDS = 'id api params priority state result error { code message } httpStatus creditsBilled attempts idempotencyKey createdAt startedAt finishedAt';
const SUBMIT = `mutation($i: JobInput!) { submitJob(input: $i) { job { id } } }`;

type Job = Record<string, unknown> & { id: string; state: string };

describe('final job states fan out with their row', () => {
  let t: TestApp;
  let tenant: { id: string; apiKey: string };
  let listener: postgres.Sql;
  /** Every raw NOTIFY payload on the job events channel, by job id, as a separate connection sees it. */
  const payloads = new Map<string, Array<Record<string, unknown>>>();

  before(async () => {
    t = await startTestApp();
    tenant = await t.createTenant('fanout', 'PRO');
    listener = postgres(t.databaseUrl, { max: 1, onnotice: () => {} });
    await listener.listen(JOB_EVENTS_CHANNEL, (p) => {
      const e = JSON.parse(p) as Record<string, unknown> & { jobId: string };
      payloads.set(e.jobId, [...(payloads.get(e.jobId) ?? []), e]);
    });
  });
  after(async () => {
    await listener?.end({ timeout: 2 });
    await t?.stop();
  });

  /** Three graphql-ws subscribers on jobsCompleted; submits the job once they are listening; each subscriber's event for it. */
  async function completedThroughThreeSubscribers(input: Record<string, unknown>): Promise<{ id: string; events: Job[] }> {
    let id = '';
    const subscribers = [0, 1, 2].map(() =>
      collect<{ jobsCompleted: Job }>(t.ws(tenant.apiKey), `subscription { jobsCompleted { ${FIELDS} } }`, {}, (ev) => ev.some((e) => e.jobsCompleted.id === id), 30_000),
    );
    await new Promise((r) => setTimeout(r, 500)); // let the subscriptions reach the server
    const r = await t.gql(SUBMIT, { i: input }, tenant.apiKey);
    assert.ok(r.body.data, JSON.stringify(r.body.errors));
    id = r.body.data.submitJob.job.id;
    const all = await Promise.all(subscribers);
    return { id, events: all.map((evs) => evs.map((e) => e.jobsCompleted).find((j) => j.id === id)!) };
  }

  async function readJob(id: string): Promise<Job> {
    const r = await t.gql(`query($id: ID!) { job(id: $id) { ${FIELDS} } }`, { id }, tenant.apiKey);
    return r.body.data.job as Job;
  }

  test('a small row rides in the NOTIFY and reaches every subscriber with the fields a read gives', async () => {
    const { id, events } = await completedThroughThreeSubscribers({ api: 'emailvalidator', params: { email: 'jane@mailinator.com' }, priority: 'INTERACTIVE', idempotencyKey: 'fanout-small' });
    const final = await eventually(async () => payloads.get(id)?.find((p) => p.state === 'SUCCEEDED'));
    assert.ok(final.job, 'the final-state NOTIFY carries the row');
    assert.equal((final.job as { id: string }).id, id);

    const read = await readJob(id);
    assert.equal(read.state, 'SUCCEEDED');
    assert.equal((read.result as { email: string }).email, 'jane@mailinator.com');
    assert.equal(read.idempotencyKey, 'fanout-small');
    assert.equal(read.creditsBilled, 5);
    assert.ok(read.startedAt && read.finishedAt);
    for (const e of events) assert.deepEqual(e, read);
  });

  test('a row too big for NOTIFY goes as ids, and is still delivered whole', async () => {
    // 6 params of 2,000 characters: about 12 KB of params in the row, past the 8,000-byte payload limit.
    const padding = Object.fromEntries(Array.from({ length: 6 }, (_, i) => [`pad${i}`, String.fromCharCode(97 + i).repeat(2_000)]));
    const { id, events } = await completedThroughThreeSubscribers({ api: 'dnslookup', params: { domain: 'example.com', ...padding } });
    const final = await eventually(async () => payloads.get(id)?.find((p) => p.state === 'SUCCEEDED'));
    assert.equal(final.job, undefined, 'the payload falls back to ids');
    assert.deepEqual(Object.keys(final).sort(), ['jobId', 'state', 'tenantId']);

    const read = await readJob(id);
    assert.equal(read.state, 'SUCCEEDED');
    assert.equal((read.params as Record<string, string>).pad5, 'f'.repeat(2_000));
    assert.equal((read.result as { domain: string }).domain, 'example.com');
    for (const e of events) assert.deepEqual(e, read);
  });

  test('an event without its row is read once per process, however many subscribers it wakes', async () => {
    const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: 'once.example' } } }, tenant.apiKey);
    const id = r.body.data.submitJob.job.id as string;
    await eventually(async () => (await readJob(id)).state === 'SUCCEEDED');

    // A bus of our own on the same database: five subscribers of the tenant, one event with ids only.
    const sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    const bus = new EventBus();
    try {
      await bus.start(sql);
      const subs = [0, 1, 2, 3, 4].map(() => bus.subscribe((e) => e.tenantId === tenant.id));
      // The ids-only payload a row too big for NOTIFY would get, sent by hand.
      await sql`select pg_notify(${JOB_EVENTS_CHANNEL}, ${JSON.stringify({ jobId: id, tenantId: tenant.id, state: 'SUCCEEDED' })})`;
      let loads = 0;
      const rows: Array<JobRow | null> = [];
      for (const s of subs) {
        const { value } = await s.next();
        const event = value as JobEvent;
        assert.equal(event.job, undefined);
        rows.push(await bus.jobOf(event, () => (loads++, getJob(sql, tenant.id, id))));
      }
      assert.equal(loads, 1);
      assert.equal(bus.rowReads, 1);
      for (const row of rows) assert.equal(row?.id, id);

      // The same path through publishJobEvents: the row rides, nothing is read.
      await sql.begin((tx) => publishJobEvents(tx, [{ jobId: id, tenantId: tenant.id, state: 'SUCCEEDED' }]));
      for (const s of subs) {
        const { value } = await s.next();
        const event = value as JobEvent;
        assert.equal(event.job?.id, id);
        assert.equal(event.job?.state, 'SUCCEEDED');
        assert.ok(event.job?.finishedAt instanceof Date);
        const row = await bus.jobOf(event, () => (loads++, getJob(sql, tenant.id, id)));
        assert.deepEqual(row, await getJob(sql, tenant.id, id));
      }
      assert.equal(loads, 1);
      for (const s of subs) await s.return?.();
    } finally {
      await bus.stop();
      await sql.end({ timeout: 2 });
    }
  });

  test("a process's own final event is delivered once, whichever copy comes first, and never from a settlement that failed", async () => {
    const sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    const bus = new EventBus();
    const tenantId = 'own-events';
    const createdAt = new Date().toISOString();
    const payload = (jobId: string, withRow = true) =>
      JSON.stringify({ jobId, tenantId, state: 'SUCCEEDED', ...(withRow ? { job: { id: jobId, tenantId, createdAt, createdAtMicros: '0', state: 'SUCCEEDED', attempts: 1 } } : {}) });
    const notify = (p: string) => sql`select pg_notify(${JOB_EVENTS_CHANNEL}, ${p})`;
    const got: string[] = [];
    const count = (jobId: string) => got.filter((id) => id === jobId).length;
    // Notifications of one session arrive in order: once this marker is in, every NOTIFY before it was handled.
    let markers = 0;
    const drained = async () => {
      const marker = `marker-${++markers}`;
      await notify(JSON.stringify({ jobId: marker, tenantId, state: 'RUNNING' }));
      await eventually(async () => got.includes(marker));
    };
    try {
      await bus.start(sql);
      const sub = bus.subscribe((e) => e.tenantId === tenantId);
      void (async () => {
        for await (const e of sub) got.push(e.jobId);
      })();

      // The statement's answer first: delivered from it; its NOTIFY, when it comes, is dropped.
      bus.settling(['j1']);
      bus.settled(['j1'], [payload('j1')]);
      assert.equal(bus.ownDelivered, 1, "delivered from the settlement's own answer");
      await eventually(async () => count('j1') === 1);
      await notify(payload('j1'));
      await drained();
      assert.equal(count('j1'), 1, 'its NOTIFY was dropped');

      // The NOTIFY first (the LISTEN connection beat the statement's answer): the answer's copy is dropped.
      bus.settling(['j2']);
      await notify(payload('j2'));
      await eventually(async () => count('j2') === 1);
      bus.settled(['j2'], [payload('j2')]);
      await drained();
      assert.equal(count('j2'), 1, "the statement's copy was dropped");
      assert.equal(bus.ownDelivered, 1);
      assert.equal(bus.twinsDropped, 2);

      // A settlement that failed delivers nothing; the job's event from wherever it commits comes by NOTIFY.
      bus.settling(['j3']);
      bus.settled(['j3'], null);
      await drained();
      assert.equal(count('j3'), 0);
      await notify(payload('j3'));
      await eventually(async () => count('j3') === 1);

      // Not announced before the statement (not this bus's settlement), or without its row: left to the NOTIFY.
      bus.settled(['j4'], [payload('j4')]);
      bus.settling(['j5']);
      bus.settled(['j5'], [payload('j5', false)]);
      await drained();
      assert.equal(count('j4') + count('j5'), 0);
      await notify(payload('j4'));
      await notify(payload('j5', false));
      await drained();
      assert.equal(count('j4'), 1);
      assert.equal(count('j5'), 1);
      assert.equal(bus.ownDelivered, 1);
      await sub.return?.();
    } finally {
      await bus.stop();
      await sql.end({ timeout: 2 });
    }
  });

  test("a subscriber that names its tenant is offered that tenant's events only; unkeyed ones are offered all", async () => {
    const sql = postgres(t.databaseUrl, { max: 2, onnotice: () => {} });
    const bus = new EventBus();
    const notify = (tenantId: string, jobId: string) => sql`select pg_notify(${JOB_EVENTS_CHANNEL}, ${JSON.stringify({ jobId, tenantId, state: 'RUNNING' })})`;
    const offered = { a: 0, any: 0 };
    const got = { a: [] as string[], any: [] as string[] };
    try {
      await bus.start(sql);
      const a = bus.subscribe(() => (offered.a++, true), { tenantId: 'tenant-a' });
      const any = bus.subscribe(() => (offered.any++, true));
      void (async () => {
        for await (const e of a) got.a.push(e.jobId);
      })();
      void (async () => {
        for await (const e of any) got.any.push(e.jobId);
      })();
      for (let i = 0; i < 5; i++) await notify('tenant-b', `b${i}`);
      await notify('tenant-a', 'a0');
      await eventually(async () => got.any.length === 6 && got.a.length === 1);
      assert.deepEqual(got.a, ['a0']);
      assert.equal(offered.a, 1, "the keyed subscriber's filter never saw another tenant's events");
      assert.equal(offered.any, 6);
      // Gone once it returns: the next event of its tenant reaches only the unkeyed one.
      await a.return?.();
      await notify('tenant-a', 'a1');
      await eventually(async () => got.any.length === 7);
      assert.equal(offered.a, 1);
      await any.return?.();
    } finally {
      await bus.stop();
      await sql.end({ timeout: 2 });
    }
  });

  test("a settlement's final events reach its own process's subscribers once, and another process's by NOTIFY", async () => {
    // An API-only process on the same database: it settles nothing, so it hears of every job by NOTIFY.
    const other = await startTestApp({ DATABASE_URL: t.databaseUrl, SLUICE_ROLE: 'api' });
    const finals = ['SUCCEEDED', 'FAILED', 'CANCELLED'];
    const watch = (bus: EventBus) => {
      const got: string[] = [];
      const sub = bus.subscribe((e) => e.tenantId === tenant.id && finals.includes(e.state));
      void (async () => {
        for await (const e of sub) got.push(e.jobId);
      })();
      return { got, sub };
    };
    const here = t.app.bus;
    const there = other.app.bus;
    const dropped = here.twinsDropped;
    const a = watch(here);
    const b = watch(there);
    try {
      const ids: string[] = [];
      for (let i = 0; i < 4; i++) {
        const r = await t.gql(SUBMIT, { i: { api: 'dnslookup', params: { domain: `own-${i}.example` } } }, tenant.apiKey);
        ids.push(r.body.data.submitJob.job.id as string);
      }
      await eventually(async () => ids.every((id) => a.got.includes(id) && b.got.includes(id)));
      // Each own event's two copies met, in either order, and the second was dropped: the settling
      // process had the payloads from its statement.
      await eventually(async () => here.twinsDropped - dropped >= ids.length);
      const mine = (got: string[]) => got.filter((id) => ids.includes(id)).sort();
      assert.deepEqual(mine(a.got), [...ids].sort(), 'the settling process delivered each event once');
      assert.deepEqual(mine(b.got), [...ids].sort(), 'the other process got each by NOTIFY, once');
      assert.equal(there.ownDelivered + there.twinsDropped, 0, 'the other process had no copy of its own');
    } finally {
      await a.sub.return?.();
      await b.sub.return?.();
      await other.stop();
    }
  });
});
