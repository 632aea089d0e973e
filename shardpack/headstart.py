"""Worker 0 first: let DataLoader workers wait for worker 0's first step of an iteration.

The DataLoader hands out worker 0's batch first, but every worker starts its first batch at the
same moment and they share the CPUs (or the link).  A :class:`HeadStart` lets worker 0 signal
"my first step is done" and the others wait for it, never longer than a bound, so the first batch
arrives sooner.  Used by ``CpuDecode``'s head start.

The signal is one anonymous shared 8-byte page, made in the training process before the
DataLoader forks its workers (like ``set_epoch``'s): it has no name and disappears with the last
process holding it.  Spawned workers receive it with the object; a plain copy or pickle of the
object gets a fresh page of its own.  Tokens are (epoch, this process's own iteration count), so
an iteration the training process ran before forking does not count in a worker.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.context import get_spawning_popen

POLL = 0.002  # seconds between looks at the page while waiting


def _page():
    try:
        return multiprocessing.get_context("fork").RawValue("q", -1)
    except ValueError:  # no fork here: workers are spawned and receive the page with the object
        return multiprocessing.RawValue("q", -1)


class HeadStart:
    """``begin(epoch)`` at each iteration start, in the process that iterates; then worker 0
    calls ``done()`` after its first step and the others call ``wait()`` before theirs."""

    def __init__(self, limit: float):
        self.limit = limit  # seconds a worker waits at most
        self._page = _page()
        self._counted = (os.getpid(), 0)  # (process, iterations begun in it)
        self.token = -1

    def begin(self, epoch: int) -> int:
        """Start of an iteration; returns this process's iteration number (1 = its first)."""
        pid, count = self._counted
        count = count + 1 if pid == os.getpid() else 1
        self._counted = (os.getpid(), count)
        self.token = (epoch << 32) + count
        return count

    def done(self) -> None:
        self._page.value = self.token

    def wait(self) -> float:
        """Until worker 0 is done with this iteration's first step, at most ``limit`` seconds;
        returns the seconds waited."""
        start = time.monotonic()
        while self._page.value != self.token and time.monotonic() - start < self.limit:
            time.sleep(POLL)
        return time.monotonic() - start

    def __getstate__(self):
        state = dict(self.__dict__)
        if get_spawning_popen() is None:  # a copy, not a worker being made: a page of its own
            state["_page"] = None
        return state

    def __setstate__(self, state):
        if state["_page"] is None:
            state["_page"] = _page()
        self.__dict__.update(state)
