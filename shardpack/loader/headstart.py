"""Worker 0 first: let DataLoader workers wait for worker 0's first step of an iteration.

The DataLoader hands out worker 0's batch first, but every worker starts its first batch at the
same moment and they share the CPUs (or the link).  A :class:`HeadStart` lets worker 0 signal
"my first step is done" and the others wait for it, never longer than a bound, so the first batch
arrives sooner.  Used by ``CpuDecode``'s head start.

The signal is one anonymous shared 8-byte page (:class:`~shardpack.loader.shared.SharedInt`, as for
``set_epoch``): workers receive it with the object; a plain copy or pickle of the object gets a
fresh page of its own.  Tokens are (epoch, this process's own iteration count), so
an iteration the training process ran before forking does not count in a worker.
"""

from __future__ import annotations

import os
import time

from shardpack.loader.shared import SharedInt

POLL = 0.002  # seconds between looks at the page while waiting


class HeadStart:
    """``begin(epoch)`` at each iteration start, in the process that iterates; then worker 0
    calls ``done()`` after its first step and the others call ``wait()`` before theirs."""

    def __init__(self, limit: float):
        self.limit = limit  # seconds a worker waits at most
        self._page = SharedInt(-1, keep_value=False)  # a copy waits for a signal of its own
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
        """Worker 0's first step of this iteration is done: the waiting workers may go."""
        self._page.value = self.token

    def __getstate__(self):  # a copy waits for a signal of its own (NOTE in shared.py)
        return {**self.__dict__, "_page": self._page.carried()}

    def wait(self) -> float:
        """Until worker 0 is done with this iteration's first step, at most ``limit`` seconds;
        returns the seconds waited."""
        start = time.monotonic()
        while self._page.value != self.token and time.monotonic() - start < self.limit:
            time.sleep(POLL)
        return time.monotonic() - start


