/**
 * How long to wait before submitting again after Sluice said QUEUE_FULL: the
 * Retry-After header (HTTP 429), else the error's extensions.retryAfterSeconds.
 * Pure, so it is tested on its own. Returns null when the answer is not a
 * QUEUE_FULL refusal (no retry then).
 */
export interface GraphQLErrorLike {
  message: string;
  extensions?: { code?: string; retryAfterSeconds?: number } & Record<string, unknown>;
}

export function queueFullDelaySeconds(status: number, retryAfterHeader: string | null, errors: readonly GraphQLErrorLike[] | undefined): number | null {
  const full = errors?.find((e) => e.extensions?.code === 'QUEUE_FULL');
  if (!full) return null;
  const header = retryAfterHeader !== null && /^\d+$/.test(retryAfterHeader.trim()) ? Number(retryAfterHeader) : null;
  const seconds = header ?? full.extensions?.retryAfterSeconds ?? (status === 429 ? 1 : null);
  return seconds === null ? null : Math.max(1, seconds);
}
