"""What a process and its descendants use, from /proc: CPU seconds and proportional memory (PSS).

The sweep runs each trial in a process of its own and asks here, for that process and its
DataLoader workers: CPU seconds at the start and end of the measured part (cores used = their
difference over the wall time) and the peak of the summed PSS, sampled by a thread.  PSS, not RSS:
pages the workers share with the parent (the forked interpreter, mapped shards) count once in
the sum, where RSS would count them once per process.  Off Linux the figures are None.
"""

from __future__ import annotations

import os
import threading

SAMPLE_S = 0.2  # how often the memory sampler reads the tree's PSS


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children, their children...), from /proc."""
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return [pid]
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # the command name may hold spaces and parentheses: fields start after the last ")"
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, ()))
    return out


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds of ``pids`` so far (None where /proc has no stat)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, seen = 0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
        seen = True
    return total / ticks if seen else None


def pss_bytes(pids: list[int]) -> int | None:
    """Summed proportional set size of ``pids`` (None where /proc has no smaps_rollup)."""
    total, seen = 0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024
                        seen = True
                        break
        except OSError:
            continue
    return total if seen else None


class TreeUsage:
    """CPU and peak memory of this process and its descendants over a measured span: ``start()``
    it, ``stop()`` it; then ``cores`` (CPU seconds over wall seconds, None off Linux) and
    ``peak_bytes`` (the highest summed PSS sampled, None off Linux)."""

    def __init__(self):
        self.pid = os.getpid()
        self.cores = self.peak_bytes = None
        self._cpu0 = None
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, now: float) -> None:
        """Begin the span at ``now`` (the caller's clock, perf_counter)."""
        self._t0 = now
        self._cpu0 = cpu_seconds(descendants(self.pid))
        self._thread = threading.Thread(target=self._sample, name="shardpack-usage",
                                        daemon=True)
        self._thread.start()

    def stop(self, now: float) -> None:
        """End the span at ``now``."""
        cpu = cpu_seconds(descendants(self.pid))
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if cpu is not None and self._cpu0 is not None and now > self._t0:
            self.cores = (cpu - self._cpu0) / (now - self._t0)

    def _sample(self) -> None:
        while not self._stop.is_set():
            pss = pss_bytes(descendants(self.pid))
            if pss is not None:
                self.peak_bytes = max(self.peak_bytes or 0, pss)
            self._stop.wait(SAMPLE_S)
