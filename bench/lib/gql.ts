/**
 * GraphQL over HTTP, like a client: POST /graphql with a bearer token.
 */
export class GraphQLError extends Error {
  readonly errors: unknown;
  constructor(message: string, errors: unknown) {
    super(message);
    this.errors = errors;
  }
}

export async function gql<T = any>(url: string, token: string, query: string, variables: Record<string, unknown> = {}): Promise<T> {
  return gqlRaw<T>(url, token, JSON.stringify({ query, variables }));
}

/** Sends a prepared body (large submissions are serialised before the clock starts). */
export async function gqlRaw<T = any>(url: string, token: string, body: string): Promise<T> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body,
  });
  const json = (await res.json()) as { data?: T; errors?: Array<{ message: string }> };
  if (json.errors?.length || !json.data) {
    throw new GraphQLError(`GraphQL ${res.status}: ${json.errors?.map((e) => e.message).join('; ') ?? 'no data'}`, json.errors);
  }
  return json.data;
}

export interface TenantLimits {
  weight: number;
  concurrencyCap: number;
  monthlyQuota: number;
  queueBound?: number;
  /** The request budget (cost points at once, and restored per second); absent: the tier default. */
  requestBurst?: number;
  requestRate?: number;
}

/** createTenant as admin, then updateTenant for its limits; returns its id and key. */
export async function createTenant(url: string, adminToken: string, name: string, limits: TenantLimits): Promise<{ id: string; apiKey: string }> {
  const created = await gql<{ createTenant: { tenant: { id: string }; apiKey: string } }>(
    url,
    adminToken,
    'mutation($i: CreateTenantInput!) { createTenant(input: $i) { tenant { id } apiKey } }',
    { i: { name, tier: 'PRO' } },
  );
  const id = created.createTenant.tenant.id;
  await gql(url, adminToken, 'mutation($i: UpdateTenantInput!) { updateTenant(input: $i) { id weight concurrencyCap monthlyQuota } }', {
    i: { id, ...limits },
  });
  return { id, apiKey: created.createTenant.apiKey };
}

export const SUBMIT_JOBS = 'mutation($i: SubmitJobsInput!) { submitJobs(input: $i) { jobs { id } } }';

export interface JobSpec {
  api: string;
  params: Record<string, unknown>;
  priority?: 'INTERACTIVE' | 'STANDARD' | 'BULK';
  idempotencyKey?: string;
  fairnessKey?: string;
}

export function submitBody(jobs: readonly JobSpec[]): string {
  return JSON.stringify({ query: SUBMIT_JOBS, variables: { i: { jobs } } });
}
