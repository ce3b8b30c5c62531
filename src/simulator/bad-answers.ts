/**
 * Bad answers: the bodies of the `badAnswer` fault (options.ts), pure. The
 * real upstream's `data` is whatever an API scraped or looked up (web pages,
 * DNS TXT records, free text), and a proxy in front of it can answer 200 with
 * an HTML page; these are the shapes that reach a client, byte for byte.
 */
import { DEFAULT_HUGE_BYTES, type BadAnswerKind, type BadAnswerSpec } from './options.ts';

/** The kinds that corrupt a value inside a well-formed envelope (per item in a batch). */
export const VALUE_KINDS: ReadonlySet<BadAnswerKind> = new Set(['nul', 'lone-surrogate']);

/** What each value kind puts into the first string of the data (JSON.stringify escapes both: `\u0000`, `\ud800`). */
const BAD_CHAR: Partial<Record<BadAnswerKind, string>> = { nul: '\u0000', 'lone-surrogate': '\ud800' };

/** Bytes that are not UTF-8: a lone continuation byte and a byte UTF-8 never uses. */
export const INVALID_UTF8 = Buffer.from([0x80, 0xff]);

const MARKER = '\u0001sim-invalid-utf8\u0001';

export const HTML_PAGE =
  '<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n' +
  '<body><h1>Bad Gateway</h1><p>The upstream server returned an invalid response.</p></body></html>\n';

export interface BadBody {
  body: string | Buffer;
  /** Overrides the JSON content type (the HTML page). */
  contentType?: string;
}

/**
 * `value` with `insert` put in the middle of its first string (depth first,
 * object keys in order), or unchanged when it holds no string; a copy.
 */
export function corruptFirstString(value: unknown, insert: string): { value: unknown; done: boolean } {
  if (typeof value === 'string') {
    const mid = Math.floor(value.length / 2);
    return { value: value.slice(0, mid) + insert + value.slice(mid), done: true };
  }
  if (Array.isArray(value)) {
    const out = [...value];
    for (let i = 0; i < out.length; i++) {
      const r = corruptFirstString(out[i], insert);
      if (r.done) {
        out[i] = r.value;
        return { value: out, done: true };
      }
    }
    return { value, done: false };
  }
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = { ...(value as Record<string, unknown>) };
    for (const key of Object.keys(out)) {
      const r = corruptFirstString(out[key], insert);
      if (r.done) {
        out[key] = r.value;
        return { value: out, done: true };
      }
    }
    return { value, done: false };
  }
  return { value, done: false };
}

/** An item's or a call's data with the value kind's character in it (a `note` field when it holds no string). */
export function corruptData(data: unknown, kind: BadAnswerKind): unknown {
  const ch = BAD_CHAR[kind];
  if (ch === undefined) return data;
  const r = corruptFirstString(data, ch);
  if (r.done) return r.value;
  return { ...(data !== null && typeof data === 'object' && !Array.isArray(data) ? data : { value: data }), note: `scraped${ch}text` };
}

/**
 * The body of a bad answer, from the envelope the simulator would have sent
 * (an object: `{status, error, data}` or a batch's `{status, error, results}`,
 * whose items' data the value kinds have already corrupted). Value kinds send
 * the envelope as it is; the others spoil the body as a whole.
 */
export function badBody(spec: Pick<BadAnswerSpec, 'kind' | 'hugeBytes'>, envelope: Record<string, unknown>): BadBody {
  switch (spec.kind) {
    case 'nul':
    case 'lone-surrogate':
      return { body: JSON.stringify(envelope) };
    case 'html':
      return { body: HTML_PAGE, contentType: 'text/html; charset=utf-8' };
    case 'truncated-json': {
      const text = JSON.stringify(envelope);
      return { body: text.slice(0, Math.max(1, Math.floor(text.length / 2))) };
    }
    case 'invalid-utf8': {
      const target = 'data' in envelope ? 'data' : 'results';
      const r = corruptFirstString(envelope[target], MARKER);
      const marked = r.done ? { ...envelope, [target]: r.value } : { ...envelope, note: MARKER };
      const [before, after] = JSON.stringify(marked).split(JSON.stringify(MARKER).slice(1, -1));
      return { body: Buffer.concat([Buffer.from(before ?? '', 'utf8'), INVALID_UTF8, Buffer.from(after ?? '', 'utf8')]) };
    }
    case 'huge': {
      const bytes = spec.hugeBytes ?? DEFAULT_HUGE_BYTES;
      const base = Buffer.byteLength(JSON.stringify({ ...envelope, padding: '' }));
      return { body: JSON.stringify({ ...envelope, padding: 'x'.repeat(Math.max(0, bytes - base)) }) };
    }
  }
}
