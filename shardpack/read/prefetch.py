"""Fetching ahead: a background fetcher of the units a reader will need next (whole shards into
the cache, or chunks into memory: shardpack/read/access.py says which), and a do-nothing one for
data that needs no fetching (local files, ``prefetch=0``).

The contract with the reading loop: the units are distinct and in order of first need, each with
the first reading position that needs it; the loop reports the position it is about to read
(``reading``), and the fetcher keeps everything needed up to ``ahead`` positions past it, plus
``depth`` units more, fetched or on the way.  It never raises: a unit that failed is fetched
again by the reading thread when it gets there, which reports the error with the usual message.
"""

from __future__ import annotations

import threading

import numpy as np


class NoPrefetch:
    """Nothing to fetch ahead."""

    started = False

    def reading(self, end: int) -> None:
        """Nothing to do.

        Args:
            end: the position the reader reads up to.
        """

    def at(self, position: int) -> None:
        """Nothing to do.

        Args:
            position: the units the reader needs now.
        """

    def close(self) -> None:
        """Nothing to do."""


NOTHING = NoPrefetch()  # stateless: one will do for every caller


class Prefetcher:
    """Fetches ``units`` in order in background threads (``reader.warm(unit)``): every unit the
    reader needs up to ``ahead`` positions past the one it reports with :meth:`reading`, and
    ``depth`` units beyond.  ``needs``: the first position needing each unit."""

    def __init__(self, reader, units: list, needs, depth: int, ahead: int = 0):
        self.reader, self.units, self.depth, self.ahead = reader, units, depth, ahead
        self.needs = np.asarray(needs, dtype=np.int64)
        self.position = 0  # units needed so far
        self._cond = threading.Condition()
        self._stop = False
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                          name=f"shardpack-fetch-{i}")
                         for i in range(min(depth, 4))]
        self._next = 0
        self._started = False  # the threads start with the first position reported

    @property
    def started(self) -> bool:
        """Whether the fetching threads have started (at the first position reported)."""
        return self._started

    def reading(self, end: int) -> None:
        """The reader is about to read positions before ``end``."""
        self.at(int(np.searchsorted(self.needs, end + self.ahead, side="left")))

    def at(self, position: int) -> None:
        """The reader needs the first ``position`` units now."""
        with self._cond:
            if position > self.position:
                self.position = position
                self._cond.notify_all()
            if not self._started:
                self._started = True
                for t in self._threads:
                    t.start()

    def _run(self, _: int) -> None:
        while True:
            with self._cond:
                while not self._stop and self._next < len(self.units) and \
                        self._next >= self.position + self.depth:
                    self._cond.wait()
                if self._stop or self._next >= len(self.units):
                    return
                unit = self.units[self._next]
                self._next += 1
            try:
                self.reader.warm(unit)
            except Exception:  # noqa: BLE001 - the reading thread reports it
                pass

    def close(self) -> None:
        """Stop fetching: the threads end after the unit each is fetching."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
