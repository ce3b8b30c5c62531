/** Log lines a test app writes, parsed: tests judge what Sluice logged (its level, its fields). */
import { Writable } from 'node:stream';
import { pino, type Level } from 'pino';
import type { Logger } from '../../src/log.ts';

export function capturingLogger(level: Level = 'info'): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, done) {
      for (const l of String(chunk).split('\n')) if (l.trim()) lines.push(JSON.parse(l));
      done();
    },
  });
  return { log: pino({ level }, stream) as unknown as Logger, lines };
}
