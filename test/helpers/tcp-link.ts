/**
 * A TCP link a test can cut: a node whose DATABASE_URL points here reaches
 * Postgres only through it. `cut()` resets every open connection and every
 * new one until `heal()`, so that node alone loses Postgres while the others,
 * connected directly, keep it (a partition, not an outage of Postgres).
 */
import net from 'node:net';

export interface TcpLink {
  port: number;
  cut(): void;
  heal(): void;
  stop(): Promise<void>;
}

export async function startTcpLink(targetPort: number, host = '127.0.0.1'): Promise<TcpLink> {
  let cutOff = false;
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    if (cutOff) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(targetPort, host);
    for (const s of [client, upstream]) {
      open.add(s);
      s.on('error', () => {});
      s.on('close', () => {
        open.delete(s);
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((r) => server.listen(0, host, () => r()));
  const resetAll = () => {
    for (const s of open) s.resetAndDestroy();
    open.clear();
  };
  return {
    port: (server.address() as net.AddressInfo).port,
    cut: () => {
      cutOff = true;
      resetAll();
    },
    heal: () => {
      cutOff = false;
    },
    stop: async () => {
      resetAll();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
