// The operator view: a health strip, the account, windows (pace used against the learned rate,
// charts from the server's history), classes and the fairness line, alerts and breakers, job
// search with retry, the tenants table, and a tenant's page (queues, jobs, limits, fairness, usage
// chart and CSV, suspend, resume, delete, its API keys and webhook endpoints).
// Live through the systemStatus subscription.
import { useEffect, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { gql, subscribe } from './api.js';
import { errorText, lagText, learnedText, ms, num, paceText, reason, RETRYABLE, secs, time } from './format.js';
import { ApiKeys } from './keys.js';
import { Webhooks } from './webhooks.js';
import { JobsTable, RETRY } from './jobs.js';
import { Chart, Confirm, QuotaMeter, SecretOnce, stats, useFocusOnOpen, usePoll } from './ui.js';

const SYSTEM = `subscription Console { systemStatus {
  account { creditsRemaining maxCredits renewalAt statusAt dispatchStoppedUntil stopReason }
  windows { name ratePerMinute configuredRatePerMinute observedLimitPerMinute paceReason pacedAt limitPerMinute burst tokens pausedUntil pauseReason poolSize busy latencyP50Ms latencyP95Ms callsPerSecond paceUsed }
  classes { priority depth running oldestAgeSeconds agePromiseSeconds }
  alerts { key severity message raisedAt }
  breakers { api state openedAt retryAt }
  estimatedDrainSeconds
  health { status reasons }
  fairness { seconds worst { tenantA tenantB lag bound } tenants { tenantId lag bound } }
} }`;

const RANGES = [
  ['MINUTES_15', '15 min', 900],
  ['HOUR_1', '1 h', 3600],
  ['HOURS_24', '24 h', 86400],
];
const HISTORY = `query History($range: HistoryRange) { systemHistory(range: $range) { window points { at callsPerSecond pacedPerSecond busy poolSize } } }`;

/** The windows' chart history, kept by the server (a reload is not empty), read again every 5 s. */
function useHistory(token, range, onError) {
  const [history, setHistory] = useState(new Map());
  usePoll(
    () => gql(token, HISTORY, { range }),
    (d) => {
      const m = new Map();
      for (const w of d.systemHistory) {
        const p = w.points;
        m.set(w.window, { t: p.map((x) => Date.parse(x.at) / 1000), calls: p.map((x) => x.callsPerSecond), rate: p.map((x) => x.pacedPerSecond), busy: p.map((x) => x.busy), pool: p.map((x) => x.poolSize) });
      }
      setHistory(m);
    },
    onError,
    [token, range],
  );
  return history;
}

const HEALTH_TEXT = { HEALTHY: 'Healthy', DEGRADED: 'Degraded', STOPPED: 'Stopped' };

function HealthStrip({ health }) {
  return html`<section class=${`health wide ${health.status}`} role="status" aria-live="polite" aria-labelledby="health-h" data-testid="health">
    <h2 id="health-h"><span aria-hidden="true">${health.status === 'HEALTHY' ? '●' : health.status === 'DEGRADED' ? '▲' : '■'}</span> ${HEALTH_TEXT[health.status]}</h2>
    <ul>${health.reasons.map((r) => html`<li>${r}</li>`)}</ul>
  </section>`;
}

function Account({ account, token, onError }) {
  const [asking, setAsking] = useState(false);
  const [note, setNote] = useState(null);
  const resume = async () => {
    try {
      await gql(token, 'mutation { resumeDispatch { account { dispatchStoppedUntil } } }');
      setNote('Dispatch resumed.');
    } catch (e) {
      onError(e);
    } finally {
      setAsking(false);
    }
  };
  const stopped = account.dispatchStoppedUntil !== null;
  return html`<section aria-labelledby="account-h" class="card">
    <h2 id="account-h">Account</h2>
    <dl class="facts">
      <div><dt>Credits remaining</dt><dd data-testid="credits">${num(account.creditsRemaining)}${account.maxCredits !== null ? html` <span class="muted">of ${num(account.maxCredits)}</span>` : ''}</dd></div>
      <div><dt>Renewal</dt><dd>${time(account.renewalAt)}</dd></div>
      <div><dt>Dispatch</dt><dd class=${stopped ? 'bad' : 'good'}>${stopped ? `stopped until ${time(account.dispatchStoppedUntil)}` : 'running'}</dd></div>
      <div><dt>Stop reason</dt><dd>${account.stopReason ?? '—'}</dd></div>
    </dl>
    ${stopped && !asking && html`<button type="button" onClick=${() => setAsking(true)}>Resume dispatch…</button>`}
    ${asking && html`<${Confirm} title="Resume dispatch?" message="Dispatch stopped because the account ran out of credits. Resume only once the account has credits again, or the calls will be refused upstream." confirmLabel="Resume dispatch" onConfirm=${resume} onCancel=${() => setAsking(false)} />`}
    ${note && html`<span class="muted" role="status"> ${note}</span>`}
  </section>`;
}

function WindowState({ w, token, onError }) {
  const [asking, setAsking] = useState(false);
  if (!w.pausedUntil) return html`<span class="good">open</span>`;
  const resume = async () => {
    try {
      await gql(token, 'mutation($w: String) { resumeDispatch(window: $w) { account { dispatchStoppedUntil } } }', { w: w.name });
    } catch (e) {
      onError(e);
    } finally {
      setAsking(false);
    }
  };
  return html`<span class="bad">paused (${w.pauseReason}) until ${time(w.pausedUntil)}</span>
    ${w.pauseReason === 'KEY_UNUSABLE' && !asking && html` <button type="button" class="secondary" onClick=${() => setAsking(true)} aria-label=${`Resume window ${w.name}`}>Resume…</button>`}
    ${asking && html`<${Confirm} title=${`Resume window ${w.name}?`} message="Its key was refused upstream (401/403). Resume once the key is fixed, or the next call stops it again." confirmLabel=${`Resume ${w.name}`} onConfirm=${resume} onCancel=${() => setAsking(false)} />`}`;
}

function Windows({ windows, token, onError }) {
  const [range, setRange] = useState('MINUTES_15');
  const history = useHistory(token, range, onError);
  const [, label, span] = RANGES.find(([r]) => r === range);
  return html`<section aria-labelledby="windows-h" class="card wide">
    <h2 id="windows-h">Windows</h2>
    <table class="stack" data-testid="windows">
      <thead><tr><th scope="col">Window</th><th scope="col">Pace used</th><th scope="col">Rates</th><th scope="col">Tokens</th><th scope="col">Busy / pool</th><th scope="col">Latency p50 / p95</th><th scope="col">State</th></tr></thead>
      <tbody>
        ${windows.map(
          (w) => html`<tr data-window=${w.name}>
            <th scope="row" data-label="Window">${w.name}</th>
            <td data-label="Pace used"><span data-testid="calls">${paceText(w)}</span>
              ${learnedText(w) && html`<div class="small warn" data-testid="pace-learned">${learnedText(w)}</div>`}</td>
            <td data-label="Rates">${w.ratePerMinute === null ? 'unlimited' : html`paced ${num(w.ratePerMinute, 1)}/min${learnedText(w) ? ' (learned)' : ''}${w.configuredRatePerMinute !== null ? html` <span class="muted">configured ${num(w.configuredRatePerMinute, 1)}/min</span>` : ''}${w.limitPerMinute !== null ? html` <span class="muted">of a ${num(w.limitPerMinute)}/min limit</span>` : ''}`}</td>
            <td data-label="Tokens" data-testid="tokens">${w.tokens === null ? '—' : num(w.tokens, 1)} <span class="muted">/ ${num(w.burst)}</span></td>
            <td data-label="Busy / pool" data-testid="busy">${w.busy} / ${w.poolSize}</td>
            <td data-label="Latency p50 / p95">${ms(w.latencyP50Ms)} / ${ms(w.latencyP95Ms)}</td>
            <td data-label="State"><${WindowState} w=${w} token=${token} onError=${onError} /></td>
          </tr>`,
        )}
      </tbody>
    </table>
    <div class="inline range" role="group" aria-label="Chart range">
      <span class="muted">Charts over</span>
      ${RANGES.map(([r, text]) => html`<button type="button" class=${r === range ? '' : 'secondary'} aria-pressed=${r === range} onClick=${() => setRange(r)}>${text}</button>`)}
      <span class="muted">(kept by the server; times in UTC)</span>
    </div>
    <div class="charts">
      ${windows.map((w) => {
        const h = history.get(w.name);
        if (!h || h.t.length === 0) return html`<p class="muted" key=${w.name}>${w.name}: no history yet (the server samples every 5 s).</p>`;
        const c = stats(h.calls);
        const b = stats(h.busy);
        const paced = stats(h.rate);
        return html`<div class="chart-pair" key=${w.name}>
          <${Chart} key=${`${w.name}-calls-${range}`} title=${`${w.name}: calls/s vs paced rate (${label})`} unit="calls/s" xSpan=${span} data=${[h.t, h.calls, h.rate]}
            series=${[{ label: 'calls/s', color: '#0b5cad' }, { label: 'paced rate/s', color: '#a33b00', dash: [6, 4] }]}
            summary=${`Last ${label}: ${num(c.avg, 2)} calls/s on average, peak ${num(c.peak, 2)}, now ${num(c.last, 2)}; paced rate ${paced.last === null ? 'unlimited' : `${num(paced.last, 2)} calls/s`}.`} />
          <${Chart} key=${`${w.name}-busy-${range}`} title=${`${w.name}: in flight vs pool size (${label})`} unit="calls in flight" xSpan=${span} data=${[h.t, h.busy, h.pool]}
            series=${[{ label: 'in flight', color: '#1b6e2e' }, { label: 'pool size', color: '#6b2fa3', dash: [6, 4] }]}
            summary=${`Last ${label}: at most ${num(b.peak)} calls in flight, ${num(b.last)} now, of a pool of ${num(stats(h.pool).last)}.`} />
        </div>`;
      })}
    </div>
  </section>`;
}

/**
 * Tenant names for ids the system status names (the fairness pair), read once per id and kept:
 * the status pushes ids, and a name does not change often enough to re-read each second.
 */
function useTenantNames(token, ids) {
  const [names, setNames] = useState(new Map());
  const missing = ids.filter((id) => !names.has(id));
  const key = missing.join(',');
  useEffect(() => {
    if (missing.length === 0) return undefined;
    let stale = false;
    const query = `query Names(${missing.map((_, i) => `$t${i}: ID!`).join(', ')}) { ${missing.map((_, i) => `t${i}: tenantRow(id: $t${i}) { tenant { id name } }`).join(' ')} }`;
    gql(token, query, Object.fromEntries(missing.map((id, i) => [`t${i}`, id])))
      .then((d) => {
        if (stale) return;
        const next = new Map(names);
        missing.forEach((id, i) => next.set(id, d[`t${i}`]?.tenant.name ?? `${id.slice(0, 8)}… (deleted)`));
        setNames(next);
      })
      .catch(() => {});
    return () => {
      stale = true;
    };
  }, [token, key]);
  return (id) => names.get(id) ?? `${id.slice(0, 8)}…`;
}

/** The SFQ fairness line: the worst pair of tenants backlogged together, its lag against its bound. */
function FairnessLine({ fairness, nameOf }) {
  const w = fairness.worst;
  return html`<p data-testid="fairness" class=${w && w.lag > w.bound ? 'bad' : ''}>
    <strong>Fairness</strong> <span class="muted">(last ${secs(fairness.seconds)})</span>:
    ${w ? html` worst pair ${nameOf(w.tenantA)} and ${nameOf(w.tenantB)}, ${lagText(w.lag, w.bound)}.` : ' no two tenants were backlogged together.'}
  </p>`;
}

function Classes({ classes, drain, fairness, nameOf }) {
  return html`<section aria-labelledby="classes-h" class="card">
    <h2 id="classes-h">Classes</h2>
    <table class="stack">
      <thead><tr><th scope="col">Class</th><th scope="col">Depth</th><th scope="col">Running</th><th scope="col">Oldest / promise</th></tr></thead>
      <tbody>
        ${classes.map(
          (c) => html`<tr>
            <th scope="row" data-label="Class">${c.priority}</th>
            <td data-label="Depth">${num(c.depth)}</td>
            <td data-label="Running">${num(c.running)}</td>
            <td data-label="Oldest / promise" class=${c.oldestAgeSeconds !== null && c.agePromiseSeconds !== null && c.oldestAgeSeconds > c.agePromiseSeconds ? 'bad' : ''}>
              ${secs(c.oldestAgeSeconds)} / ${secs(c.agePromiseSeconds)}</td>
          </tr>`,
        )}
      </tbody>
    </table>
    <p class="muted">All waiting work drains in about ${secs(drain)}.</p>
    <${FairnessLine} fairness=${fairness} nameOf=${nameOf} />
  </section>`;
}

function Alerts({ alerts, breakers }) {
  const notClosed = breakers.filter((b) => b.state !== 'CLOSED');
  return html`<section aria-labelledby="alerts-h" class="card">
    <h2 id="alerts-h">Alerts and breakers</h2>
    ${alerts.length === 0 ? html`<p class="good">No active alerts.</p>` : html`<ul class="alerts">
      ${alerts.map((a) => html`<li class=${a.severity === 'page' ? 'bad' : 'warn'}><strong>${a.key}</strong> (${a.severity}) ${a.message} <span class="muted">since ${time(a.raisedAt)}</span></li>`)}
    </ul>`}
    ${notClosed.length === 0 ? html`<p class="good">${breakers.length === 0 ? "No breaker has opened." : `All ${breakers.length} breakers closed.`}</p>` : html`<ul class="alerts">
      ${notClosed.map((b) => html`<li class="bad"><strong>${b.api}</strong> ${b.state}${b.retryAt ? `, probe at ${time(b.retryAt)}` : ''}</li>`)}
    </ul>`}
  </section>`;
}

const TENANT_TABLE = `query Tenants($first: Int, $offset: Int, $orderBy: TenantOrder, $descending: Boolean, $nameContains: String, $tier: Tier) {
  tenantTable(first: $first, offset: $offset, orderBy: $orderBy, descending: $descending, nameContains: $nameContains, tier: $tier) {
    totalCount
    rows { tenant { id name tier weight concurrencyCap monthlyQuota queueBound quotaPolicy suspendedAt }
      queues { priority depth running waitReason } usage { creditsUsed creditsReserved quota } }
  }
}`;
const PAGE = 25;
const COLUMNS = [
  ['NAME', 'Name'],
  ['TIER', 'Tier'],
  [null, 'Weight'],
  [null, 'Cap'],
  ['IN_FLIGHT', 'In flight'],
  ['DEPTH', 'Depth I / S / B'],
  [null, 'Wait reason'],
  [null, 'Usage / quota'],
  [null, 'Actions'],
];

function LimitsForm({ tenant, token, onDone, onError }) {
  const [f, setF] = useState({ tier: tenant.tier, weight: tenant.weight, concurrencyCap: tenant.concurrencyCap, monthlyQuota: tenant.monthlyQuota, queueBound: tenant.queueBound, quotaPolicy: tenant.quotaPolicy });
  const set = (k) => (e) => setF({ ...f, [k]: e.currentTarget.value });
  const save = async (ev) => {
    ev.preventDefault();
    try {
      await gql(token, 'mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id } }', {
        i: { id: tenant.id, tier: f.tier, quotaPolicy: f.quotaPolicy, weight: Number(f.weight), concurrencyCap: Number(f.concurrencyCap), monthlyQuota: Number(f.monthlyQuota), queueBound: Number(f.queueBound) },
      });
      onDone();
    } catch (e) {
      onError(e);
    }
  };
  const field = (k, label) => html`<label>${label}<input type="number" min="0" required value=${f[k]} onInput=${set(k)} /></label>`;
  return html`<form class="limits" onSubmit=${save} aria-label=${`Limits of ${tenant.name}`}>
    <label>Tier<select value=${f.tier} onChange=${set('tier')}>${['FREE', 'PRO', 'ENTERPRISE'].map((t) => html`<option>${t}</option>`)}</select></label>
    ${field('weight', 'Weight')} ${field('concurrencyCap', 'Concurrency cap')} ${field('monthlyQuota', 'Monthly quota')} ${field('queueBound', 'Queue bound')}
    <label>Quota policy<select value=${f.quotaPolicy} onChange=${set('quotaPolicy')}><option>WAIT</option><option>FAIL</option></select></label>
    <button type="submit">Save limits</button>
    <button type="button" class="secondary" onClick=${onDone}>Cancel</button>
  </form>`;
}

function Tenants({ token, onError, onOpen, reloadKey }) {
  const [q, setQ] = useState({ orderBy: 'NAME', descending: false, nameContains: '', tier: '', offset: 0 });
  const [page, setPage] = useState(null);
  const [reload, setReload] = useState(0);
  const [key, setKey] = useState(null);
  const [editing, setEditing] = useState(null);
  const [name, setName] = useState('');
  const [tier, setTier] = useState('PRO');
  const [rotating, setRotating] = useState(null);

  // The counters in the table move with the jobs: re-read every 5 s (well under once a second).
  usePoll(
    () => gql(token, TENANT_TABLE, { first: PAGE, offset: q.offset, orderBy: q.orderBy, descending: q.descending, nameContains: q.nameContains || null, tier: q.tier || null }),
    (d) => setPage(d.tenantTable),
    onError,
    [q, reload, reloadKey],
  );

  const sortBy = (col) => setQ({ ...q, orderBy: col, descending: q.orderBy === col ? !q.descending : false, offset: 0 });
  const create = async (ev) => {
    ev.preventDefault();
    try {
      const d = await gql(token, 'mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id name } apiKey } }', { i: { name, tier } });
      setKey({ title: `Tenant ${d.createTenant.tenant.name} created.`, apiKey: d.createTenant.apiKey });
      setName('');
      setReload((n) => n + 1);
    } catch (e) {
      onError(e);
    }
  };
  const rotate = async (t) => {
    try {
      const d = await gql(token, 'mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }', { id: t.id });
      setKey({ title: `New key for ${t.name}.`, apiKey: d.rotateTenantKey.apiKey });
    } catch (e) {
      onError(e);
    } finally {
      setRotating(null);
    }
  };
  const total = page?.totalCount ?? 0;
  return html`<section aria-labelledby="tenants-h" class="card wide">
    <h2 id="tenants-h">Tenants</h2>
    <form class="inline" onSubmit=${create} aria-label="Create a tenant">
      <label>New tenant name<input required maxlength="100" value=${name} onInput=${(e) => setName(e.currentTarget.value)} /></label>
      <label>Tier<select value=${tier} onChange=${(e) => setTier(e.currentTarget.value)}><option>FREE</option><option>PRO</option><option>ENTERPRISE</option></select></label>
      <button type="submit">Create tenant</button>
    </form>
    ${key && html`<${SecretOnce} title=${key.title} secret=${key.apiKey} onClose=${() => setKey(null)} />`}
    <div class="inline filters" role="search">
      <label>Filter by name<input type="search" value=${q.nameContains} onInput=${(e) => setQ({ ...q, nameContains: e.currentTarget.value, offset: 0 })} /></label>
      <label>Tier<select value=${q.tier} onChange=${(e) => setQ({ ...q, tier: e.currentTarget.value, offset: 0 })}><option value="">any</option><option>FREE</option><option>PRO</option><option>ENTERPRISE</option></select></label>
    </div>
    <table class="stack" data-testid="tenants">
      <thead><tr>${COLUMNS.map(([col, label]) =>
        col
          ? html`<th scope="col" aria-sort=${q.orderBy === col ? (q.descending ? 'descending' : 'ascending') : 'none'}>
              <button type="button" class="sort" onClick=${() => sortBy(col)}>${label}${q.orderBy === col ? (q.descending ? ' ▼' : ' ▲') : ''}</button></th>`
          : html`<th scope="col">${label}</th>`,
      )}</tr></thead>
      <tbody>
        ${(page?.rows ?? []).map((r) => {
          const t = r.tenant;
          const inFlight = r.queues.reduce((s, x) => s + x.running, 0);
          const waiting = r.queues.find((x) => x.waitReason);
          const used = r.usage.creditsUsed + r.usage.creditsReserved;
          return html`<tr key=${t.id}>
            <th scope="row" data-label="Name"><button type="button" class="link" onClick=${() => onOpen(t.id)} aria-label=${`Open tenant ${t.name}`}>${t.name}</button>${t.suspendedAt ? html` <span class="bad small">suspended</span>` : ''}</th>
            <td data-label="Tier">${t.tier}</td>
            <td data-label="Weight">${t.weight}</td>
            <td data-label="Cap">${t.concurrencyCap}</td>
            <td data-label="In flight">${inFlight}</td>
            <td data-label="Depth I / S / B">${r.queues.map((x) => x.depth).join(' / ')}</td>
            <td data-label="Wait reason">${waiting ? `${waiting.priority}: ${reason(waiting.waitReason)}` : '—'}</td>
            <td data-label="Usage / quota"><${QuotaMeter} used=${used} quota=${r.usage.quota} label=${`credits used by ${t.name}`} /></td>
            <td data-label="Actions" class="actions">
              <button type="button" class="secondary" onClick=${() => setEditing(t)} aria-label=${`Change limits of ${t.name}`}>Limits</button>
              <button type="button" class="secondary" onClick=${() => setRotating(t)} aria-label=${`Rotate the key of ${t.name}`}>Rotate key…</button>
            </td>
          </tr>`;
        })}
      </tbody>
    </table>
    ${rotating && html`<${Confirm} title=${`Rotate the key of ${rotating.name}?`} message="A new key is issued and shown once; the tenant's other live keys get an expiry (KEY_ROTATION_OVERLAP_SECONDS, 24 h by default), so its clients keep working while they switch. Revoke a key on the tenant's page to end it at once." confirmLabel="Rotate key" danger=${true} onConfirm=${() => rotate(rotating)} onCancel=${() => setRotating(null)} />`}
    ${editing && html`<${LimitsForm} tenant=${editing} token=${token} onError=${onError} onDone=${() => { setEditing(null); setReload((n) => n + 1); }} />`}
    <nav class="pager" aria-label="Tenant pages">
      <button type="button" class="secondary" disabled=${q.offset === 0} onClick=${() => setQ({ ...q, offset: Math.max(0, q.offset - PAGE) })}>Previous</button>
      <span>${total === 0 ? 'No tenants' : `${q.offset + 1}–${Math.min(total, q.offset + PAGE)} of ${num(total)}`}</span>
      <button type="button" class="secondary" disabled=${q.offset + PAGE >= total} onClick=${() => setQ({ ...q, offset: q.offset + PAGE })}>Next</button>
    </nav>
  </section>`;
}

const SEARCH = `query Search($text: String!) { jobSearch(text: $text) { tenant { id name } job { id api priority state createdAt idempotencyKey retryOf traceId traceUrl } } }`;

/** Find any tenant's job by id or idempotency key, open its tenant, and retry it when it failed or was cancelled. */
function JobSearch({ token, onOpenTenant }) {
  const [text, setText] = useState('');
  const [hits, setHits] = useState(null);
  const [note, setNote] = useState(null);
  const search = async (ev, keepNote = false) => {
    ev?.preventDefault();
    if (!keepNote) setNote(null);
    try {
      setHits((await gql(token, SEARCH, { text: text.trim() })).jobSearch);
    } catch (e) {
      setNote({ ok: false, text: errorText(e) });
    }
  };
  const retry = async (id) => {
    try {
      const d = await gql(token, RETRY, { id });
      setNote({ ok: true, text: `Job ${id} retried as job ${d.retryJob.id} (${d.retryJob.state}).` });
      await search(null, true);
    } catch (e) {
      setNote({ ok: false, text: errorText(e) });
    }
  };
  return html`<section aria-labelledby="search-h" class="card wide">
    <h2 id="search-h">Find a job</h2>
    <form class="inline" role="search" aria-label="Find a job" onSubmit=${search}>
      <label>Job id or idempotency key<input required maxlength="200" size="40" value=${text} onInput=${(e) => setText(e.currentTarget.value)} /></label>
      <button type="submit">Find</button>
    </form>
    ${note && html`<p class=${note.ok ? 'good' : 'error'} role=${note.ok ? 'status' : 'alert'}>${note.text}</p>`}
    ${hits && hits.length === 0 && html`<p class="muted" role="status">No job has that id or idempotency key.</p>`}
    ${hits && hits.length > 0 && html`<table class="stack" data-testid="search-results">
      <thead><tr><th scope="col">Job</th><th scope="col">Tenant</th><th scope="col">API</th><th scope="col">State</th><th scope="col">Created</th><th scope="col">Actions</th></tr></thead>
      <tbody>${hits.map(
        (h) => html`<tr key=${h.job.id} data-job=${h.job.id}>
          <th scope="row" data-label="Job"><code>${h.job.id}</code>${h.job.idempotencyKey && html`<div class="muted small">key ${h.job.idempotencyKey}</div>`}${h.job.traceId && html`<div class="muted small" data-testid="search-trace">trace ${h.job.traceUrl ? html`<a href=${h.job.traceUrl} target="_blank" rel="noopener noreferrer">${h.job.traceId}</a>` : h.job.traceId}</div>`}</th>
          <td data-label="Tenant"><button type="button" class="link" onClick=${() => onOpenTenant(h.tenant.id)}>${h.tenant.name}</button></td>
          <td data-label="API">${h.job.api} (${h.job.priority})</td>
          <td data-label="State"><span class=${`state ${h.job.state}`}>${h.job.state}</span></td>
          <td data-label="Created">${time(h.job.createdAt)}</td>
          <td data-label="Actions">${RETRYABLE.has(h.job.state) ? html`<button type="button" class="secondary" onClick=${() => retry(h.job.id)} aria-label=${`Retry job ${h.job.id}`}>Retry</button>` : '—'}</td>
        </tr>`,
      )}</tbody>
    </table>`}
  </section>`;
}

const TENANT_ROW = `query Tenant($id: ID!, $from: DateTime!, $to: DateTime!) {
  tenantRow(id: $id) {
    tenant { id name tier weight concurrencyCap monthlyQuota queueBound quotaPolicy requestRate requestBurst suspendedAt createdAt
      usageHistory(from: $from, to: $to, granularity: DAY) { start calls succeeded failed creditsBilled } }
    queues { priority depth running oldestAgeSeconds waitReason }
    usage { creditsUsed creditsReserved quota periodStart periodEnd }
  }
}`;
const DAY = 86_400_000;

/** Downloads text as a file, without leaving the page (no alert, no new tab). */
function download(name, text) {
  const url = URL.createObjectURL(new Blob([text], { type: 'text/csv' }));
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** A tenant's SFQ lag against its bound, from the system status's fairness, in words. */
function fairnessOf(fairness, id) {
  const mine = fairness.tenants.find((x) => x.tenantId === id);
  if (!mine) return html`<strong>Fairness:</strong> not backlogged alongside another tenant in the last ${secs(fairness.seconds)}.`;
  return html`<strong>Fairness:</strong> <span class=${mine.lag > mine.bound ? 'bad' : ''}>${lagText(mine.lag, mine.bound)}</span> against the other backlogged tenants, over the last ${secs(fairness.seconds)}.`;
}

/** One tenant: its queues, jobs (recent and failed), limits, usage chart and CSV, and suspend, resume, delete. */
function TenantPage({ token, id, fairness, onClose, onChanged }) {
  const [row, setRow] = useState(null);
  const [error, setError] = useState(null);
  const [asking, setAsking] = useState(null); // 'suspend' | 'resume' | 'delete'
  const [editing, setEditing] = useState(false);
  const [reload, setReload] = useState(0);
  const [note, setNote] = useState(null);
  const ref = useFocusOnOpen();
  const to = new Date(Math.ceil(Date.now() / DAY) * DAY);
  const from = new Date(to.getTime() - 30 * DAY);
  usePoll(
    () => gql(token, TENANT_ROW, { id, from: from.toISOString(), to: to.toISOString() }),
    (d) => (d.tenantRow ? setRow(d.tenantRow) : setError({ code: 'NOT_FOUND', message: 'This tenant no longer exists.' })),
    setError,
    [token, id, reload],
  );
  const act = async (what) => {
    setError(null);
    try {
      if (what === 'delete') {
        const d = await gql(token, 'mutation($id: ID!) { deleteTenant(id: $id) { id cancelledJobs } }', { id });
        onChanged();
        onClose(`Tenant ${row.tenant.name} deleted; ${d.deleteTenant.cancelledJobs} waiting job(s) cancelled, never billed.`);
        return;
      }
      await gql(token, `mutation($id: ID!) { ${what}Tenant(id: $id) { id } }`, { id });
      setNote(what === 'suspend' ? 'Suspended: submissions are refused and queued jobs are held.' : 'Resumed: submissions are accepted and held jobs dispatch again.');
      setReload((n) => n + 1);
      onChanged();
    } catch (e) {
      setError(e);
    } finally {
      setAsking(null);
    }
  };
  const csv = async () => {
    setError(null);
    try {
      const q = new URLSearchParams({ tenantId: id, from: from.toISOString(), to: to.toISOString(), granularity: 'DAY', groupBy: 'API' });
      const res = await fetch(`/usage.csv?${q}`, { headers: { authorization: `Bearer ${token}` } });
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
      download(`usage-${row.tenant.name}-${from.toISOString().slice(0, 10)}.csv`, await res.text());
      setNote('Usage CSV downloaded (last 30 days, by day and API).');
    } catch (e) {
      setError(e);
    }
  };
  const t = row?.tenant;
  const hist = t?.usageHistory ?? [];
  const billed = hist.reduce((s, r) => s + r.creditsBilled, 0);
  const calls = hist.reduce((s, r) => s + r.calls, 0);
  const used = row ? row.usage.creditsUsed + row.usage.creditsReserved : 0;
  return html`<section aria-labelledby="tenant-h" class="card wide tenant-page" data-testid="tenant-page" tabindex="-1" ref=${ref}>
    <h2 id="tenant-h">Tenant ${t?.name ?? '…'}${t?.suspendedAt ? html` <span class="bad">(suspended since ${time(t.suspendedAt)})</span>` : ''}</h2>
    ${error && html`<p class="error" role="alert">${errorText(error)}</p>`}
    ${note && html`<p class="good" role="status">${note}</p>`}
    ${row && html`
      <dl class="facts">
        <div><dt>Id</dt><dd><code>${t.id}</code></dd></div>
        <div><dt>Tier</dt><dd>${t.tier}</dd></div>
        <div><dt>Weight / cap</dt><dd>${t.weight} / ${t.concurrencyCap}</dd></div>
        <div><dt>Queue bound</dt><dd>${num(t.queueBound)}</dd></div>
        <div><dt>Quota policy</dt><dd>${t.quotaPolicy}</dd></div>
        <div><dt>Request budget</dt><dd>${t.requestRate}/s, burst ${t.requestBurst}</dd></div>
        <div><dt>Created</dt><dd>${time(t.createdAt)}</dd></div>
        <div><dt>Period</dt><dd>${time(row.usage.periodStart)} – ${time(row.usage.periodEnd)}</dd></div>
      </dl>
      ${fairness && html`<p data-testid="tenant-fairness">${fairnessOf(fairness, id)}</p>`}
      <p><strong>Credits this period:</strong> <${QuotaMeter} used=${used} quota=${row.usage.quota} label=${`credits used by ${t.name}`} /></p>
      <div class="actions">
        <button type="button" class="secondary" onClick=${() => setEditing(!editing)}>Limits…</button>
        ${t.suspendedAt
          ? html`<button type="button" class="secondary" onClick=${() => setAsking('resume')}>Resume…</button>`
          : html`<button type="button" class="secondary" onClick=${() => setAsking('suspend')}>Suspend…</button>`}
        <button type="button" class="danger" onClick=${() => setAsking('delete')}>Delete…</button>
        <button type="button" class="secondary" onClick=${csv}>Download usage CSV</button>
        <button type="button" class="secondary" onClick=${() => onClose()}>Close</button>
      </div>
      ${asking === 'suspend' && html`<${Confirm} title=${`Suspend ${t.name}?`} message="Its submissions are refused (TENANT_SUSPENDED) and its queued jobs are held; calls in flight finish." confirmLabel="Suspend" danger=${true} onConfirm=${() => act('suspend')} onCancel=${() => setAsking(null)} />`}
      ${asking === 'resume' && html`<${Confirm} title=${`Resume ${t.name}?`} message="Submissions are accepted again and its held jobs are dispatched." confirmLabel="Resume" onConfirm=${() => act('resume')} onCancel=${() => setAsking(null)} />`}
      ${asking === 'delete' && html`<${Confirm} title=${`Delete ${t.name}?`} message="Its keys are revoked, its waiting jobs cancelled (not billed), its queues and rows deleted once calls in flight settle. Usage history is kept. This cannot be undone." confirmLabel=${`Delete ${t.name}`} danger=${true} onConfirm=${() => act('delete')} onCancel=${() => setAsking(null)} />`}
      ${editing && html`<${LimitsForm} tenant=${t} token=${token} onError=${setError} onDone=${() => { setEditing(false); setReload((n) => n + 1); onChanged(); }} />`}
      <h3>Queues</h3>
      <table class="stack" data-testid="tenant-queues">
        <thead><tr><th scope="col">Class</th><th scope="col">Waiting</th><th scope="col">Running</th><th scope="col">Oldest</th><th scope="col">Wait reason</th></tr></thead>
        <tbody>${row.queues.map((q) => html`<tr>
          <th scope="row" data-label="Class">${q.priority}</th>
          <td data-label="Waiting">${num(q.depth)}</td>
          <td data-label="Running">${num(q.running)}</td>
          <td data-label="Oldest">${secs(q.oldestAgeSeconds)}</td>
          <td data-label="Wait reason">${reason(q.waitReason)}</td>
        </tr>`)}</tbody>
      </table>
      <h3>Usage, last 30 days</h3>
      <${Chart} key=${`usage-${id}`} title=${`${t.name}: credits billed per day (UTC)`} unit="credits" bars=${true} xRange=${[from.getTime() / 1000 - DAY / 2000, to.getTime() / 1000]}
        data=${[hist.map((r) => Date.parse(r.start) / 1000), hist.map((r) => r.creditsBilled)]}
        series=${[{ label: 'credits billed', color: '#0b5cad' }]}
        summary=${hist.length === 0 ? 'No settled calls in the last 30 days.' : `Last 30 days: ${num(billed)} credits billed over ${num(calls)} calls on ${hist.length} day(s); busiest day ${num(stats(hist.map((r) => r.creditsBilled)).peak)} credits.`} />`}
    ${row && html`<div class="nested">
      <${JobsTable} token=${token} tenantId=${id} id="tenant-failed" title="Failed jobs" fixed=${{ state: 'FAILED' }} filters=${false} pageSize=${10} reload=${reload} onRetried=${() => setReload((n) => n + 1)} />
      <${JobsTable} token=${token} tenantId=${id} id="tenant-jobs" title="Recent jobs" pageSize=${10} reload=${reload} onRetried=${() => setReload((n) => n + 1)} />
      <${ApiKeys} token=${token} tenantId=${id} tenantName=${t.name} />
      <${Webhooks} token=${token} tenantId=${id} tenantName=${t.name} />
    </div>`}
  </section>`;
}

export function OperatorView({ token, client }) {
  const [system, setSystem] = useState(null);
  const [error, setError] = useState(null);
  const [tenant, setTenant] = useState(null);
  const [note, setNote] = useState(null);
  const [changed, setChanged] = useState(0);
  useEffect(() => subscribe(client, SYSTEM, {}, (d) => setSystem(d.systemStatus), setError), [client]);
  const worst = system?.fairness.worst;
  const nameOf = useTenantNames(token, worst ? [worst.tenantA, worst.tenantB] : []);
  const onError = (e) => setError(e);
  const open = (id) => {
    setNote(null);
    setTenant(id);
  };
  return html`<main class="grid">
    <h1 class="visually-hidden">Operator console</h1>
    ${error && html`<p class="error wide" role="alert">${errorText(error)} <button type="button" class="secondary" onClick=${() => setError(null)}>Dismiss</button></p>`}
    ${!system
      ? html`<p class="loading">Waiting for the first system status…</p>`
      : html`
        <${HealthStrip} health=${system.health} />
        <${Account} account=${system.account} token=${token} onError=${onError} />
        <${Alerts} alerts=${system.alerts} breakers=${system.breakers} />
        <${Classes} classes=${system.classes} drain=${system.estimatedDrainSeconds} fairness=${system.fairness} nameOf=${nameOf} />
        <${Windows} windows=${system.windows} token=${token} onError=${onError} />`}
    <${JobSearch} token=${token} onOpenTenant=${open} />
    ${note && html`<p class="good wide" role="status">${note}</p>`}
    ${tenant && html`<${TenantPage} key=${tenant} token=${token} id=${tenant} fairness=${system?.fairness ?? null} onChanged=${() => setChanged((n) => n + 1)} onClose=${(why) => { setTenant(null); if (why) setNote(why); }} />`}
    <${Tenants} token=${token} onError=${onError} onOpen=${open} reloadKey=${changed} />
  </main>`;
}
