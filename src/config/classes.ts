import { CLASSES, type JobClass } from '../queue/boss.ts';

/** Parses `STANDARD=30,BULK=120` (seconds per class) into milliseconds; throws naming a bad entry. */
export function parseClassSeconds(text: string): Partial<Record<JobClass, number>> {
  const out: Partial<Record<JobClass, number>> = {};
  for (const part of text.split(',').map((s) => s.trim()).filter(Boolean)) {
    const [cls, raw] = part.split('=').map((s) => s.trim());
    const seconds = Number(raw);
    if (!(CLASSES as readonly string[]).includes(cls ?? '')) throw new Error(`unknown class "${cls}" (use ${CLASSES.join(', ')})`);
    if (!Number.isFinite(seconds) || seconds < 0) throw new Error(`seconds for ${cls} must be a number >= 0, got "${raw}"`);
    out[cls as JobClass] = seconds * 1000;
  }
  return out;
}
