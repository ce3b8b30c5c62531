/**
 * Refusals a client can read. A request refused from its headers (401, 429,
 * 404, 413) may still be uploading its body. Closing the socket under it
 * makes the client's next write fail (EPIPE), and a close with unread bytes
 * sends a TCP reset that can discard the answer from the client's buffer
 * before it is read: the client sees a broken connection, not the status and
 * its Retry-After. So the answer goes out first, and the rest of the body is
 * read and thrown away, up to a bound in bytes and in time; past either the
 * socket stops being read for a second more (the client has the answer by
 * then) and is closed.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';

export interface DrainBound {
  /** Body bytes read and thrown away at most after the answer. */
  maxBytes: number;
  /** How long the rest of the body may take. */
  maxMs: number;
}

/** A refusal's drain: four times the limit that applied, for at most 5 s. */
export function drainBound(limitBytes: number): DrainBound {
  return { maxBytes: 4 * limitBytes, maxMs: 5_000 };
}

/** How long a socket past its drain bound stays open, unread, before it is closed. */
const LINGER_MS = 1_000;

/** Whether the request line and headers say a body follows that has not all arrived. Pure. */
export function bodyPending(req: { complete: boolean; headers: Record<string, string | string[] | undefined> }): boolean {
  if (req.complete) return false;
  const te = req.headers['transfer-encoding'];
  if (te !== undefined && String(te).trim() !== '') return true;
  const length = Number(req.headers['content-length'] ?? 0);
  return Number.isFinite(length) && length > 0;
}

/**
 * Sends a refusal with `answer`, then drains the request's body within `bound`
 * (see above). With no body pending it only answers (keep-alive as usual).
 *
 * With a body pending the answer says `connection: close` (the client must not
 * send another request on a socket that is about to close), and the close is a
 * lingering one: Node would destroy the socket as soon as the answer is flushed
 * (`destroySoon`), resetting a client still uploading; here the answer is
 * followed by a FIN only (the server's sockets are half-open), the body is read
 * and thrown away until it ends or the bound is reached, and only then is the
 * socket destroyed.
 */
export function refuseReadably(req: IncomingMessage, res: ServerResponse, answer: (res: ServerResponse) => void, bound: DrainBound): void {
  if (!bodyPending(req)) {
    answer(res);
    return;
  }
  const socket = req.socket;
  let read = 0;
  let timer: NodeJS.Timeout | undefined;
  const finish = () => {
    clearTimeout(timer);
    req.removeListener('data', onData);
  };
  const cut = () => {
    finish();
    req.pause();
    setTimeout(() => socket.destroy(), LINGER_MS).unref();
  };
  const onData = (chunk: Buffer) => {
    read += chunk.length;
    if (read > bound.maxBytes) cut();
  };
  // Node calls destroySoon once a `connection: close` answer is flushed: end our side, keep reading.
  (socket as { destroySoon?: () => void }).destroySoon = () => {
    if (socket.writable) socket.end();
  };
  req.on('data', onData);
  req.resume(); // a reader that stopped at its limit paused it
  req.once('end', () => {
    finish();
    socket.end();
    setTimeout(() => socket.destroy(), LINGER_MS).unref();
  });
  req.once('error', finish);
  timer = setTimeout(cut, bound.maxMs);
  timer.unref();
  res.setHeader('connection', 'close');
  answer(res);
}
