/**
 * The invariants of ../shared/DESIGN.md, checked from the records Sluice
 * keeps (reservations, ledger, jobs, pg-boss) and the simulator's own stats.
 */
import assert from 'node:assert/strict';
import type postgres from 'postgres';

/** I3: the most reservations (in-flight calls) a tenant ever held at once, from their intervals. */
export async function maxConcurrentByTenant(sql: postgres.Sql): Promise<Map<string, number>> {
  const rows = await sql`
    with ev as (
      select tenant_id, created_at as at, 1 as d from reservations
      union all
      select tenant_id, coalesce(settled_at, 'infinity'), -1 from reservations
    ), run as (
      select tenant_id, sum(d) over (partition by tenant_id order by at, d rows unbounded preceding) as n from ev
    )
    select tenant_id, max(n)::int as max from run group by tenant_id`;
  return new Map(rows.map((r) => [r.tenant_id as string, r.max as number]));
}

/**
 * I4 and the books: a tenant's reserved credits = its open reservations', each period's billed =
 * its settled bills, and billed + open within the quota (per period, and for the current period
 * with every open call of the tenant counted).
 */
export async function assertLedgerBalances(sql: postgres.Sql): Promise<void> {
  const tenants = await sql`
    select t.tenant_id, t.reserved, t.quota,
      coalesce((select sum(credits) from reservations r where r.tenant_id = t.tenant_id and r.settled_at is null), 0) as open,
      coalesce((select l.billed from tenant_ledger l where l.tenant_id = t.tenant_id and l.period_start = sluice_quota_period(t.period_anchor, now())), 0) as billed_now
    from sched_tenants t`;
  for (const t of tenants) {
    assert.equal(Number(t.reserved), Number(t.open), `tenant ${t.tenant_id}: reserved matches open reservations`);
    assert.ok(Number(t.billed_now) + Number(t.reserved) <= Number(t.quota), `tenant ${t.tenant_id}: I4 billed + reserved <= quota`);
  }
  const rows = await sql`
    select l.tenant_id, l.billed, t.quota,
      coalesce((select sum(credits) from reservations r where r.tenant_id = l.tenant_id and r.period_start = l.period_start and r.settled_at is null), 0) as open,
      coalesce((select sum(billed) from reservations r where r.tenant_id = l.tenant_id and r.period_start = l.period_start and r.settled_at is not null), 0) as settled
    from tenant_ledger l join sched_tenants t using (tenant_id)`;
  for (const r of rows) {
    assert.equal(Number(r.billed), Number(r.settled), `tenant ${r.tenant_id}: billed matches settled reservations`);
    assert.ok(Number(r.billed) + Number(r.open) <= Number(r.quota), `tenant ${r.tenant_id}: I4 per period`);
  }
}

/**
 * I10/I11: per tenant, the jobs' creditsBilled sum to the ledger's billed credits, which equal the
 * settled reservations' bills and the usage history's (every period of the tenant together: a
 * job's attempts may settle in different periods). Jobs of deleted tenants are gone with their
 * ledger; their history stays and is not compared.
 */
export async function assertJobsBilledAsLedger(sql: postgres.Sql): Promise<void> {
  const rows = await sql`
    select t.tenant_id,
      coalesce((select sum(l.billed) from tenant_ledger l where l.tenant_id = t.tenant_id), 0)::bigint as ledger,
      coalesce((select sum(j.credits_billed) from jobs j where j.tenant_id = t.tenant_id), 0)::bigint as jobs,
      coalesce((select sum(r.billed) from reservations r where r.tenant_id = t.tenant_id and r.settled_at is not null), 0)::bigint as reservations,
      coalesce((select sum(u.billed) from usage_deltas d, unnest(d.tenant_ids, d.credits_billed) u(tenant_id, billed) where u.tenant_id = t.tenant_id), 0)::bigint
        + coalesce((select sum(u.credits_billed) from usage_hourly u where u.tenant_id = t.tenant_id), 0)::bigint as history
    from sched_tenants t`;
  for (const r of rows) {
    assert.equal(Number(r.jobs), Number(r.ledger), `I11: tenant ${r.tenant_id}: its jobs' creditsBilled sum to the ledger's billed credits`);
    assert.equal(Number(r.reservations), Number(r.ledger), `tenant ${r.tenant_id}: the ledger's billed credits are its settled reservations' bills`);
    assert.equal(Number(r.history), Number(r.ledger), `I10: tenant ${r.tenant_id}: usage history equals the ledger`);
  }
}

/** I5 after quiescence: nothing outstanding anywhere; and the jobs' bills agree with the ledger (I10, I11). */
export async function assertQuiescent(sql: postgres.Sql): Promise<void> {
  const [open] = await sql`select count(*)::int as n from reservations where settled_at is null`;
  assert.equal(open!.n, 0, 'I5: every reservation is settled');
  const [reserved] = await sql`select coalesce(sum(reserved), 0)::int as n from sched_tenants`;
  assert.equal(reserved!.n, 0, 'I5: no credits left reserved');
  const [tenants] = await sql`select coalesce(sum(in_flight), 0)::int as n from sched_tenants`;
  assert.equal(tenants!.n, 0, 'no tenant slot left taken');
  const [windows] = await sql`select (coalesce((select sum(in_flight) from windows), 0) + coalesce((select sum(n) from window_slot_deltas), 0))::int as n`;
  assert.equal(windows!.n, 0, 'no window slot left taken');
  await assertCountersMatchRows(sql);
  await assertJobsBilledAsLedger(sql);
}

/**
 * The scheduler's counters equal the rows they count (true after every commit, not only at
 * quiescence): each queue's depth its waiting jobs, each tenant's in-flight count its open
 * reservations (running jobs are not a counter: visibility counts their rows). A double release used to be
 * clamped at zero and still sum to 0 at quiescence; the CHECK constraints (0027) now refuse a
 * negative count, and this sees a count that is wrong in either direction.
 */
export async function assertCountersMatchRows(sql: postgres.Sql): Promise<void> {
  const queues = await sql`
    select q.tenant_id, q.class, q.depth,
      (select count(*) from jobs j where j.tenant_id = q.tenant_id and j.priority = q.class and j.state in ('QUEUED', 'WAITING_QUOTA'))::int as waiting
    from sched_queues q`;
  for (const q of queues) assert.equal(q.depth, q.waiting, `queue ${q.tenant_id}/${q.class}: depth counter = waiting jobs`);
  const tenants = await sql`
    select t.tenant_id, t.in_flight, (select count(*) from reservations r where r.tenant_id = t.tenant_id and r.settled_at is null)::int as open
    from sched_tenants t`;
  for (const t of tenants) assert.equal(t.in_flight, t.open, `tenant ${t.tenant_id}: in-flight counter = open reservations`);
}

/** I6/I7: every job ended (or waits), has at most one result row, and pg-boss holds nothing unacknowledged. */
export async function assertJobsAccountedFor(sql: postgres.Sql): Promise<Record<string, number>> {
  // States as they show (a quota-blocked tenant's QUEUED jobs show WAITING_QUOTA).
  const rows = await sql`
    select sluice_job_state(j.state, qt.quota_blocked) as state, count(*)::int as n
    from jobs j left join sched_tenants qt on qt.tenant_id = j.tenant_id group by 1`;
  const byState = Object.fromEntries(rows.map((r) => [r.state as string, r.n as number]));
  assert.equal(byState.RUNNING ?? 0, 0, 'no job left RUNNING');
  // I6's one result per job id holds by construction: the result is on the job's own row.
  const [unacked] = await sql`
    select count(*)::int as n from pgboss.job b join jobs j on j.id = b.id
    where j.state in ('SUCCEEDED', 'FAILED') and b.state not in ('completed', 'cancelled', 'failed')`;
  assert.equal(unacked!.n, 0, 'finished jobs are acknowledged in pg-boss');
  const [finishedWithoutResult] = await sql`
    select count(*)::int as n from jobs j
    where j.state = 'SUCCEEDED' and j.http_status is null or j.state = 'FAILED' and j.error_code is null`;
  assert.equal(finishedWithoutResult!.n, 0, 'I6: no job finished without its result');
  return byState;
}

/**
 * I1 from the simulator's per-second timeline: in any run of k whole seconds,
 * calls <= burst + rate × (k + 1) (one extra second covers the bucket
 * boundaries of a per-second timeline).
 */
export function assertPaced(timeline: Record<string, number>, burst: number, perSecond: number): void {
  const seconds = Object.keys(timeline).map(Number);
  if (seconds.length === 0) return;
  const last = Math.max(...seconds);
  const counts = Array.from({ length: last + 1 }, (_, s) => timeline[String(s)] ?? 0);
  for (let start = 0; start < counts.length; start++) {
    let sum = 0;
    for (let k = 1; start + k <= counts.length; k++) {
      sum += counts[start + k - 1]!;
      assert.ok(sum <= burst + perSecond * (k + 1), `I1: ${sum} calls in seconds ${start}..${start + k - 1} exceeds ${burst} + ${perSecond} x ${k + 1}`);
    }
  }
}
