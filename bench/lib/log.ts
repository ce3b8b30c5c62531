/**
 * Progress lines for humans go to stderr; stdout carries only the one JSON result.
 */
const started = Date.now();

export function progress(msg: string): void {
  const s = ((Date.now() - started) / 1000).toFixed(1).padStart(6);
  process.stderr.write(`[bench ${s}s] ${msg}\n`);
}
