/**
 * Machine noise, reported next to every figure: cores, load, and how busy the
 * CPUs were during a measurement (from /proc/stat; null where unavailable).
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';

interface CpuTimes {
  busy: number;
  total: number;
}

function cpuTimes(): CpuTimes | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0]!;
    const v = line.trim().split(/\s+/).slice(1).map(Number);
    const idle = (v[3] ?? 0) + (v[4] ?? 0);
    const total = v.reduce((a, b) => a + b, 0);
    return { busy: total - idle, total };
  } catch {
    return null;
  }
}

/** Starts a CPU measurement; `end()` gives the machine's busy share (0..1, all cores) since. */
export function cpuMeter(): { end(): number | null } {
  const a = cpuTimes();
  return {
    end() {
      const b = cpuTimes();
      if (!a || !b || b.total === a.total) return null;
      return Math.round(((b.busy - a.busy) / (b.total - a.total)) * 1000) / 1000;
    },
  };
}

export function machine() {
  return {
    cores: os.availableParallelism(),
    cpuModel: os.cpus()[0]?.model ?? null,
    memGb: Math.round(os.totalmem() / 2 ** 30),
    loadavg: os.loadavg().map((x) => Math.round(x * 100) / 100),
    node: process.version,
    platform: `${process.platform} ${os.release()}`,
  };
}

/** CPU seconds (user + system) each process has used since it started, from /proc/<pid>/stat (missing pids are skipped). */
export function procCpuSeconds(pids: readonly number[]): Map<number, number> {
  const out = new Map<number, number>();
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      // Fields after the command (which may contain spaces) start after the last ')': state is field 3, utime 14, stime 15.
      const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      out.set(pid, (Number(rest[11]) + Number(rest[12])) / 100); // USER_HZ is 100 on Linux
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/** The summed CPU seconds of `after` minus `before` (a pid absent before counts from 0). */
export function cpuDelta(before: Map<number, number>, after: Map<number, number>): number {
  let s = 0;
  for (const [pid, v] of after) s += v - (before.get(pid) ?? 0);
  return Math.round(s * 1000) / 1000;
}

/** A process's resident memory (VmRSS) in MB, or null when it cannot be read. */
export function rssMb(pid: number): number | null {
  try {
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}
