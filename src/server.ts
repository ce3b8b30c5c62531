/**
 * HTTP wiring: one node:http server carries GraphQL over HTTP (Yoga, with
 * GraphiQL) and graphql-ws on the same port and path.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { GraphQLError } from 'graphql';
import { createYoga, maskError as yogaMaskError, type YogaServerInstance } from 'graphql-yoga';
import { useServer } from 'graphql-ws/use/ws';
import { WebSocketServer } from 'ws';
import type { Logger } from 'pino';
import { SluiceError } from './errors.ts';
import { useOperationAuth } from './graphql/auth-plugin.ts';
import { useInputErrorCodes } from './graphql/input-errors-plugin.ts';
import { authenticate, connectionAuthorization, type Context, type Services } from './graphql/context.ts';
import { schema } from './graphql/schema.ts';
// --- front door and metrics ---
import { DEFAULT_QUERY_LIMITS, hardeningPlugins, type QueryLimits } from './http/hardening.ts';
import type { Metrics } from './metrics.ts';
// --- end front door and metrics ---
import { renderSluiceGraphiQL } from './http/graphiql.ts';
import { serveConsole } from './http/console.ts';

export const GRAPHQL_PATH = '/graphql';

export interface ServerOptions {
  services: Services;
  maxBodyBytes: number;
  log: Logger;
  development: boolean;
  // --- front door and metrics ---
  /** Query depth/cost/alias/token limits (queryLimitsFromEnv); default DEFAULT_QUERY_LIMITS. */
  limits?: QueryLimits;
  /** Serves GET /metrics and counts GraphQL requests; absent: /metrics answers 404. */
  metrics?: Metrics;
  // --- end front door and metrics ---
}

/** SluiceError → a GraphQL error with its code; anything else is logged and masked (no stack traces outside development). */
function maskError(log: Logger, error: unknown, message: string, isDev?: boolean): Error {
  const original = error instanceof GraphQLError ? (error.originalError ?? error) : error;
  if (original instanceof SluiceError) {
    const e = error instanceof GraphQLError ? error : undefined;
    return new GraphQLError(original.message, {
      ...(e?.nodes ? { nodes: e.nodes } : {}),
      ...(e?.path ? { path: e.path } : {}),
      extensions: {
        code: original.code,
        ...original.extensions,
        ...(original.httpStatus ? { http: { status: original.httpStatus, ...(original.httpHeaders ? { headers: original.httpHeaders } : {}) } } : {}),
      },
    });
  }
  if (!(error instanceof GraphQLError) || error.originalError) log.error({ err: original }, 'unexpected error in a resolver');
  return yogaMaskError(error, message, isDev);
}

export function createGraphQL(opts: ServerOptions): YogaServerInstance<Record<string, unknown>, Context> {
  return createYoga<Record<string, unknown>, Context>({
    schema,
    graphqlEndpoint: GRAPHQL_PATH,
    graphiql: { title: 'Sluice', subscriptionsProtocol: 'WS' },
    renderGraphiQL: renderSluiceGraphiQL, // offline (assets inlined), subscriptions authenticated

    landingPage: false,
    logging: false,
    maskedErrors: { maskError: (e, m, d) => maskError(opts.log, e, m, d), isDev: opts.development },
    context: async ({ request, connectionParams, req }: { request?: Request; connectionParams?: Record<string, unknown>; req?: IncomingMessage }) => {
      // Over graphql-ws there is no Request: the connection's params, else its upgrade request's header.
      const authorization = request ? request.headers.get('authorization') : connectionAuthorization(connectionParams, req?.headers.authorization);
      return { auth: await authenticate(opts.services, authorization), services: opts.services };
    },
    plugins: [
      ...hardeningPlugins(opts.limits ?? DEFAULT_QUERY_LIMITS), // front door: CSRF, then query limits (before auth, before execution)
      useOperationAuth(),
      useInputErrorCodes(),
      ...(opts.metrics ? [opts.metrics.yogaPlugin()] : []),
    ],
  });
}

function tooLarge(res: ServerResponse, max: number): void {
  res.writeHead(413, { 'content-type': 'application/json', connection: 'close' });
  res.end(
    JSON.stringify({ errors: [{ message: `request body is larger than ${max} bytes`, extensions: { code: 'BODY_TOO_LARGE', maxBytes: max } }] }),
  );
}

/** Reads a request body, refusing past `max` bytes without buffering the excess. */
async function readBody(req: IncomingMessage, max: number): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > max) return null;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

export function createHttpServer(opts: ServerOptions): { server: Server; yoga: ReturnType<typeof createGraphQL> } {
  const yoga = createGraphQL(opts);

  const server = createServer(async (req, res) => {
    try {
      const url = new URL(req.url ?? '/', 'http://localhost');
      if (url.pathname === '/healthz') {
        res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
        return;
      }
      // --- metrics ---
      if (url.pathname === '/metrics' && (req.method === 'GET' || req.method === 'HEAD')) {
        if (!opts.metrics) {
          res.writeHead(404, { 'content-type': 'text/plain' }).end('metrics are not enabled in this process');
          return;
        }
        const { contentType, body } = await opts.metrics.render();
        res.writeHead(200, { 'content-type': contentType }).end(req.method === 'HEAD' ? undefined : body);
        return;
      }
      // --- end metrics ---
      if (await serveConsole(req, res, url.pathname)) return;
      if (url.pathname === '/' && req.method === 'GET') {
        res.writeHead(302, { location: GRAPHQL_PATH }).end();
        return;
      }
      let body: Buffer | undefined;
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        const declared = Number(req.headers['content-length'] ?? 0);
        if (declared > opts.maxBodyBytes) return tooLarge(res, opts.maxBodyBytes);
        const read = await readBody(req, opts.maxBodyBytes);
        if (read === null) return tooLarge(res, opts.maxBodyBytes);
        body = read;
      }
      const headers = new Headers();
      for (const [k, v] of Object.entries(req.headers)) {
        if (Array.isArray(v)) v.forEach((x) => headers.append(k, x));
        else if (v !== undefined) headers.set(k, v);
      }
      const response = await yoga.fetch(
        new Request(new URL(req.url ?? '/', `http://${req.headers.host ?? 'localhost'}`), {
          method: req.method ?? 'GET',
          headers,
          ...(body ? { body: new Uint8Array(body) } : {}),
        }),
        {},
      );
      res.writeHead(response.status, Object.fromEntries(response.headers));
      // Yoga's Response may be a ponyfill: iterate its body rather than convert it, so streams (SSE) flow as they come.
      if (response.body) {
        for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) res.write(chunk);
      }
      res.end();
    } catch (err) {
      opts.log.error({ err }, 'http handler failed');
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ errors: [{ message: 'internal error', extensions: { code: 'INTERNAL_SERVER_ERROR' } }] }));
    }
  });

  // graphql-ws on the same port and path, sharing Yoga's envelop (plugins, auth, masking).
  const wss = new WebSocketServer({ server, path: GRAPHQL_PATH, maxPayload: opts.maxBodyBytes });
  useServer(
    {
      execute: (args) => (args.rootValue as { execute: (a: unknown) => unknown }).execute(args) as never,
      subscribe: (args) => (args.rootValue as { subscribe: (a: unknown) => unknown }).subscribe(args) as never,
      onConnect: async (ctx) => {
        // Refuse a connection whose key is missing or wrong before any operation: closes with 4403.
        const authorization = connectionAuthorization(ctx.connectionParams, ctx.extra.request.headers.authorization);
        const auth = await authenticate(opts.services, authorization);
        return auth.kind === 'admin' || auth.kind === 'tenant';
      },
      onSubscribe: async (ctx, _id, payload) => {
        const { schema: s, execute, subscribe, contextFactory, parse, validate } = yoga.getEnveloped({
          ...ctx,
          req: ctx.extra.request,
          socket: ctx.extra.socket,
          params: payload,
          connectionParams: ctx.connectionParams,
        });
        // A refused document (syntax, TOO_MANY_TOKENS) is an error for this operation, not a dropped socket.
        let document: ReturnType<typeof parse>;
        try {
          document = parse(payload.query);
        } catch (err) {
          if (err instanceof GraphQLError) return [err];
          throw err;
        }
        const args = {
          schema: s,
          operationName: payload.operationName,
          document,
          variableValues: payload.variables,
          contextValue: await contextFactory(),
          rootValue: { execute, subscribe },
        };
        const errors = validate(args.schema, args.document);
        if (errors.length) return errors;
        return args;
      },
    },
    wss,
  );

  server.on('close', () => wss.close());
  return { server, yoga };
}
