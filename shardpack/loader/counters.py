"""Counters of a read pipeline's stages, cheap enough to leave on, readable from the training
process whatever runs the stages.

Each stage keeps four numbers in plain Python floats while it works (``items``, ``busy_s``,
``wait_in_s``, ``wait_out_s``) and hands them to a :class:`StageTable` now and then
(:data:`FLUSH_S`).  The table is one anonymous shared page of float64s, made in the training
process before any worker starts (NOTE [fork-shared pages] in shardpack/loader/shared.py): one row
per worker, each written by its own worker only, so no lock is needed; the training process sums
the rows.  A worker thread writes its row directly; a forked worker process writes the same page.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen

import numpy as np

FIELDS = ("items", "busy_s", "wait_in_s", "wait_out_s")
ROWS = 256     # worker rows; worker w writes row w % ROWS
FLUSH_S = 0.1  # seconds between a pipeline's hand-overs to its table (and at its end)


class Counts:
    """One stage's counters since its last flush, in Python floats (a few ns to add to)."""

    __slots__ = ("items", "busy", "wait_in", "wait_out")

    def __init__(self):
        self.items = 0
        self.busy = self.wait_in = self.wait_out = 0.0

    def as_dict(self) -> dict:
        """The counts as ``{"items", "busy_s", "wait_in_s", "wait_out_s"}`` (kept here)."""
        return dict(zip(FIELDS, (self.items, self.busy, self.wait_in, self.wait_out),
                        strict=True))

    def take(self) -> tuple[float, float, float, float]:
        """The counts, zeroed here."""
        out = (self.items, self.busy, self.wait_in, self.wait_out)
        self.items = 0
        self.busy = self.wait_in = self.wait_out = 0.0
        return out


class StageTable:
    """Per-stage counters of every worker of a dataset, summed on demand.

    Args:
        stages: the stage names, in pipeline order.
    """

    def __init__(self, stages: tuple[str, ...]):
        self.stages = tuple(stages)
        self._page = _page(ROWS * len(self.stages) * len(FIELDS))

    def _array(self) -> np.ndarray:
        return np.frombuffer(self._page, dtype=np.float64).reshape(
            ROWS, len(self.stages), len(FIELDS))

    def add(self, worker: int, stage: str, counts: Counts) -> None:
        """Add ``counts`` (zeroing them) to ``stage``'s row of ``worker``.

        Args:
            worker: the worker's number.
            stage: the stage's name (one of :attr:`stages`).
            counts: its counts since the last add.
        """
        values = counts.take()
        if values[0] or values[1] or values[2] or values[3]:
            row = self._array()[worker % ROWS, self.stages.index(stage)]
            row += values

    def totals(self) -> dict[str, dict[str, float]]:
        """Stage name -> ``{"items", "busy_s", "wait_in_s", "wait_out_s"}`` summed over the
        workers (items as an int)."""
        sums = self._array().sum(axis=0)
        out = {}
        for name, row in zip(self.stages, sums.tolist(), strict=True):
            counts = dict(zip(FIELDS, row, strict=True))
            counts["items"] = int(counts["items"])
            out[name] = counts
        return out

    def reset(self) -> None:
        """Zero every counter (a worker's flush in flight may still land after it)."""
        self._array()[:] = 0

    def __getstate__(self):
        if get_spawning_popen() is not None:  # a worker being started: the page itself
            return (self.stages, self._page)
        return (self.stages, bytes(memoryview(self._page).cast("B")))

    def __setstate__(self, state) -> None:
        self.stages, page = state
        if isinstance(page, bytes):  # any other copy: a page of its own, with the values
            fresh = _page(len(page) // 8)
            memoryview(fresh).cast("B")[:] = page
            page = fresh
        self._page = page


def _page(count: int):
    try:
        return multiprocessing.get_context("fork").RawArray("d", count)
    except ValueError:  # no fork here: workers are spawned and receive the page with the object
        return multiprocessing.RawArray("d", count)
