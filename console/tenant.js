// The tenant view: usage against quota, queues, recent jobs with live states, a job's detail,
// a form that submits a job from the catalog, and cancel. Live through tenantUsage and jobUpdated.
import { useEffect, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import { gql, subscribe } from './api.js';
import { num, pct, reason, secs, time } from './format.js';

const USAGE = `subscription { tenantUsage {
  usage { creditsUsed creditsReserved creditsRemaining quota periodStart periodEnd }
  queues { priority depth running oldestAgeSeconds waitReason estimatedDrainSeconds }
} }`;
const JOB_FIELDS = 'id api priority state createdAt startedAt finishedAt attempts creditsBilled';
const RECENT = `query Recent($first: Int) { jobs(first: $first) { totalCount edges { node { ${JOB_FIELDS} } } } }`;
const JOB_UPDATED = `subscription ($id: ID!) { jobUpdated(id: $id) { ${JOB_FIELDS} } }`;
const COMPLETED = `subscription { jobsCompleted { ${JOB_FIELDS} } }`;
const FINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);
const CANCELLABLE = new Set(['QUEUED', 'WAITING_QUOTA']);

function Usage({ usage }) {
  const used = usage.creditsUsed + usage.creditsReserved;
  return html`<section aria-labelledby="usage-h" class="card">
    <h2 id="usage-h">Usage this period</h2>
    <p class="big" data-testid="usage">${num(usage.creditsUsed)} <span class="muted">of ${num(usage.quota)} credits used</span></p>
    <meter min="0" max=${usage.quota} value=${used} aria-label="credits used of quota"></meter>
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

function SubmitForm({ token, apis, onSubmitted }) {
  const [chosen, setApi] = useState('');
  const api = chosen || apis[0]?.name || '';
  const [params, setParams] = useState({});
  const [priority, setPriority] = useState('INTERACTIVE');
  const [note, setNote] = useState(null);
  const spec = apis.find((a) => a.name === api);
  const submit = async (ev) => {
    ev.preventDefault();
    setNote(null);
    try {
      const wanted = Object.fromEntries((spec?.requiredParams ?? []).map((p) => [p, params[`${api}.${p}`] ?? '']));
      const d = await gql(token, 'mutation($i: JobInput!) { submitJob(input: $i) { job { id state } } }', { i: { api, params: wanted, priority } });
      setNote({ ok: true, text: `Job ${d.submitJob.job.id} is ${d.submitJob.job.state}.` });
      onSubmitted(d.submitJob.job.id);
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
      ${note && html`<p class=${note.ok ? 'good' : 'error'} role="status">${note.text}</p>`}
    </form>
  </section>`;
}

function JobDetail({ token, id, onClose }) {
  const [job, setJob] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    gql(token, `query($id: ID!) { job(id: $id) { ${JOB_FIELDS} params result error { code message } httpStatus idempotencyKey estimatedStartAt } }`, { id })
      .then((d) => setJob(d.job))
      .catch(setError);
  }, [id]);
  return html`<section aria-labelledby="detail-h" class="card wide detail" data-testid="job-detail">
    <h2 id="detail-h">Job ${id}</h2>
    ${error && html`<p class="error" role="alert">${error.message}</p>`}
    ${job &&
    html`<dl class="facts">
        <div><dt>State</dt><dd>${job.state}</dd></div>
        <div><dt>API</dt><dd>${job.api} (${job.priority})</dd></div>
        <div><dt>Attempts</dt><dd>${job.attempts}</dd></div>
        <div><dt>Credits billed</dt><dd>${job.creditsBilled}</dd></div>
        <div><dt>Created</dt><dd>${time(job.createdAt)}</dd></div>
        <div><dt>Started</dt><dd>${time(job.startedAt)}</dd></div>
        <div><dt>Finished</dt><dd>${time(job.finishedAt)}</dd></div>
        <div><dt>Estimated start</dt><dd>${time(job.estimatedStartAt)}</dd></div>
        <div><dt>HTTP status</dt><dd>${job.httpStatus ?? '—'}</dd></div>
        <div><dt>Error</dt><dd>${job.error ? `${job.error.code}: ${job.error.message}` : '—'}</dd></div>
      </dl>
      <h3>Params</h3>
      <pre tabindex="0">${JSON.stringify(job.params, null, 2)}</pre>
      <h3>Result</h3>
      <pre tabindex="0">${job.result === null ? '—' : JSON.stringify(job.result, null, 2)}</pre>`}
    <button type="button" class="secondary" onClick=${onClose}>Close</button>
  </section>`;
}

function Jobs({ token, client, jobs, setJobs, onOpen }) {
  // One jobUpdated subscription per job still moving; each completes after its final state.
  const moving = jobs.filter((j) => !FINAL.has(j.state)).map((j) => j.id);
  useEffect(() => {
    const stops = moving.map((id) =>
      subscribe(client, JOB_UPDATED, { id }, (d) => setJobs((list) => list.map((j) => (j.id === id ? { ...j, ...d.jobUpdated } : j)))),
    );
    return () => stops.forEach((s) => s());
  }, [client, moving.join(',')]);
  const cancel = async (id) => {
    try {
      const d = await gql(token, `mutation($id: ID!) { cancelJob(id: $id) { ${JOB_FIELDS} } }`, { id });
      setJobs((list) => list.map((j) => (j.id === id ? d.cancelJob : j)));
    } catch (e) {
      alert(`${e.code}: ${e.message}`);
    }
  };
  return html`<section aria-labelledby="jobs-h" class="card wide">
    <h2 id="jobs-h">Recent jobs</h2>
    <table class="stack" data-testid="jobs">
      <thead><tr><th scope="col">Job</th><th scope="col">API</th><th scope="col">Class</th><th scope="col">State</th><th scope="col">Created</th><th scope="col">Credits</th><th scope="col">Actions</th></tr></thead>
      <tbody>${jobs.map(
        (j) => html`<tr key=${j.id} data-job=${j.id}>
          <th scope="row" data-label="Job"><button type="button" class="link" onClick=${() => onOpen(j.id)} aria-label=${`Details of job ${j.id}`}>${j.id.slice(0, 8)}…</button></th>
          <td data-label="API">${j.api}</td>
          <td data-label="Class">${j.priority}</td>
          <td data-label="State" data-testid="state"><span class=${`state ${j.state}`}>${j.state}</span></td>
          <td data-label="Created">${time(j.createdAt)}</td>
          <td data-label="Credits">${j.creditsBilled}</td>
          <td data-label="Actions">${CANCELLABLE.has(j.state) ? html`<button type="button" class="secondary" onClick=${() => cancel(j.id)}>Cancel</button>` : '—'}</td>
        </tr>`,
      )}</tbody>
    </table>
    ${jobs.length === 0 && html`<p class="muted">No jobs yet: submit one.</p>`}
  </section>`;
}

export function TenantView({ token, client, tenant }) {
  const [live, setLive] = useState(null);
  const [apis, setApis] = useState([]);
  const [jobs, setJobs] = useState([]);
  const [open, setOpen] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => subscribe(client, USAGE, {}, (d) => setLive(d.tenantUsage), setError), [client]);
  useEffect(() => {
    gql(token, '{ apis { name creditCost method requiredParams } }').then((d) => setApis(d.apis)).catch(setError);
    gql(token, RECENT, { first: 20 }).then((d) => setJobs(d.jobs.edges.map((e) => e.node))).catch(setError);
  }, [token]);
  // Jobs finished elsewhere (another client, a batch) show up too.
  useEffect(
    () =>
      subscribe(client, COMPLETED, {}, (d) =>
        setJobs((list) => (list.some((j) => j.id === d.jobsCompleted.id) ? list.map((j) => (j.id === d.jobsCompleted.id ? d.jobsCompleted : j)) : [d.jobsCompleted, ...list].slice(0, 50))),
      ),
    [client],
  );
  const submitted = async (id) => {
    const d = await gql(token, `query($id: ID!) { job(id: $id) { ${JOB_FIELDS} } }`, { id }).catch(() => null);
    if (d?.job) setJobs((list) => [d.job, ...list.filter((j) => j.id !== id)].slice(0, 50));
  };
  return html`<main class="grid">
    <h1 class="visually-hidden">Tenant console: ${tenant.name}</h1>
    ${error && html`<p class="error wide" role="alert">${error.code ? `${error.code}: ` : ''}${error.message}</p>`}
    ${live ? html`<${Usage} usage=${live.usage} />` : html`<p class="loading">Waiting for usage…</p>`}
    <${SubmitForm} token=${token} apis=${apis} onSubmitted=${submitted} />
    ${live && html`<${Queues} queues=${live.queues} />`}
    ${open && html`<${JobDetail} token=${token} id=${open} onClose=${() => setOpen(null)} />`}
    <${Jobs} token=${token} client=${client} jobs=${jobs} setJobs=${setJobs} onOpen=${setOpen} />
  </main>`;
}
