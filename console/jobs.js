// The jobs table both views use: filters (state, API, class, idempotency key), paging by cursor,
// cancel and retry. A tenant's rows follow their jobs live (jobUpdated, jobsCompleted); the
// operator's tenant page reads the same table through tenantJobs.
import { useEffect, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { gql, subscribe } from './api.js';
import { errorText, FINAL, JOB_STATES, RETRYABLE, time } from './format.js';

export const JOB_FIELDS = 'id api priority state createdAt startedAt finishedAt attempts creditsBilled idempotencyKey retryOf';
const JOB_UPDATED = `subscription ($id: ID!) { jobUpdated(id: $id) { ${JOB_FIELDS} } }`;
const COMPLETED = `subscription { jobsCompleted { ${JOB_FIELDS} } }`;
const CANCELLABLE = new Set(['QUEUED', 'WAITING_QUOTA']);
const PAGE_FIELDS = `totalCount edges { node { ${JOB_FIELDS} } } pageInfo { hasNextPage endCursor }`;
const MINE = `query Jobs($first: Int, $after: String, $filter: JobFilter) { page: jobs(first: $first, after: $after, filter: $filter) { ${PAGE_FIELDS} } }`;
const THEIRS = `query TenantJobs($tenantId: ID!, $first: Int, $after: String, $filter: JobFilter) { page: tenantJobs(tenantId: $tenantId, first: $first, after: $after, filter: $filter) { ${PAGE_FIELDS} } }`;
export const RETRY = `mutation Retry($id: ID!) { retryJob(id: $id) { ${JOB_FIELDS} } }`;

const EMPTY = { state: '', api: '', priority: '', idempotencyKey: '' };
const asFilter = (f) => Object.fromEntries(Object.entries(f).filter(([, v]) => v !== ''));

function Filters({ value, onChange, apis, fixed, id }) {
  const [key, setKey] = useState(value.idempotencyKey);
  const set = (k) => (e) => onChange({ ...value, [k]: e.currentTarget.value });
  return html`<form class="inline filters" role="search" aria-label="Filter jobs" onSubmit=${(e) => {
    e.preventDefault();
    onChange({ ...value, idempotencyKey: key.trim() });
  }}>
    ${!fixed.state && html`<label>Job state<select value=${value.state} onChange=${set('state')}><option value="">any</option>${JOB_STATES.map((s) => html`<option>${s}</option>`)}</select></label>`}
    <label>Job API${apis
      ? html`<select value=${value.api} onChange=${set('api')}><option value="">any</option>${apis.map((a) => html`<option>${a.name}</option>`)}</select>`
      : html`<input value=${value.api} onChange=${set('api')} size="12" />`}</label>
    <label>Job class<select value=${value.priority} onChange=${set('priority')}><option value="">any</option><option>INTERACTIVE</option><option>STANDARD</option><option>BULK</option></select></label>
    <label for=${`${id}-key`}>Idempotency key<input id=${`${id}-key`} type="search" value=${key} onInput=${(e) => setKey(e.currentTarget.value)} /></label>
    <button type="submit" class="secondary">Filter</button>
  </form>`;
}

/**
 * `tenantId` set: the operator reading that tenant's jobs (tenantJobs); unset: the caller's own
 * (jobs), live through `client`. `fixed` filters always apply (e.g. { state: 'FAILED' }).
 */
export function JobsTable({ token, client = null, tenantId = null, title, id, fixed = {}, filters = true, apis = null, pageSize = 20, reload = 0, added = null, onOpen = null, onRetried = () => {} }) {
  const [filter, setFilter] = useState(EMPTY);
  const [cursors, setCursors] = useState([null]);
  const [page, setPage] = useState(null);
  const [note, setNote] = useState(null);
  const [bump, setBump] = useState(0);
  const at = cursors.length - 1;
  const wanted = { ...asFilter(filter), ...fixed };
  const plain = at === 0 && Object.keys(wanted).length === 0;

  useEffect(() => {
    let stale = false;
    const vars = { first: pageSize, after: cursors[at], filter: Object.keys(wanted).length ? wanted : null, ...(tenantId ? { tenantId } : {}) };
    gql(token, tenantId ? THEIRS : MINE, vars)
      .then((d) => !stale && setPage({ at, total: d.page.totalCount, rows: d.page.edges.map((e) => e.node), next: d.page.pageInfo.hasNextPage ? d.page.pageInfo.endCursor : null }))
      .catch((e) => !stale && setNote({ ok: false, text: errorText(e) }));
    return () => {
      stale = true;
    };
  }, [token, tenantId, JSON.stringify(wanted), cursors.join(','), reload, bump]);

  // A job just submitted from this page shows at once, in the state its submission answered (or,
  // when the first page was still loading, as soon as it has loaded).
  useEffect(() => {
    if (!added) return;
    setPage((p) => (p && plain && !p.rows.some((j) => j.id === added.id) ? { ...p, total: p.total + 1, rows: [added, ...p.rows].slice(0, pageSize) } : p));
  }, [added?.id, page === null]);

  const rows = page?.rows ?? [];
  const update = (job) => setPage((p) => (p ? { ...p, rows: p.rows.map((j) => (j.id === job.id ? { ...j, ...job } : j)) } : p));

  // A tenant's own rows move live: one jobUpdated per job still moving (each completes after its final state).
  const moving = client ? rows.filter((j) => !FINAL.has(j.state)).map((j) => j.id) : [];
  useEffect(() => {
    const stops = moving.map((jobId) => subscribe(client, JOB_UPDATED, { id: jobId }, (d) => update(d.jobUpdated)));
    return () => stops.forEach((s) => s());
  }, [client, moving.join(',')]);
  // Jobs finished elsewhere (another client, a batch) show up on the first, unfiltered page.
  useEffect(() => {
    if (!client) return undefined;
    return subscribe(client, COMPLETED, {}, (d) =>
      setPage((p) => {
        if (!p) return p;
        const job = d.jobsCompleted;
        if (p.rows.some((j) => j.id === job.id)) return { ...p, rows: p.rows.map((j) => (j.id === job.id ? job : j)) };
        return plain ? { ...p, total: p.total + 1, rows: [job, ...p.rows].slice(0, pageSize) } : p;
      }),
    );
  }, [client, plain]);

  const cancel = async (jobId) => {
    setNote(null);
    try {
      const d = await gql(token, `mutation($id: ID!) { cancelJob(id: $id) { ${JOB_FIELDS} } }`, { id: jobId });
      update(d.cancelJob);
      setNote({ ok: true, text: `Job ${jobId} cancelled.` });
    } catch (e) {
      setNote({ ok: false, text: errorText(e) });
    }
  };
  const retry = async (jobId) => {
    setNote(null);
    try {
      const d = await gql(token, RETRY, { id: jobId });
      setNote({ ok: true, text: `Job ${jobId} retried as job ${d.retryJob.id} (${d.retryJob.state}).` });
      onRetried(d.retryJob);
      setBump((n) => n + 1);
    } catch (e) {
      setNote({ ok: false, text: errorText(e) });
    }
  };

  return html`<section aria-labelledby=${`${id}-h`} class="card wide">
    <h2 id=${`${id}-h`}>${title}</h2>
    ${filters && html`<${Filters} id=${id} value=${filter} fixed=${fixed} apis=${apis} onChange=${(f) => { setFilter(f); setCursors([null]); }} />`}
    ${note && html`<p class=${note.ok ? 'good' : 'error'} role=${note.ok ? 'status' : 'alert'} data-testid="jobs-note">${note.text}</p>`}
    <table class="stack" data-testid=${id}>
      <thead><tr><th scope="col">Job</th><th scope="col">API</th><th scope="col">Class</th><th scope="col">State</th><th scope="col">Created</th><th scope="col">Credits</th><th scope="col">Actions</th></tr></thead>
      <tbody>${rows.map(
        (j) => html`<tr key=${j.id} data-job=${j.id}>
          <th scope="row" data-label="Job">${onOpen
            ? html`<button type="button" class="link" onClick=${() => onOpen(j.id)} aria-label=${`Details of job ${j.id}`}>${j.id.slice(0, 8)}…</button>`
            : html`<code title=${j.id}>${j.id.slice(0, 8)}…</code>`}
            ${j.idempotencyKey && html`<div class="muted small">key ${j.idempotencyKey}</div>`}
            ${j.retryOf && html`<div class="muted small">retry of ${j.retryOf.slice(0, 8)}…</div>`}</th>
          <td data-label="API">${j.api}</td>
          <td data-label="Class">${j.priority}</td>
          <td data-label="State" data-testid="state"><span class=${`state ${j.state}`}>${j.state}</span></td>
          <td data-label="Created">${time(j.createdAt)}</td>
          <td data-label="Credits">${j.creditsBilled}</td>
          <td data-label="Actions" class="actions">
            ${!tenantId && CANCELLABLE.has(j.state) ? html`<button type="button" class="secondary" onClick=${() => cancel(j.id)} aria-label=${`Cancel job ${j.id}`}>Cancel</button>` : ''}
            ${RETRYABLE.has(j.state) ? html`<button type="button" class="secondary" onClick=${() => retry(j.id)} aria-label=${`Retry job ${j.id}`}>Retry</button>` : ''}
            ${!CANCELLABLE.has(j.state) && !RETRYABLE.has(j.state) ? '—' : ''}
          </td>
        </tr>`,
      )}</tbody>
    </table>
    ${page && rows.length === 0 && html`<p class="muted">${plain && !tenantId ? 'No jobs yet: submit one.' : 'No jobs match.'}</p>`}
    <nav class="pager" aria-label=${`${title}: pages`}>
      <button type="button" class="secondary" disabled=${at === 0} onClick=${() => setCursors(cursors.slice(0, -1))}>Previous</button>
      <span>${page ? `Page ${page.at + 1} · ${page.total} job${page.total === 1 ? '' : 's'}` : 'Loading…'}</span>
      <button type="button" class="secondary" disabled=${!page?.next} onClick=${() => setCursors([...cursors, page.next])}>Next</button>
    </nav>
  </section>`;
}
