// The operator view: the account, windows (with live charts), classes, alerts and breakers,
// the tenants table, and the tenant actions. Live through the systemStatus subscription.
import { useEffect, useRef, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import uPlot from 'uplot';
import { gql, subscribe } from './api.js';
import { ms, num, pct, reason, secs, time } from './format.js';

const SYSTEM = `subscription Console { systemStatus {
  account { creditsRemaining maxCredits renewalAt statusAt dispatchStoppedUntil stopReason }
  windows { name ratePerMinute burst tokens pausedUntil pauseReason poolSize busy latencyP50Ms latencyP95Ms callsPerSecond }
  classes { priority depth running oldestAgeSeconds agePromiseSeconds }
  alerts { key severity message raisedAt }
  breakers { api state openedAt retryAt }
  estimatedDrainSeconds
} }`;

const HISTORY_SECONDS = 600;

/** Keeps the last 10 minutes of each window's figures, one point a second (the last push repeats while nothing changes). */
function useHistory(system) {
  const history = useRef(new Map());
  const [tick, setTick] = useState(0);
  const latest = useRef(null);
  latest.current = system;
  useEffect(() => {
    const add = () => {
      const s = latest.current;
      if (!s) return;
      const t = Math.floor(Date.now() / 1000);
      for (const w of s.windows) {
        let h = history.current.get(w.name);
        if (!h) history.current.set(w.name, (h = { t: [], calls: [], rate: [], busy: [], pool: [] }));
        if (h.t.length && h.t[h.t.length - 1] === t) for (const k of Object.keys(h)) h[k].pop();
        h.t.push(t);
        h.calls.push(w.callsPerSecond);
        h.rate.push(w.ratePerMinute === null ? null : w.ratePerMinute / 60);
        h.busy.push(w.busy);
        h.pool.push(w.poolSize);
        while (h.t.length && h.t[0] < t - HISTORY_SECONDS) for (const k of Object.keys(h)) h[k].shift();
      }
      setTick((n) => n + 1);
    };
    add();
    const timer = setInterval(add, 1000);
    return () => clearInterval(timer);
  }, [system === null]);
  return { history: history.current, tick };
}

function Chart({ title, series, data, tick }) {
  const box = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const width = () => Math.max(200, box.current.clientWidth);
    plot.current = new uPlot(
      {
        title,
        width: width(),
        height: 160,
        scales: { x: { time: true, range: (_u, _min, max) => [max - HISTORY_SECONDS, max] }, y: { range: (_u, min, max) => [0, Math.max(1, max * 1.15)] } },
        series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, dash: s.dash, points: { show: false } }))],
        axes: [{ stroke: '#333' }, { stroke: '#333', size: 44 }],
        legend: { live: false },
      },
      data,
      box.current,
    );
    const ro = new ResizeObserver(() => plot.current?.setSize({ width: width(), height: 160 }));
    ro.observe(box.current);
    return () => {
      ro.disconnect();
      plot.current?.destroy();
    };
  }, []);
  useEffect(() => {
    plot.current?.setData(data);
  }, [tick]);
  return html`<figure class="chart" ref=${box} aria-label=${title}></figure>`;
}

function Account({ account, token, onError }) {
  const [busy, setBusy] = useState(false);
  const [note, setNote] = useState(null);
  const resume = async () => {
    setBusy(true);
    try {
      await gql(token, 'mutation { resumeDispatch { account { dispatchStoppedUntil } } }');
      setNote('Dispatch resumed.');
    } catch (e) {
      onError(e);
    } finally {
      setBusy(false);
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
    <button type="button" onClick=${resume} disabled=${busy}>Resume dispatch</button>
    ${note && html`<span class="muted" role="status"> ${note}</span>`}
  </section>`;
}

function Windows({ windows, history, tick }) {
  return html`<section aria-labelledby="windows-h" class="card wide">
    <h2 id="windows-h">Windows</h2>
    <table class="stack" data-testid="windows">
      <thead><tr><th scope="col">Window</th><th scope="col">Paced rate</th><th scope="col">Calls/s</th><th scope="col">Tokens</th><th scope="col">Busy / pool</th><th scope="col">Latency p50 / p95</th><th scope="col">State</th></tr></thead>
      <tbody>
        ${windows.map(
          (w) => html`<tr data-window=${w.name}>
            <th scope="row" data-label="Window">${w.name}</th>
            <td data-label="Paced rate">${w.ratePerMinute === null ? 'unlimited' : `${num(w.ratePerMinute, 1)}/min`}</td>
            <td data-label="Calls/s" data-testid="calls">${num(w.callsPerSecond, 1)}</td>
            <td data-label="Tokens" data-testid="tokens">${w.tokens === null ? '—' : num(w.tokens, 1)} <span class="muted">/ ${num(w.burst)}</span></td>
            <td data-label="Busy / pool" data-testid="busy">${w.busy} / ${w.poolSize}</td>
            <td data-label="Latency p50 / p95">${ms(w.latencyP50Ms)} / ${ms(w.latencyP95Ms)}</td>
            <td data-label="State" class=${w.pausedUntil ? 'bad' : 'good'}>${w.pausedUntil ? `paused (${w.pauseReason}) until ${time(w.pausedUntil)}` : 'open'}</td>
          </tr>`,
        )}
      </tbody>
    </table>
    <div class="charts">
      ${windows.map((w) => {
        const h = history.get(w.name);
        if (!h) return null;
        return html`<div class="chart-pair" key=${w.name}>
          <${Chart} title=${`${w.name}: calls/s vs paced rate (10 min)`} tick=${tick} data=${[h.t, h.calls, h.rate]}
            series=${[{ label: 'calls/s', color: '#0b5cad' }, { label: 'paced rate/s', color: '#a33b00', dash: [6, 4] }]} />
          <${Chart} title=${`${w.name}: in flight vs pool size (10 min)`} tick=${tick} data=${[h.t, h.busy, h.pool]}
            series=${[{ label: 'in flight', color: '#1b6e2e' }, { label: 'pool size', color: '#6b2fa3', dash: [6, 4] }]} />
        </div>`;
      })}
    </div>
  </section>`;
}

function Classes({ classes, drain }) {
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
    rows { tenant { id name tier weight concurrencyCap monthlyQuota queueBound quotaPolicy }
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

function KeyOnce({ title, apiKey, onClose }) {
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(apiKey);
      setCopied(true);
    } catch {
      setCopied(false);
    }
  };
  return html`<div class="key-once" role="alert">
    <p><strong>${title}</strong> This key is shown once; Sluice keeps only its hash.</p>
    <code data-testid="new-key">${apiKey}</code>
    <button type="button" onClick=${copy}>${copied ? 'Copied' : 'Copy key'}</button>
    <button type="button" class="secondary" onClick=${onClose}>Done</button>
  </div>`;
}

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

function Tenants({ token, onError }) {
  const [q, setQ] = useState({ orderBy: 'NAME', descending: false, nameContains: '', tier: '', offset: 0 });
  const [page, setPage] = useState(null);
  const [reload, setReload] = useState(0);
  const [key, setKey] = useState(null);
  const [editing, setEditing] = useState(null);
  const [name, setName] = useState('');
  const [tier, setTier] = useState('PRO');

  useEffect(() => {
    let stale = false;
    const load = () =>
      gql(token, TENANT_TABLE, { first: PAGE, offset: q.offset, orderBy: q.orderBy, descending: q.descending, nameContains: q.nameContains || null, tier: q.tier || null })
        .then((d) => !stale && setPage(d.tenantTable))
        .catch(onError);
    load();
    // The counters in the table move with the jobs: refresh every 5 s (well under once a second).
    const timer = setInterval(load, 5000);
    return () => {
      stale = true;
      clearInterval(timer);
    };
  }, [q, reload]);

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
    if (!confirm(`Rotate the key of ${t.name}? Its current key stops working at once.`)) return;
    try {
      const d = await gql(token, 'mutation($id: ID!) { rotateTenantKey(id: $id) { apiKey } }', { id: t.id });
      setKey({ title: `New key for ${t.name}.`, apiKey: d.rotateTenantKey.apiKey });
    } catch (e) {
      onError(e);
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
    ${key && html`<${KeyOnce} ...${key} onClose=${() => setKey(null)} />`}
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
            <th scope="row" data-label="Name">${t.name}</th>
            <td data-label="Tier">${t.tier}</td>
            <td data-label="Weight">${t.weight}</td>
            <td data-label="Cap">${t.concurrencyCap}</td>
            <td data-label="In flight">${inFlight}</td>
            <td data-label="Depth I / S / B">${r.queues.map((x) => x.depth).join(' / ')}</td>
            <td data-label="Wait reason">${waiting ? `${waiting.priority}: ${reason(waiting.waitReason)}` : '—'}</td>
            <td data-label="Usage / quota"><meter min="0" max=${r.usage.quota} value=${used} aria-label="credits used"></meter> ${num(used)} / ${num(r.usage.quota)} (${pct(used, r.usage.quota)}%)</td>
            <td data-label="Actions" class="actions">
              <button type="button" class="secondary" onClick=${() => setEditing(t)} aria-label=${`Change limits of ${t.name}`}>Limits</button>
              <button type="button" class="secondary" onClick=${() => rotate(t)} aria-label=${`Rotate the key of ${t.name}`}>Rotate key</button>
            </td>
          </tr>`;
        })}
      </tbody>
    </table>
    ${editing && html`<${LimitsForm} tenant=${editing} token=${token} onError=${onError} onDone=${() => { setEditing(null); setReload((n) => n + 1); }} />`}
    <nav class="pager" aria-label="Tenant pages">
      <button type="button" class="secondary" disabled=${q.offset === 0} onClick=${() => setQ({ ...q, offset: Math.max(0, q.offset - PAGE) })}>Previous</button>
      <span>${total === 0 ? 'No tenants' : `${q.offset + 1}–${Math.min(total, q.offset + PAGE)} of ${num(total)}`}</span>
      <button type="button" class="secondary" disabled=${q.offset + PAGE >= total} onClick=${() => setQ({ ...q, offset: q.offset + PAGE })}>Next</button>
    </nav>
  </section>`;
}

export function OperatorView({ token, client }) {
  const [system, setSystem] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => subscribe(client, SYSTEM, {}, (d) => setSystem(d.systemStatus), setError), [client]);
  const { history, tick } = useHistory(system);
  const onError = (e) => setError(e);
  return html`<main class="grid">
    <h1 class="visually-hidden">Operator console</h1>
    ${error && html`<p class="error wide" role="alert">${error.code ? `${error.code}: ` : ''}${error.message} <button type="button" class="secondary" onClick=${() => setError(null)}>Dismiss</button></p>`}
    ${!system
      ? html`<p class="loading">Waiting for the first system status…</p>`
      : html`
        <${Account} account=${system.account} token=${token} onError=${onError} />
        <${Alerts} alerts=${system.alerts} breakers=${system.breakers} />
        <${Classes} classes=${system.classes} drain=${system.estimatedDrainSeconds} />
        <${Windows} windows=${system.windows} history=${history} tick=${tick} />`}
    <${Tenants} token=${token} onError=${onError} />
  </main>`;
}
