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

import inspect
import time
import weakref
from typing import Callable

from shardpack.loader.counters import FLUSH_S, Counts, StageTable

DATASET_STAGES = ("order", "read", "decode", "transform")
_clock = time.perf_counter


class Samples(list):
    """A part's samples, read sample by sample: one item of the stages, so that a sample costs
    them nothing; the chain's end hands them out one by one (:class:`Outlet`).

    Args:
        start: the share's position before the part.
        end: the share's position after it (skipped samples included).
    """

    def __init__(self, start: int, end: int, samples=(), positions=None):
        super().__init__(samples)
        self.start, self.end = start, end
        self.positions: list[int] = [] if positions is None else positions  # after each

    def mapped(self, fn: Callable) -> "Samples":
        """``fn`` applied to each sample, the positions kept."""
        return Samples(self.start, self.end, map(fn, self), self.positions)


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
        start = _clock()
        try:
            return next(self.source)
        finally:
            self._waited += _clock() - start

    def __iter__(self):
        return self

    def __next__(self):
        start = _clock()
        self._waited = 0.0
        item = self.step()
        counts = self.counts
        counts.items += 1
        counts.wait_in += self._waited
        counts.busy += _clock() - start - self._waited
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
        if self.fn is None:
            return item
        return item.mapped(self.fn) if isinstance(item, Samples) else self.fn(item)


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
        """The items, a part's :class:`Samples` one by one, the chain's position moving with
        each (what a worker-level state reads)."""
        last, position = self.last, getattr(self.stages[0], "position", None)
        counts = last.counts
        while True:
            try:
                item = next(last)
            except StopIteration:
                return
            if isinstance(item, Samples):
                for sample, after in zip(item, item.positions, strict=True):
                    position.yielded.value = after
                    left = _clock()
                    yield sample
                    counts.wait_out += _clock() - left
                position.yielded.value = item.end  # (skipped samples at its end too)
            else:
                left = _clock()
                yield item
                counts.wait_out += _clock() - left
            if _clock() - self._flushed >= FLUSH_S:
                self.flush()

    def parts(self):
        """``(item, positions)``: each item whole (a part's :class:`Samples` as one) with how
        far it moved the share's position, skipped samples included: what a worker thread
        hands over."""
        last, position = self.last, getattr(self.stages[0], "position", None)
        while True:
            before = position.yielded.value if position is not None else 0
            try:
                item = next(last)
            except StopIteration:
                return
            left = _clock()
            yield item, (position.yielded.value - before if position is not None else 1)
            last.counts.wait_out += _clock() - left
            if _clock() - self._flushed >= FLUSH_S:
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
        # An owner's bound method is held weakly: owner -> stats -> method -> owner is a cycle,
        # and a loader in a cycle outlives ``del`` until a garbage collection, which then shuts
        # its persistent DataLoader workers down in whatever thread it runs in, after the
        # queues' feeder threads were finalised: each worker waits out torch's 5 s join
        # (docs/reading.md, "Letting a loader go").
        self._table = weakref.WeakMethod(table) if inspect.ismethod(table) else table

    def __call__(self) -> dict[str, dict[str, float]]:
        """Stage name -> its counters summed over workers, up to the last flush."""
        table = self._table
        if isinstance(table, weakref.WeakMethod):
            method = table()
            return method() if method is not None else {}
        return table() if callable(table) else table.totals()

    def reset_stages(self) -> None:
        """Zero the per-stage counters (the named counts stay)."""
        if hasattr(self._table, "reset"):
            self._table.reset()
