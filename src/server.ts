/**
 * HTTP wiring: one node:http server carries GraphQL over HTTP (Yoga, with
 * GraphiQL when GRAPHIQL is on) and graphql-ws on the same port and path.
 * Subscriptions run over graphql-ws only (events/subscriptions.ts). Before a
 * body or a graphql-ws message is read, the caller's credential is checked
 * from the headers (or at connection_init) and the limits that follow from it
 * apply (http/front-door.ts).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { GraphQLError, getOperationAST } from 'graphql';
import { createYoga, maskError as yogaMaskError, type Plugin, type YogaServerInstance } from 'graphql-yoga';
import { trace } from '@opentelemetry/api';
import { endSpan, extractContext, SpanKind, startSpan, tracing, withSpan } from './tracing/tracer.ts';
import { allowedAttributes } from './tracing/attributes.ts';
import { useServer } from 'graphql-ws/use/ws';
import { WebSocketServer } from 'ws';
import type { Logger } from 'pino';
import { SluiceError, withoutStack } from './errors.ts';
import { databaseUnavailable, isDatabaseUnavailable } from './db/availability.ts';
import { CommitGate } from './http/deadline.ts';
import { checkGetRequest, codedEmptyError, useInputHardening } from './http/input.ts';
import { operationRefusal, useOperationAuth } from './graphql/auth-plugin.ts';
import { WS_CLOSE, WsConnections } from './http/ws-auth.ts';
import { useInputErrorCodes } from './graphql/input-errors-plugin.ts';
import { isCallerError } from './graphql/caller-errors.ts';
import { authenticate, connectionAuthorization, type Context, type Services } from './graphql/context.ts';
import { schema } from './graphql/schema.ts';
import { DEFAULT_QUERY_LIMITS, hardeningPlugins, type QueryLimits } from './http/hardening.ts';
import type { Metrics } from './metrics.ts';
import { serveOps, type OpsOptions } from './http/ops.ts';
import { serveUsageCsv } from './http/usage-csv.ts';
import { serveUsageEvents } from './http/usage-events.ts';
import { useSubscriptionsOverWsOnly, type SubscriptionRegistry } from './events/subscriptions.ts';
import { renderSluiceGraphiQL, useGraphiQLHeaders } from './http/graphiql.ts';
import { AuthFailureBudget, CONNECTIONS_CHECK_MS, admit, applyTimeouts, limitSocketPayload, type HttpTimeouts } from './http/front-door.ts';
import { clientAddress, forwardedEntries, type ForwardedHeader, type TrustProxy } from './http/client-address.ts';
import { GRAPHQL_PATH, methodNotAllowed, notFound, route } from './http/routes.ts';
import { drainBound, refuseReadably } from './http/refusal.ts';
import { useIntrospectionPolicy, type IntrospectionMode } from './http/introspection.ts';
import { useAdminAudit } from './http/audit.ts';
import { serveConsole } from './http/console.ts';
import { chargeOperation, throttledError, useRequestBudget } from './http/budget.ts';

export { GRAPHQL_PATH };

export interface ServerOptions {
  services: Services;
  maxBodyBytes: number;
  log: Logger;
  /** Longest a request may wait (on the database) before it is answered 503 DATABASE_UNAVAILABLE; default 30000. */
  requestTimeoutMs?: number;
  development: boolean;
  /** Query depth/cost/alias/token limits (queryLimitsFromEnv); default DEFAULT_QUERY_LIMITS. */
  limits?: QueryLimits;
  /** Counts GraphQL requests (served at /metrics through `ops`). */
  metrics?: Metrics;
  /** /healthz, /readyz and /metrics with METRICS_TOKEN (src/http/ops.ts): the one place they are served. */
  ops: OpsOptions;
  /** graphql-ws caps and the sockets closed when keys change; absent: no caps. */
  subscriptions?: SubscriptionRegistry;
  /** Limits before authentication (http/front-door.ts); defaults: 64 KiB, 20 failures a minute, Node's timeouts. */
  unauthenticatedMaxBodyBytes?: number;
  authFailuresPerMinute?: number;
  httpTimeouts?: HttpTimeouts;
  /** GraphiQL at GET /graphql (GRAPHIQL); default off. */
  graphiql?: boolean;
  /** TRUST_PROXY and TRUST_PROXY_HEADER: whose word on the client's address is believed (http/client-address.ts); default: nobody's. */
  trustProxy?: TrustProxy;
  trustProxyHeader?: ForwardedHeader;
  /** INTROSPECTION (http/introspection.ts); default `public` in development, `keys` otherwise. */
  introspection?: IntrospectionMode;
}

/** The client's address: the socket's peer, or what the trusted proxies in front of it say. */
export function requestAddress(req: IncomingMessage, trust: TrustProxy | undefined, header: ForwardedHeader | undefined): string {
  if (!trust || trust.kind === 'none') return clientAddress(req.socket.remoteAddress, [], { kind: 'none' });
  return clientAddress(req.socket.remoteAddress, forwardedEntries(req.headers, header ?? 'x-forwarded-for'), trust);
}

/** SluiceError → a GraphQL error with its code; anything else is logged and masked (no stack traces outside development). */
function maskError(log: Logger, error: unknown, message: string, isDev?: boolean): Error {
  let original = error instanceof GraphQLError ? (error.originalError ?? error) : error;
  // The database went away: a coded 503 with Retry-After, never a 500 (and never its SQL or socket details).
  if (!(original instanceof SluiceError) && isDatabaseUnavailable(original)) original = databaseUnavailable();
  if (original instanceof SluiceError) {
    const e = error instanceof GraphQLError ? error : undefined;
    // A coded answer, shown without a stack: none is captured for it.
    const coded = original;
    return withoutStack(() => new GraphQLError(coded.message, {
      ...(e?.nodes ? { nodes: e.nodes } : {}),
      ...(e?.path ? { path: e.path } : {}),
      extensions: {
        code: coded.code,
        ...coded.extensions,
        ...(coded.httpStatus ? { http: { status: coded.httpStatus, ...(coded.httpHeaders ? { headers: coded.httpHeaders } : {}) } } : {}),
      },
    }));
  }
  // A caller's mistake is answered with its code, not logged: only what nobody meant to throw is an error.
  if (!isCallerError(error)) log.error({ err: original }, 'unexpected error in a resolver');
  return yogaMaskError(error, message, isDev);
}

/** One GraphQL request as a SERVER span, active while it is handled (logs inside carry its ids). */
function tracedRequest(req: IncomingMessage, res: ServerResponse, handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>): Promise<void> {
  const method = req.method ?? 'GET';
  const span = startSpan(`${method} ${GRAPHQL_PATH}`, {
    parent: extractContext(req.headers),
    kind: SpanKind.SERVER,
    attributes: { 'http.request.method': method, 'url.path': GRAPHQL_PATH },
  });
  res.once('close', () => endSpan(span, { attributes: { 'http.response.status_code': res.statusCode }, error: res.statusCode >= 500 ? String(res.statusCode) : null }));
  return withSpan(span, () => handle(req, res));
}

/** The operation's type and name on the request's span (before it runs). */
function useTraceOperation(): Plugin {
  return {
    onExecute({ args }) {
      if (!tracing.on) return;
      const span = trace.getActiveSpan();
      const op = span ? getOperationAST(args.document, args.operationName) : null;
      if (span && op) span.setAttributes(allowedAttributes({ 'graphql.operation.type': op.operation, 'graphql.operation.name': op.name?.value }));
    },
  };
}

export function createGraphQL(opts: Omit<ServerOptions, 'ops'>): YogaServerInstance<Record<string, unknown>, Context> {
  return createYoga<Record<string, unknown>, Context>({
    schema,
    graphqlEndpoint: GRAPHQL_PATH,
    graphiql: opts.graphiql ? { title: 'Sluice', subscriptionsProtocol: 'WS' } : false,
    renderGraphiQL: renderSluiceGraphiQL, // offline (assets inlined), subscriptions authenticated

    landingPage: false,
    logging: false,
    maskedErrors: { maskError: (e, m, d) => maskError(opts.log, e, m, d), isDev: opts.development },
    context: async ({ request, connectionParams, req, gate, socket, auth, address }: { request?: Request; connectionParams?: Record<string, unknown>; req?: IncomingMessage; gate?: CommitGate; socket?: { close(code: number, reason: string): void }; auth?: Context['auth']; address?: string }) => {
      // HTTP: the front door authenticated from the headers already (before reading the body).
      // Over graphql-ws there is no Request: the connection's params, else its upgrade request's header.
      const authorization = request ? request.headers.get('authorization') : connectionAuthorization(connectionParams, req?.headers.authorization);
      return {
        auth: auth ?? (await authenticate(opts.services, authorization)),
        services: opts.services,
        address: address ?? (req ? requestAddress(req, opts.trustProxy, opts.trustProxyHeader) : null),
        ...(gate ? { gate } : {}),
        ...(socket ? { socket } : {}),
      };
    },
    plugins: [
      useSubscriptionsOverWsOnly(), // SSE is off: before the operation's authorization, so any caller learns where subscriptions are
      useGraphiQLHeaders(),
      ...hardeningPlugins(opts.limits ?? DEFAULT_QUERY_LIMITS), // front door: CSRF, then query limits (before auth, before execution)
      useIntrospectionPolicy(opts.introspection ?? (opts.development ? 'public' : 'keys')), // before auth: an anonymous __schema runs nothing
      useOperationAuth(),
      useRequestBudget(), // after the credential is checked: tenants pay for what they run (http/budget.ts)
      useInputHardening(),
      useInputErrorCodes(),
      useAdminAudit(opts.log),
      ...(opts.metrics ? [opts.metrics.yogaPlugin()] : []),
      useTraceOperation(),
    ],
  });
}

function tooLarge(res: ServerResponse, max: number, unauthenticated = false): void {
  res.writeHead(413, { 'content-type': 'application/json' });
  const message = unauthenticated ? `request body is larger than ${max} bytes, the limit without an API key: send Authorization: Bearer <api key>` : `request body is larger than ${max} bytes`;
  res.end(JSON.stringify({ errors: [{ message, extensions: { code: 'BODY_TOO_LARGE', maxBytes: max } }] }));
}

function sendErrors(res: ServerResponse, status: number, error: { message: string; extensions: Record<string, unknown> }, headers: Record<string, string> = {}): void {
  const body = JSON.stringify({ errors: [error] });
  const { 'content-length': _len, 'content-type': _type, ...rest } = headers;
  res.writeHead(status, { ...rest, 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

function timedOut(res: ServerResponse, ms: number): void {
  const e = databaseUnavailable(`the request waited ${ms} ms for the database`);
  sendErrors(res, 503, { message: e.message, extensions: { code: e.code, ...e.extensions } }, e.httpHeaders);
}

/** Whether an answer of this content type is a stream whose parts are written as they come. Pure. */
export function isStreamed(contentType: string | null): boolean {
  const t = (contentType ?? '').toLowerCase();
  return t.startsWith('text/event-stream') || t.startsWith('multipart/');
}

/** The response, or null when the deadline passed first and `gate` let it answer (no commit under way). */
async function withDeadline<T>(pending: Promise<T>, ms: number, gate: CommitGate): Promise<T | null> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<'deadline'>((r) => (timer = setTimeout(() => r('deadline'), ms)));
  try {
    const first = await Promise.race([pending, deadline]);
    if (first !== 'deadline') return first as T;
    return gate.expire() ? null : await pending;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Reads a request body, refusing past `max` bytes without buffering the excess.
 * It stops listening there but does not destroy the request (an async iterator
 * broken out of would, and the socket with it): the refusal is answered and the
 * rest drained by refuseReadably.
 */
function readBody(req: IncomingMessage, max: number): Promise<Buffer | null> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (v: Buffer | null) => {
      req.removeListener('data', onData);
      req.removeListener('end', onEnd);
      req.removeListener('error', onError);
      resolve(v);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > max) {
        req.pause();
        done(null);
      } else chunks.push(chunk);
    };
    const onEnd = () => done(Buffer.concat(chunks));
    const onError = (err: Error) => {
      req.removeListener('data', onData);
      req.removeListener('end', onEnd);
      reject(err);
    };
    req.on('data', onData);
    req.once('end', onEnd);
    req.once('error', onError);
  });
}

export function createHttpServer(opts: ServerOptions): { server: Server; yoga: ReturnType<typeof createGraphQL>; closeSubscriptions(): Promise<void>; connections: WsConnections } {
  const yoga = createGraphQL(opts);
  const budget = new AuthFailureBudget({ perMinute: opts.authFailuresPerMinute ?? 20 });
  const unauthenticatedMax = opts.unauthenticatedMaxBodyBytes ?? 64 * 1024;
  const addressOf = (req: IncomingMessage) => requestAddress(req, opts.trustProxy, opts.trustProxyHeader);
  /** A refusal sent before the body was read: answered first, the body drained within bounds (http/refusal.ts). */
  const refuse = (req: IncomingMessage, res: ServerResponse, status: number, error: { message: string; extensions: Record<string, unknown> }, headers: Record<string, string> = {}, limit = unauthenticatedMax) =>
    refuseReadably(req, res, (r) => sendErrors(r, status, error, headers), drainBound(limit));

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    try {
      const url = new URL(req.url ?? '/', 'http://localhost');
      // One front door: a path or method nobody documented is refused from the request line (http/routes.ts).
      const door0 = route(req.method, url.pathname);
      if (door0.kind === 'not-found') return refuse(req, res, 404, notFound(req.method, url.pathname));
      if (door0.kind === 'method-not-allowed') return refuse(req, res, 405, methodNotAllowed(req.method, url.pathname, door0.allow), { allow: door0.allow.join(', ') });
      if (door0.kind === 'ops') {
        if (await serveOps(req, res, opts.ops)) return;
        return refuse(req, res, 404, notFound(req.method, url.pathname));
      }
      if (door0.kind === 'console') {
        await serveConsole(req, res, url.pathname);
        return;
      }
      if (door0.kind === 'root') {
        res.writeHead(302, { location: GRAPHQL_PATH }).end();
        return;
      }
      // The key is checked from the headers, before any body is read (http/front-door.ts).
      // Its lookup counts against the request deadline like any other wait on the database.
      const startedAt = Date.now();
      const deadlineMs = opts.requestTimeoutMs ?? 30_000;
      const door = await withDeadline(
        admit(
          { authorization: req.headers.authorization, address: addressOf(req) },
          { budget, authenticate: (a) => authenticate(opts.services, a), maxBodyBytes: opts.maxBodyBytes, unauthenticatedMaxBodyBytes: unauthenticatedMax },
        ),
        deadlineMs,
        new CommitGate(),
      );
      if (door === null) {
        const e = databaseUnavailable(`the request waited ${deadlineMs} ms for the database`);
        return refuse(req, res, 503, { message: e.message, extensions: { code: e.code, ...e.extensions } }, e.httpHeaders);
      }
      if (!door.admitted) return refuse(req, res, door.status, door.error, door.headers);
      if (tracing.on && door.auth.kind === 'tenant') trace.getActiveSpan()?.setAttribute('sluice.tenant.id', door.auth.tenant.id);
      const maxBody = door.maxBodyBytes;
      if (door0.kind === 'usage-csv') return await serveUsageCsv(req, res, opts.services);
      if (door0.kind === 'usage-events') return await serveUsageEvents(req, res, opts.services);
      let body: Buffer | undefined;
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        const declared = Number(req.headers['content-length'] ?? 0);
        const refuseTooLarge = () => refuseReadably(req, res, (r) => tooLarge(r, maxBody, maxBody < opts.maxBodyBytes), drainBound(maxBody));
        if (declared > maxBody) return refuseTooLarge();
        const read = await readBody(req, maxBody);
        if (read === null) return refuseTooLarge();
        body = read;
      }
      if (req.method === 'GET' && url.pathname === GRAPHQL_PATH) {
        const refused = checkGetRequest(url.searchParams);
        if (refused) return sendErrors(res, 400, refused);
      }
      // Yoga's own fetch classes (the @whatwg-node ponyfill), not Node's: a Buffer body is read back
      // as it is, where Node's Request made it a web stream that Yoga then converted and collected.
      const headers = new yoga.fetchAPI.Headers();
      for (const [k, v] of Object.entries(req.headers)) {
        if (Array.isArray(v)) v.forEach((x) => headers.append(k, x));
        else if (v !== undefined) headers.set(k, v);
      }
      const gate = new CommitGate();
      const pending = Promise.resolve(yoga.fetch(
        new yoga.fetchAPI.Request(new URL(req.url ?? '/', `http://${req.headers.host ?? 'localhost'}`).toString(), {
          method: req.method ?? 'GET',
          headers,
          ...(body ? { body: body as Buffer<ArrayBuffer> } : {}),
        }),
        { gate, address: addressOf(req), auth: door.auth },
      ));
      const response = await withDeadline(pending, Math.max(1, deadlineMs - (Date.now() - startedAt)), gate);
      if (response === null) {
        // Still waiting (on the database) at the deadline, and no commit under way: answer now; the late result is dropped.
        void pending.then((late) => late.body?.cancel().catch(() => {}), () => {});
        return timedOut(res, deadlineMs);
      }
      // Yoga answers some refusals (406, 415) with an empty body: give them a body with a code, like every other error.
      const coded = codedEmptyError(response.status);
      if (coded) {
        const text = await response.text();
        if (text.trim() === '') return sendErrors(res, response.status, coded, Object.fromEntries(response.headers));
        res.writeHead(response.status, Object.fromEntries(response.headers)).end(text);
        return;
      }
      res.writeHead(response.status, Object.fromEntries(response.headers));
      // A whole answer (JSON: every query and mutation) is written at once; a stream (SSE, multipart)
      // is iterated so its parts flow as they come. Yoga's Response may be a ponyfill: iterate its
      // body rather than convert it.
      if (response.body && isStreamed(response.headers.get('content-type'))) {
        for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) res.write(chunk);
        res.end();
      } else res.end(response.body ? Buffer.from(await response.arrayBuffer()) : undefined);
    } catch (err) {
      if (isDatabaseUnavailable(err)) {
        const e = databaseUnavailable();
        if (!res.headersSent) return sendErrors(res, 503, { message: e.message, extensions: { code: e.code, ...e.extensions } }, e.httpHeaders);
      } else opts.log.error({ err }, 'http handler failed');
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ errors: [{ message: 'internal error', extensions: { code: 'INTERNAL_SERVER_ERROR' } }] }));
    }
  };
  // Node enforces headersTimeout and requestTimeout when it checks its connections: every second, not its default 30.
  // With tracing on, a GraphQL request is a SERVER span (a client's traceparent its parent); the rest is not traced.
  const server = createServer({ connectionsCheckingInterval: CONNECTIONS_CHECK_MS }, (req, res) => {
    if (tracing.on && (req.url === GRAPHQL_PATH || req.url?.startsWith(`${GRAPHQL_PATH}?`))) return tracedRequest(req, res, handle);
    return handle(req, res);
  });

  // graphql-ws on the same port and path, sharing Yoga's envelop (plugins, auth, masking).
  // Re-validation after a revocation notice reads the database, not the key cache: the cache may
  // not have seen the same notice yet (both listen on sluice_auth, in no set order).
  const connections = new WsConnections((authorization) => authenticate(opts.services, authorization, { fresh: true }));
  const wss = new WebSocketServer({
    server,
    maxPayload: opts.maxBodyBytes,
    // Upgrades are taken on /graphql only (the one front door). No address is refused here: the
    // credential is judged at connection_init, so others' failures never lock out a valid key.
    verifyClient: (info, done) => {
      const pathname = new URL(info.req.url ?? '/', 'http://localhost').pathname;
      if (pathname === GRAPHQL_PATH) done(true);
      else done(false, 404, `Not Found: graphql-ws is served at ${GRAPHQL_PATH}`);
    },
  });
  // Until its connection_init is accepted, a socket reads small messages only (ws's maxPayload is per server).
  wss.on('connection', (socket) => limitSocketPayload(socket as never, unauthenticatedMax));
  const wsServer = useServer(
    {
      // Close reasons of internal errors carry no message unless in development (graphql-ws reads NODE_ENV otherwise).
      isProd: !opts.development,
      execute: (args) => (args.rootValue as { execute: (a: unknown) => unknown }).execute(args) as never,
      subscribe: (args) => (args.rootValue as { subscribe: (a: unknown) => unknown }).subscribe(args) as never,
      onConnect: async (ctx) => {
        // Refuse a connection whose key is missing, unknown or revoked before any operation: 4401, with the reason.
        const socket = ctx.extra.socket;
        const authorization = connectionAuthorization(ctx.connectionParams, ctx.extra.request.headers.authorization);
        let auth: Awaited<ReturnType<typeof authenticate>>;
        try {
          auth = await authenticate(opts.services, authorization);
        } catch (err) {
          if (!isDatabaseUnavailable(err)) throw err;
          socket.close(WS_CLOSE.tryAgainLater, 'DATABASE_UNAVAILABLE: try again in a few seconds');
          return false;
        }
        if (auth.kind !== 'admin' && auth.kind !== 'tenant') {
          if (auth.kind === 'invalid') {
            // Counted against the caller's address; past its budget, the close says when to try again.
            const address = addressOf(ctx.extra.request);
            const wait = budget.retryAfter(address);
            budget.fail(address);
            if (wait !== null) {
              socket.close(WS_CLOSE.tooManyAuthFailures, `TOO_MANY_AUTH_FAILURES: retry in ${wait} s`);
              return false;
            }
          }
          socket.close(WS_CLOSE.unauthorized, auth.kind === 'anonymous' ? 'missing credential: send connectionParams.authorization = "Bearer <api key>"' : 'unknown or revoked API key');
          return false;
        }
        limitSocketPayload(socket as never, opts.maxBodyBytes);
        connections.add(socket, auth, authorization!);
        opts.subscriptions?.connected(ctx, auth.kind === 'tenant' ? auth.tenant.id : null);
        return true;
      },
      onComplete: (ctx, id) => opts.subscriptions?.end(ctx, id),
      onError: (ctx, id) => {
        opts.subscriptions?.end(ctx, id);
      },
      onClose: (ctx) => opts.subscriptions?.disconnected(ctx),
      onSubscribe: async (ctx, id, payload) => {
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
        let contextValue: Awaited<ReturnType<typeof contextFactory>>;
        try {
          contextValue = await contextFactory();
        } catch (err) {
          // The key check needs the database: while it is away, a coded error for this operation (the socket stays).
          if (!isDatabaseUnavailable(err)) throw err;
          const e = databaseUnavailable();
          return [new GraphQLError(e.message, { extensions: { code: e.code, ...e.extensions } })];
        }
        const args = {
          schema: s,
          operationName: payload.operationName,
          document,
          variableValues: payload.variables,
          contextValue,
          rootValue: { execute, subscribe },
        };
        const errors = validate(args.schema, args.document);
        if (errors.length) return errors;
        // An operation this credential may not run is refused alone (FORBIDDEN): its siblings keep running.
        // A key revoked meanwhile is the connection's failure: 4401.
        const refused = operationRefusal(args);
        if (refused) {
          if (refused.extensions.code === 'FORBIDDEN') return [new GraphQLError(refused.message, { extensions: { code: 'FORBIDDEN' } })];
          ctx.extra.socket.close(WS_CLOSE.unauthorized, refused.message.slice(0, 120));
          return [refused];
        }
        // Over its request budget: an error for this operation (THROTTLED), the socket stays open.
        const charged = await chargeOperation(args);
        if (charged && !charged.granted) return [throttledError(charged, { http: false })];
        // Counted once it will run; onComplete, onError or the socket's close uncount it.
        const overCap = opts.subscriptions?.start(ctx, id);
        if (overCap) return [overCap];
        return args;
      },
    },
    wss,
  );

  // Requests Node refuses before any handler (headers or URL too large, malformed HTTP): a coded JSON body, not a bare status.
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    if (!socket.writable) return socket.destroy();
    const tooLarge = err.code === 'HPE_HEADER_OVERFLOW';
    // Headers or body slower than HTTP_HEADERS_TIMEOUT_MS / HTTP_REQUEST_TIMEOUT_MS (http/front-door.ts).
    const slow = err.code === 'ERR_HTTP_REQUEST_TIMEOUT';
    const status = tooLarge ? '431 Request Header Fields Too Large' : slow ? '408 Request Timeout' : '400 Bad Request';
    const message = tooLarge ? 'request headers (or the URL) are too large: send the query in a POST body' : slow ? 'the request did not arrive in time' : 'malformed HTTP request';
    const body = JSON.stringify({ errors: [{ message, extensions: { code: tooLarge ? 'HEADERS_TOO_LARGE' : slow ? 'REQUEST_TIMEOUT' : 'BAD_REQUEST' } }] });
    socket.end(`HTTP/1.1 ${status}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  });
  server.on('close', () => wss.close());
  if (opts.httpTimeouts) applyTimeouts(server, opts.httpTimeouts);
  // On stop: every open subscription socket is closed with 1001 Going away, so clients know to reconnect elsewhere.
  let closed: Promise<void> | null = null;
  const closeSubscriptions = () => (closed ??= Promise.resolve(wsServer.dispose()).catch(() => {}));
  return { server, yoga, closeSubscriptions, connections };
}
