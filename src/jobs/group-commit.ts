/**
 * Group commit: concurrent single submissions in one process are coalesced
 * into one transaction. The first item of a group waits at most `windowMs`
 * for company; a group holds at most `maxItems`. While a group commits, the
 * next one gathers, and is flushed as soon as the previous one is done (its
 * items have waited long enough). Each caller gets its own answer: `flush`
 * returns one result per item (a value or that item's own error), and only
 * answers after its transaction committed, so an acknowledged job is durable.
 *
 * When a whole group fails (an unexpected error, not a per-item refusal), its
 * items are tried again one by one, so one bad item fails only itself.
 */
export interface GroupCommitOptions {
  windowMs: number;
  maxItems: number;
  /** Observes each committed group's size (metrics). */
  onGroup?: (size: number) => void;
  /**
   * Whether a failed group may be retried item by item: only when it surely
   * did not commit (an error at COMMIT itself may hide a commit, and a retry
   * would then write the jobs twice). Default: always.
   */
  splittable?: (error: unknown) => boolean;
}

export type ItemResult<O> = { ok: true; value: O } | { ok: false; error: unknown };

interface Pending<I, O> {
  item: I;
  resolve: (value: O) => void;
  reject: (error: unknown) => void;
}

export class GroupCommit<I, O> {
  private queue: Array<Pending<I, O>> = [];
  private timer: NodeJS.Timeout | null = null;
  private flushing = false;
  private readonly flush: (items: readonly I[]) => Promise<Array<ItemResult<O>>>;
  private readonly opts: GroupCommitOptions;

  constructor(flush: (items: readonly I[]) => Promise<Array<ItemResult<O>>>, opts: GroupCommitOptions) {
    this.flush = flush;
    this.opts = opts;
  }

  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.flushing) return; // the running group's end starts the next one
    if (this.queue.length >= this.opts.maxItems) {
      this.startFlush();
    } else if (!this.timer) {
      this.timer = setTimeout(() => this.startFlush(), this.opts.windowMs);
    }
  }

  private startFlush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.flushing || this.queue.length === 0) return;
    this.flushing = true;
    const group = this.queue.splice(0, this.opts.maxItems);
    void this.run(group).finally(() => {
      this.flushing = false;
      // Items that arrived meanwhile have waited a whole commit already: no extra window.
      if (this.queue.length > 0) this.startFlush();
    });
  }

  private async run(group: Array<Pending<I, O>>): Promise<void> {
    let results: Array<ItemResult<O>>;
    try {
      results = await this.flush(group.map((p) => p.item));
      this.opts.onGroup?.(group.length);
    } catch (groupError) {
      if (group.length === 1 || !(this.opts.splittable?.(groupError) ?? true)) {
        for (const p of group) p.reject(groupError);
        return;
      }
      // Find the culprit: each item in its own transaction.
      for (const p of group) {
        try {
          const [r] = await this.flush([p.item]);
          this.opts.onGroup?.(1);
          if (r!.ok) p.resolve(r!.value);
          else p.reject(r!.error);
        } catch (err) {
          p.reject(err);
        }
      }
      return;
    }
    group.forEach((p, i) => {
      const r = results[i]!;
      if (r.ok) p.resolve(r.value);
      else p.reject(r.error);
    });
  }
}
