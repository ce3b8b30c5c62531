/**
 * Keys' lastUsedAt without a write per request: a use is noted in memory
 * when the key's last noted use is at least LAST_USED_INTERVAL_MS old
 * (tenants/api-keys.ts lastUseDue), and the noted uses are written together
 * every few seconds in one statement (TenantStore.recordKeyUse). So a busy
 * key costs one row update a minute per process, and lastUsedAt is exact to
 * within a minute plus the flush period.
 */
import { LAST_USED_INTERVAL_MS, lastUseDue } from './api-keys.ts';

export interface KeyUseOptions {
  /** The write of the uses noted since the last flush (keyId → when). */
  write: (uses: ReadonlyMap<string, Date>) => Promise<void>;
  flushMs?: number;
  intervalMs?: number;
  onError?: (err: unknown) => void;
  now?: () => number;
}

export class KeyUseRecorder {
  /** keyId → epoch ms of its last noted use. */
  private readonly noted = new Map<string, number>();
  private due = new Map<string, Date>();
  private timer: NodeJS.Timeout | null = null;
  private readonly o: Required<KeyUseOptions>;

  constructor(opts: KeyUseOptions) {
    this.o = { flushMs: 5_000, intervalMs: LAST_USED_INTERVAL_MS, onError: () => {}, now: Date.now, ...opts };
  }

  /** A request authenticated with this key: a map read on the hot path, a note at most once an interval. */
  seen(keyId: string): void {
    const now = this.o.now();
    if (!lastUseDue(this.noted.get(keyId), now, this.o.intervalMs)) return;
    this.noted.set(keyId, now);
    this.due.set(keyId, new Date(now));
  }

  start(): void {
    this.timer ??= setInterval(() => void this.flush(), this.o.flushMs).unref();
  }

  /** Writes the noted uses; a failed write keeps them for the next flush. */
  async flush(): Promise<void> {
    if (this.due.size === 0) return;
    const batch = this.due;
    this.due = new Map();
    const now = this.o.now();
    // Keys not used for an interval need no memory: their next use is due anyway.
    for (const [id, at] of this.noted) if (now - at >= this.o.intervalMs) this.noted.delete(id);
    try {
      await this.o.write(batch);
    } catch (err) {
      for (const [id, at] of batch) if (!this.due.has(id)) this.due.set(id, at);
      this.o.onError(err);
    }
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.flush();
  }
}
