// Pieces both views share: inline confirmation (no confirm()), panels that take focus when they
// open, quota meters with thresholds, and charts with units, one time zone and a text summary.
import { useEffect, useRef, useState } from 'preact/hooks';
import { html } from 'htm/preact';
import uPlot from 'uplot';
import { level, num, pct } from './format.js';

/**
 * Reads now and every `everyMs` while the component is shown (`deps` as for useEffect); a read
 * that answers after the component moved on is dropped.
 */
export function usePoll(read, apply, onError, deps, everyMs = 5000) {
  useEffect(() => {
    let stale = false;
    const load = () =>
      read()
        .then((v) => !stale && apply(v))
        .catch((e) => !stale && onError(e));
    load();
    const timer = setInterval(load, everyMs);
    return () => {
      stale = true;
      clearInterval(timer);
    };
  }, deps);
}

/** Moves keyboard focus to the element when it appears (a panel or dialog opening), so a screen reader reads it. */
export function useFocusOnOpen() {
  const ref = useRef(null);
  useEffect(() => {
    ref.current?.focus();
  }, []);
  return ref;
}

/**
 * An inline confirmation in place of confirm(): focus goes to it; Escape or
 * Cancel closes it. `danger` makes the confirming button red.
 */
let confirms = 0;
export function Confirm({ title, message, confirmLabel, danger = false, onConfirm, onCancel }) {
  const ref = useFocusOnOpen();
  const [uid] = useState(() => `confirm-${++confirms}`);
  const [busy, setBusy] = useState(false);
  const go = async () => {
    setBusy(true);
    try {
      await onConfirm();
    } finally {
      setBusy(false);
    }
  };
  return html`<div class="confirm" role="alertdialog" aria-modal="false" aria-labelledby=${`${uid}-title`} aria-describedby=${`${uid}-text`} tabindex="-1" ref=${ref}
    onKeyDown=${(e) => e.key === 'Escape' && onCancel()}>
    <p id=${`${uid}-title`}><strong>${title}</strong></p>
    <p id=${`${uid}-text`}>${message}</p>
    <button type="button" class=${danger ? 'danger' : ''} onClick=${go} disabled=${busy}>${confirmLabel}</button>
    <button type="button" class="secondary" onClick=${onCancel}>Cancel</button>
  </div>`;
}

/**
 * A secret shown once (a new API key or webhook signing secret), as an inline dialog that takes
 * focus so a screen reader announces it; Done closes it and the secret is gone from the page.
 */
let secrets = 0;
export function SecretOnce({ title, secret, what = 'key', onClose }) {
  const ref = useFocusOnOpen();
  const [uid] = useState(() => `secret-${++secrets}`);
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(secret);
      setCopied(true);
    } catch {
      setCopied(false);
    }
  };
  return html`<div class="key-once" role="dialog" aria-modal="false" aria-labelledby=${`${uid}-title`} tabindex="-1" ref=${ref} onKeyDown=${(e) => e.key === 'Escape' && onClose()}>
    <p id=${`${uid}-title`}><strong>${title}</strong> This ${what} is shown once; copy it now.</p>
    <code data-testid="new-key">${secret}</code>
    <button type="button" onClick=${copy}>${copied ? 'Copied' : `Copy ${what}`}</button>
    <button type="button" class="secondary" onClick=${onClose}>Done</button>
  </div>`;
}

/** Credits used against a quota: amber from 75 %, red from 90 %, said in words as well as colour. */
export function QuotaMeter({ used, quota, label }) {
  const l = level(used, quota);
  // A meter's own bands include their lower bound in the better band: nudge them so 75 % is amber and 90 % red.
  const edge = quota * 1e-6;
  return html`<span class="quota">
    <meter min="0" max=${Math.max(1, quota)} low=${quota * 0.75 - edge} high=${quota * 0.9 - edge} optimum="0" value=${used} aria-label=${label}></meter>
    <span class=${l === 'ok' ? '' : l === 'warn' ? 'warn' : 'bad'}> ${num(used)} / ${num(quota)} (${pct(used, quota)}%${l === 'ok' ? '' : l === 'warn' ? ', over 75%' : ', over 90%'})</span>
  </span>`;
}

const UTC = (ts) => uPlot.tzDate(new Date(ts * 1e3), 'Etc/UTC');

/**
 * A line chart: x in UTC (said on the axis), y with its unit. `summary` is the
 * chart said in words (figcaption), for screen readers and for anyone.
 */
export function Chart({ title, unit, series, data, summary, height = 170, bars = false, xRange = null, xSpan = null }) {
  const box = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const width = () => Math.max(200, box.current.clientWidth);
    plot.current = new uPlot(
      {
        title,
        width: width(),
        height,
        tzDate: UTC,
        // A fixed x range (the chosen period) keeps a short history from stretching across the chart.
        scales: { x: xRange ? { time: true, range: () => xRange } : xSpan ? { time: true, range: (_u, _min, max) => [max - xSpan, max] } : { time: true }, y: { range: (_u, _min, max) => [0, Math.max(1, (max ?? 0) * 1.15)] } },
        series: [{ label: 'time (UTC)' }, ...series.map((s) => ({ label: s.label, stroke: s.color, fill: bars ? s.color + '55' : undefined, width: 2, dash: s.dash, points: { show: bars } , paths: bars ? uPlot.paths.bars({ size: [0.6, 40] }) : undefined }))],
        axes: [
          { stroke: '#333', label: 'time (UTC)', labelSize: 18, size: 36 },
          { stroke: '#333', label: unit, labelSize: 18, size: 50 },
        ],
        legend: { live: false },
      },
      data,
      box.current.querySelector('.plot'),
    );
    const ro = new ResizeObserver(() => plot.current?.setSize({ width: width(), height }));
    ro.observe(box.current);
    return () => {
      ro.disconnect();
      plot.current?.destroy();
    };
  }, []);
  useEffect(() => {
    plot.current?.setData(data);
  }, [data]);
  return html`<figure class="chart" ref=${box} aria-label=${title}>
    <div class="plot" aria-hidden="true"></div>
    <figcaption class="muted" data-testid="chart-summary">${summary}</figcaption>
  </figure>`;
}

/** Average and peak of a series, skipping gaps; for chart summaries. */
export function stats(values) {
  const v = values.filter((x) => x !== null && x !== undefined);
  if (v.length === 0) return { avg: null, peak: null, last: null };
  return { avg: v.reduce((s, x) => s + x, 0) / v.length, peak: Math.max(...v), last: v[v.length - 1] };
}
