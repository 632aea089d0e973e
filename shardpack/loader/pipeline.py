"""The read side as a chain of small stateful stages, each timed.

A stage is an iterator over its items with a tiny state contract, in the spirit of torchdata's
``BaseNode``: ``reset(state)`` starts (or resumes) it, ``state()`` says where it stands, and the
stage pulls its input from the stage before it (:meth:`Stage.pull`).  Each keeps
:class:`~shardpack.loader.counters.Counts`: items made, seconds busy, seconds waiting on its input
and on its output.  Which thread or process runs a chain is the execution's business
(:mod:`shardpack.loader.threads`, or a DataLoader worker); the stages do not know.

The dataset's chain (docs/reading.md, "The pipeline"):
order (:class:`~shardpack.loader.readstages.OrderStage`) -> read
(:class:`~shardpack.loader.readstages.ReadStage`) -> decode -> transform (:class:`MapStage`),
then, in :class:`~shardpack.DeviceLoader`, pin -> device.
"""

from __future__ import annotations

import time
from typing import Callable

from shardpack.loader.counters import FLUSH_S, Counts, StageTable

DATASET_STAGES = ("order", "read", "decode", "transform")


class Stage:
    """One stage: ``reset(state)``, ``state()``, ``next()``; counted in :attr:`counts`.

    Subclasses implement :meth:`step` (make one item, pulling input with :meth:`pull`).  A stage
    that holds nothing between items keeps the state of its input: its ``state()`` is its
    source's, and its ``reset`` resets its source.

    Args:
        source: the stage before this one (None for the first).
    """

    name = "stage"

    def __init__(self, source: "Stage | None" = None):
        self.source = source
        self.counts = Counts()
        self._waited = 0.0

    def reset(self, state: dict | None = None) -> None:
        """Start from ``state`` (None: from the start of what the source gives).

        Args:
            state: what :meth:`state` returned, in this or another process.
        """
        if self.source is not None:
            self.source.reset(state)

    def state(self) -> dict:
        """Where this stage stands: enough for :meth:`reset` to go on with the next item."""
        return self.source.state() if self.source is not None else {}

    def step(self):
        """One item (StopIteration at the end)."""
        raise NotImplementedError

    def pull(self):
        """The source's next item; the time it takes is this stage's wait on its input."""
        start = time.perf_counter()
        try:
            return next(self.source)
        finally:
            self._waited += time.perf_counter() - start

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        self._waited = 0.0
        item = self.step()
        counts = self.counts
        counts.items += 1
        counts.wait_in += self._waited
        counts.busy += time.perf_counter() - start - self._waited
        return item

    def close(self) -> None:
        """Let go of what the stage holds (threads, fetches); its sources too."""
        if self.source is not None:
            self.source.close()

    def chain(self) -> list["Stage"]:
        """This stage and every stage before it, first first."""
        return (self.source.chain() if self.source is not None else []) + [self]


class MapStage(Stage):
    """A stage that applies ``fn`` to each item of its source: decode, transform.

    Args:
        name: the stage's name in the counters.
        fn: the callable (None: items pass through, still counted).
        source: the stage before.
    """

    def __init__(self, name: str, fn: Callable | None, source: Stage):
        super().__init__(source)
        self.name, self.fn = name, fn

    def step(self):
        """The source's next item, with ``fn`` applied."""
        item = self.pull()
        return item if self.fn is None else self.fn(item)


class Outlet:
    """The end of a chain, where its items leave for the consumer: times how long the chain
    stood still between items (the consumer's time: its wait on its output) and hands every
    stage's counts to the table every :data:`~shardpack.loader.counters.FLUSH_S` seconds.

    Args:
        last: the chain's last stage.
        table: where counts go (None: nowhere).
        worker: the row to write.
    """

    def __init__(self, last: Stage, table: StageTable | None, worker: int):
        self.last, self.table, self.worker = last, table, worker
        self.stages = last.chain()
        self._flushed = time.perf_counter()

    def __iter__(self):
        return (item for item, _, _ in self.moves())

    def moves(self):
        """``(item, positions, whole)``: each item with how far it moved the chain's position
        (the samples of the share it stands for, skipped ones included) and whether the part
        of a batch the first stage handed out is now done."""
        last, first = self.last, self.stages[0]
        position = getattr(first, "position", None)
        while True:
            before = position.yielded.value if position is not None else 0
            try:
                item = next(last)
            except StopIteration:
                return
            if position is None:
                moved, whole = 1, True
            else:
                moved = position.yielded.value - before
                whole = position.yielded.value >= first.handed_out
            left = time.perf_counter()
            yield item, moved, whole
            back = time.perf_counter()
            last.counts.wait_out += back - left
            if back - self._flushed >= FLUSH_S:
                self.flush()

    def flush(self) -> None:
        """Every stage's counts into the table."""
        self._flushed = time.perf_counter()
        if self.table is None:
            return
        for stage in self.stages:
            if stage.name in self.table.stages:
                self.table.add(self.worker, stage.name, stage.counts)


class Stats(dict):
    """A dataset's (or loader's) counts by name, as ever (``stats["skipped"]``); called,
    ``stats()`` is the per-stage table: stage name -> ``{"items", "busy_s", "wait_in_s",
    "wait_out_s"}`` summed over workers.

    Args:
        table: the stage table (or a callable returning the mapping).
        counts: the counts by name.
    """

    def __init__(self, table, counts: dict):
        super().__init__(counts)
        self._table = table

    def __call__(self) -> dict[str, dict[str, float]]:
        """Stage name -> its counters summed over workers, up to the last flush."""
        table = self._table
        return table() if callable(table) else table.totals()

    def reset_stages(self) -> None:
        """Zero the per-stage counters (the named counts stay)."""
        if hasattr(self._table, "reset"):
            self._table.reset()
