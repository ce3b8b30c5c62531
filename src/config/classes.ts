/** The priority classes, highest first: the lowest sheds first. */
export const CLASSES = ['INTERACTIVE', 'STANDARD', 'BULK'] as const;
export type JobClass = (typeof CLASSES)[number];

/** Parses `BULK=0.7,STANDARD=0.9` (a number per class); throws naming a bad entry. */
export function parseClassNumbers(text: string): Partial<Record<JobClass, number>> {
  const out: Partial<Record<JobClass, number>> = {};
  for (const part of text.split(',').map((s) => s.trim()).filter(Boolean)) {
    const [cls, raw] = part.split('=').map((s) => s.trim());
    const value = Number(raw);
    if (!(CLASSES as readonly string[]).includes(cls ?? '')) throw new Error(`unknown class "${cls}" (use ${CLASSES.join(', ')})`);
    if (!Number.isFinite(value) || value < 0) throw new Error(`the value for ${cls} must be a number >= 0, got "${raw}"`);
    out[cls as JobClass] = value;
  }
  return out;
}

/** Parses `STANDARD=30,BULK=120` (seconds per class) into milliseconds. */
export function parseClassSeconds(text: string): Partial<Record<JobClass, number>> {
  return Object.fromEntries(Object.entries(parseClassNumbers(text)).map(([c, s]) => [c, s! * 1000]));
}
