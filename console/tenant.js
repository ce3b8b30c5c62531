// The tenant view: usage against quota, queues, the jobs table (filters, paging, cancel, retry)
// with live states, a job's live detail, a form that submits a job from the catalog, its API keys
// and its webhook endpoints.
// Live through tenantUsage, jobUpdated and jobsCompleted.
import { useEffect, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { gql, subscribe } from './api.js';
import { errorText, FINAL, num, pct, reason, RETRYABLE, secs, time } from './format.js';
import { JobsTable, JOB_FIELDS, RETRY } from './jobs.js';
import { QuotaMeter, useFocusOnOpen } from './ui.js';
import { ApiKeys } from './keys.js';
import { Webhooks } from './webhooks.js';

const USAGE = `subscription { tenantUsage {
  usage { creditsUsed creditsReserved creditsRemaining quota periodStart periodEnd }
  queues { priority depth running oldestAgeSeconds waitReason estimatedDrainSeconds }
} }`;
const DETAIL_FIELDS = `${JOB_FIELDS} params result error { code message } httpStatus estimatedStartAt waitReason traceId traceUrl`;
const JOB_UPDATED = `subscription ($id: ID!) { jobUpdated(id: $id) { ${DETAIL_FIELDS} } }`;

function Usage({ usage }) {
  const used = usage.creditsUsed + usage.creditsReserved;
  return html`<section aria-labelledby="usage-h" class="card">
    <h2 id="usage-h">Usage this period</h2>
    <p class="big" data-testid="usage">${num(usage.creditsUsed)} <span class="muted">of ${num(usage.quota)} credits used</span></p>
    <${QuotaMeter} used=${used} quota=${usage.quota} label="credits used of quota" />
    <dl class="facts">
      <div><dt>Reserved (in flight)</dt><dd>${num(usage.creditsReserved)}</dd></div>
      <div><dt>Remaining</dt><dd>${num(usage.creditsRemaining)} (${100 - pct(used, usage.quota)}%)</dd></div>
      <div><dt>Period</dt><dd>${time(usage.periodStart)} – ${time(usage.periodEnd)}</dd></div>
    </dl>
  </section>`;
}

function Queues({ queues }) {
  // Six columns do not fit a third of a 1280 px row: the queues take a row of their own.
  return html`<section aria-labelledby="queues-h" class="card wide">
    <h2 id="queues-h">Queues</h2>
    <table class="stack">
      <thead><tr><th scope="col">Class</th><th scope="col">Waiting</th><th scope="col">Running</th><th scope="col">Oldest</th><th scope="col">Wait reason</th><th scope="col">Drains in</th></tr></thead>
      <tbody>${queues.map(
        (q) => html`<tr>
          <th scope="row" data-label="Class">${q.priority}</th>
          <td data-label="Waiting">${num(q.depth)}</td>
          <td data-label="Running">${num(q.running)}</td>
          <td data-label="Oldest">${secs(q.oldestAgeSeconds)}</td>
          <td data-label="Wait reason">${reason(q.waitReason)}</td>
          <td data-label="Drains in">${q.depth === 0 ? '—' : secs(q.estimatedDrainSeconds)}</td>
        </tr>`,
      )}</tbody>
    </table>
  </section>`;
}

function SubmitForm({ token, client, apis, onSubmitted }) {
  const [chosen, setApi] = useState('');
  const api = chosen || apis[0]?.name || '';
  const [params, setParams] = useState({});
  const [priority, setPriority] = useState('INTERACTIVE');
  const [note, setNote] = useState(null);
  const [submitted, setSubmitted] = useState(null); // { id, state }: the note follows the job live
  const spec = apis.find((a) => a.name === api);
  useEffect(() => {
    if (!submitted || FINAL.has(submitted.state)) return undefined;
    return subscribe(client, `subscription ($id: ID!) { jobUpdated(id: $id) { id state } }`, { id: submitted.id }, (d) => setSubmitted(d.jobUpdated));
  }, [client, submitted?.id]);
  const submit = async (ev) => {
    ev.preventDefault();
    setNote(null);
    setSubmitted(null);
    try {
      const wanted = Object.fromEntries((spec?.requiredParams ?? []).map((p) => [p, params[`${api}.${p}`] ?? '']));
      const d = await gql(token, 'mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }', { i: { api, params: wanted, priority } });
      setSubmitted(d.submitJob.job);
      onSubmitted({ ...d.submitJob.job, api, priority, createdAt: new Date().toISOString(), startedAt: null, finishedAt: null, attempts: 0, creditsBilled: 0, idempotencyKey: null, retryOf: null });
    } catch (e) {
      const wait = e.retryAfter ?? e.extensions?.retryAfterSeconds;
      setNote({ ok: false, text: e.code === 'QUEUE_FULL' ? `The queue is full: try again in ${wait} s.` : `${e.code}: ${e.message}` });
    }
  };
  return html`<section aria-labelledby="submit-h" class="card">
    <h2 id="submit-h">Submit a job</h2>
    <form onSubmit=${submit} class="stacked">
      <label>API<select value=${api} onChange=${(e) => setApi(e.currentTarget.value)}>
        ${apis.map((a) => html`<option value=${a.name}>${a.name} (${a.creditCost} credit${a.creditCost === 1 ? '' : 's'})</option>`)}
      </select></label>
      ${(spec?.requiredParams ?? []).map(
        (p) => html`<label>${p}<input required value=${params[`${api}.${p}`] ?? ''} onInput=${(e) => setParams({ ...params, [`${api}.${p}`]: e.currentTarget.value })} /></label>`,
      )}
      <label>Priority<select value=${priority} onChange=${(e) => setPriority(e.currentTarget.value)}><option>INTERACTIVE</option><option>STANDARD</option><option>BULK</option></select></label>
      <button type="submit">Submit job</button>
      ${submitted && html`<p class="good" role="status" data-testid="submit-note">Job ${submitted.id} is ${submitted.state}.</p>`}
      ${note && html`<p class="error" role="alert">${note.text}</p>`}
    </form>
  </section>`;
}

function JobDetail({ token, client, id, onClose, onRetried }) {
  const [job, setJob] = useState(null);
  const [error, setError] = useState(null);
  const [note, setNote] = useState(null);
  const ref = useFocusOnOpen();
  // The detail follows the job: jobUpdated sends its state now, then every change until a final one.
  useEffect(() => {
    setJob(null);
    setError(null);
    return subscribe(client, JOB_UPDATED, { id }, (d) => setJob(d.jobUpdated), setError);
  }, [client, id]);
  const retry = async () => {
    try {
      const d = await gql(token, RETRY, { id });
      setNote(`Retried as job ${d.retryJob.id}.`);
      onRetried(d.retryJob);
    } catch (e) {
      setError(e);
    }
  };
  return html`<section aria-labelledby="detail-h" class="card wide detail" data-testid="job-detail" tabindex="-1" ref=${ref}>
    <h2 id="detail-h">Job ${id}</h2>
    ${error && html`<p class="error" role="alert">${errorText(error)}</p>`}
    ${note && html`<p class="good" role="status">${note}</p>`}
    ${job &&
    html`<dl class="facts">
        <div><dt>State</dt><dd data-testid="detail-state"><span class=${`state ${job.state}`}>${job.state}</span>${FINAL.has(job.state) ? '' : html` <span class="muted">(live)</span>`}</dd></div>
        <div><dt>API</dt><dd>${job.api} (${job.priority})</dd></div>
        <div><dt>Attempts</dt><dd>${job.attempts}</dd></div>
        <div><dt>Credits billed</dt><dd>${job.creditsBilled}</dd></div>
        <div><dt>Created</dt><dd>${time(job.createdAt)}</dd></div>
        <div><dt>Started</dt><dd>${time(job.startedAt)}</dd></div>
        <div><dt>Finished</dt><dd>${time(job.finishedAt)}</dd></div>
        <div><dt>Estimated start</dt><dd>${time(job.estimatedStartAt)}</dd></div>
        <div><dt>Waiting because</dt><dd>${reason(job.waitReason)}</dd></div>
        <div><dt>HTTP status</dt><dd>${job.httpStatus ?? '—'}</dd></div>
        <div><dt>Idempotency key</dt><dd>${job.idempotencyKey ?? '—'}</dd></div>
        <div><dt>Retry of</dt><dd>${job.retryOf ?? '—'}</dd></div>
        <div><dt>Trace</dt><dd data-testid="detail-trace">${job.traceId
          ? (job.traceUrl ? html`<a href=${job.traceUrl} target="_blank" rel="noopener noreferrer"><code>${job.traceId}</code></a>` : html`<code>${job.traceId}</code>`)
          : '—'}</dd></div>
        <div><dt>Error</dt><dd>${job.error ? `${job.error.code}: ${job.error.message}` : '—'}</dd></div>
      </dl>
      <h3>Params</h3>
      <pre tabindex="0">${JSON.stringify(job.params, null, 2)}</pre>
      <h3>Result</h3>
      <pre tabindex="0">${job.result === null ? '—' : JSON.stringify(job.result, null, 2)}</pre>`}
    ${job && RETRYABLE.has(job.state) && html`<button type="button" onClick=${retry}>Retry this job</button> `}
    <button type="button" class="secondary" onClick=${onClose}>Close</button>
  </section>`;
}

export function TenantView({ token, client, tenant }) {
  const [live, setLive] = useState(null);
  const [apis, setApis] = useState([]);
  const [open, setOpen] = useState(null);
  const [reload, setReload] = useState(0);
  const [added, setAdded] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => subscribe(client, USAGE, {}, (d) => setLive(d.tenantUsage), setError), [client]);
  useEffect(() => {
    gql(token, '{ apis { name creditCost method requiredParams } }').then((d) => setApis(d.apis)).catch(setError);
  }, [token]);
  const changed = () => setReload((n) => n + 1);
  return html`<main class="grid">
    <h1 class="visually-hidden">Tenant console: ${tenant.name}</h1>
    ${error && html`<p class="error wide" role="alert">${errorText(error)}</p>`}
    ${live ? html`<${Usage} usage=${live.usage} />` : html`<p class="loading">Waiting for usage…</p>`}
    <${SubmitForm} token=${token} client=${client} apis=${apis} onSubmitted=${setAdded} />
    ${live && html`<${Queues} queues=${live.queues} />`}
    ${open && html`<${JobDetail} key=${open} token=${token} client=${client} id=${open} onClose=${() => setOpen(null)} onRetried=${changed} />`}
    <${JobsTable} token=${token} client=${client} id="jobs" title="Your jobs" apis=${apis.length ? apis : null} reload=${reload} added=${added} onOpen=${setOpen} />
    <${ApiKeys} token=${token} />
    <${Webhooks} token=${token} />
  </main>`;
}
