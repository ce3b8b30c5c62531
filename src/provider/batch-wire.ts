/**
 * The batch endpoint's wire format, in one module.
 *
 * APIVerve's public docs describe the batch endpoint's behaviour (one
 * rate-limit slot and one bill per item, per-item 429/402 inside an HTTP 200)
 * but not its JSON. This module is the project's definition of that JSON; the
 * simulator answers it and the client speaks it, so when the real format is
 * known only this file changes.
 *
 *   POST /v1/<api>/batch
 *   { "requests": [ { "id": "a1", "params": { "email": "x@y.com" } }, ... ] }   // 1..200 items
 *
 *   HTTP 200
 *   { "status": "ok", "error": null, "results": [                              // request order
 *       { "id": "a1", "status": 200, "data": { ... } },
 *       { "id": "a2", "status": 429, "retryAfter": 12, "error": "Rate limit exceeded. ..." },
 *       { "id": "a3", "status": 402, "error": "Monthly credit limit reached. ..." },
 *       { "id": "a4", "status": 400, "error": "Missing required parameter: email" } ] }
 *
 * A batch refused as a whole (bad key, unknown API, malformed body, wrong
 * size, key in cooldown, concurrency limit, outage) gets the ordinary error
 * envelope `{"status":"error","error":"...","data":null}` with that HTTP status.
 * Ids are the caller's; they are echoed, not required to be unique (duplicates
 * are billed each time, like duplicate inputs).
 */
import { z } from 'zod';

export const BATCH_MIN_ITEMS = 1;
export const BATCH_MAX_ITEMS = 200;

/** Path of the batch endpoint of one API, relative to the base URL. */
export function batchPath(api: string): string {
  return `${encodeURIComponent(api)}/batch`;
}

export interface BatchRequestItemWire {
  id: string;
  params: Record<string, unknown>;
}

export interface BatchRequestWire {
  requests: BatchRequestItemWire[];
}

export type BatchResultWire =
  | { id: string; status: 200; data: unknown }
  | { id: string; status: 429; retryAfter: number; error: string }
  | { id: string; status: number; error: string };

export interface BatchResponseWire {
  status: 'ok';
  error: null;
  results: BatchResultWire[];
}

const itemSchema = z.object({
  id: z.string().min(1, 'id must be a non-empty string').max(200, 'id must be at most 200 characters'),
  params: z.record(z.string(), z.unknown()).default({}),
});

const requestSchema = z.object({
  requests: z
    .array(itemSchema)
    .min(BATCH_MIN_ITEMS, `requests must hold ${BATCH_MIN_ITEMS} to ${BATCH_MAX_ITEMS} items`)
    .max(BATCH_MAX_ITEMS, `requests must hold ${BATCH_MIN_ITEMS} to ${BATCH_MAX_ITEMS} items`),
});

const resultSchema = z.looseObject({
  id: z.string(),
  status: z.number().int(),
  data: z.unknown().optional(),
  retryAfter: z.number().nonnegative().optional(),
  error: z.string().nullable().optional(),
});

const responseSchema = z.looseObject({
  status: z.literal('ok'),
  results: z.array(resultSchema),
});

export type WireParse<T> = { ok: true; value: T } | { ok: false; error: string };

function firstIssue(error: z.ZodError): string {
  const issue = error.issues[0];
  if (!issue) return 'invalid body';
  const path = issue.path.length ? `${issue.path.join('.')}: ` : '';
  return `${path}${issue.message}`;
}

export function encodeBatchRequest(items: readonly BatchRequestItemWire[]): string {
  const body: BatchRequestWire = { requests: items.map((i) => ({ id: i.id, params: i.params })) };
  return JSON.stringify(body);
}

/** Server side: validates a decoded JSON body (size 1..200, ids, params objects). */
export function parseBatchRequest(body: unknown): WireParse<BatchRequestWire> {
  const parsed = requestSchema.safeParse(body);
  if (!parsed.success) return { ok: false, error: firstIssue(parsed.error) };
  return { ok: true, value: parsed.data };
}

export function encodeBatchResponse(results: readonly BatchResultWire[]): string {
  const body: BatchResponseWire = { status: 'ok', error: null, results: [...results] };
  return JSON.stringify(body);
}

/** One result as the client reads it: status always present, the rest optional. */
export interface BatchResultRead {
  id: string;
  status: number;
  data?: unknown;
  retryAfter?: number;
  error?: string | null;
}

/** Client side: validates a decoded 200 body of the batch endpoint. */
export function parseBatchResponse(body: unknown): WireParse<{ results: BatchResultRead[] }> {
  const parsed = responseSchema.safeParse(body);
  if (!parsed.success) return { ok: false, error: firstIssue(parsed.error) };
  return { ok: true, value: { results: parsed.data.results } };
}
