/**
 * Telling humans: every raised alert is logged at error level and POSTed to
 * ALERT_WEBHOOK_URL when set; clearing is logged and POSTed too. Delivery is
 * best effort with a timeout: a dead webhook must not stop the sweeper.
 */
import type { Logger } from 'pino';
import type { AlertRow } from './store.ts';

export interface AlertNotifier {
  raised(alert: AlertRow): Promise<void>;
  cleared(alert: AlertRow): Promise<void>;
}

export function createNotifier(opts: { webhookUrl?: string | undefined; log: Logger; onRaised?: (key: string) => void }): AlertNotifier {
  const post = async (event: 'raised' | 'cleared', alert: AlertRow) => {
    if (!opts.webhookUrl) return;
    try {
      const res = await fetch(opts.webhookUrl, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ source: 'sluice', event, alert: { key: alert.key, severity: alert.severity, message: alert.message, raisedAt: alert.raisedAt, clearedAt: alert.clearedAt } }),
        signal: AbortSignal.timeout(5_000),
      });
      if (!res.ok) opts.log.warn({ status: res.status, key: alert.key }, 'alert webhook refused the alert');
    } catch (err) {
      opts.log.warn({ err, key: alert.key }, 'alert webhook unreachable');
    }
  };
  return {
    async raised(alert) {
      opts.log.error({ alert: alert.key, severity: alert.severity }, `ALERT: ${alert.message}`);
      opts.onRaised?.(alert.key.split(':')[0]!);
      await post('raised', alert);
    },
    async cleared(alert) {
      opts.log.info({ alert: alert.key }, 'alert cleared');
      await post('cleared', alert);
    },
  };
}
