"""Who runs a dataset's pipeline: the process that iterates it (itself, or each DataLoader worker
process), or a pool of threads in the training process.  Chosen once, when the dataset is made
(``ShardDataset(execution=...)``); the stages never know which.

With threads, worker ``i`` of ``N`` reads exactly what DataLoader worker ``i`` of ``N`` would, and
the items are handed out round-robin by parts of a batch, as the DataLoader hands out its
workers' batches: the same
samples, in the same order, with the same crops (docs/reading.md, "Threads or processes").
"""

from __future__ import annotations

import os
import threading
from collections import deque

from shardpack.loader.pipeline import Samples
from shardpack.loader.position import Counter, Position
from shardpack.loader.runtime import Runtime, current, running_as

EXECUTIONS = ("processes", "threads")
RANK_WIDE = -1   # a Position's worker when it counts what a thread execution handed out
POLL_S = 0.1     # how often a blocked worker thread looks for the consumer having stopped


class ProcessExecution:
    """The pipeline runs in whichever process iterates the dataset: the training process, or
    each DataLoader worker process (``DataLoader(num_workers=N)``)."""

    name = "processes"
    threads = 0

    def run(self, dataset):
        """One pass, in this process."""
        return dataset.run_pipeline()


class ThreadExecution:
    """The pipeline runs on ``workers`` threads of the training process: no fork, no pickling,
    one copy of the indexes; items are handed out round-robin.

    Args:
        workers: the worker threads (None: one per CPU this process may use).
    """

    name = "threads"

    def __init__(self, workers: int | None):
        if workers is None:
            workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
                (os.cpu_count() or 1)
        self.threads = workers

    def run(self, dataset):
        """One pass on the worker threads, items in round-robin order.  The pass opens here
        (its state is the new pass's from now on); the threads start at the first item."""
        if current().forked:
            raise ValueError("execution='threads' runs its own worker threads: iterate the "
                             "dataset directly, or through DataLoader(ds, batch_size=None, "
                             "num_workers=0)")
        dataset.reader.revalidate()  # once for all workers (each worker's would race)
        opened = dataset.open_pass()
        where = dataset.placement_now()
        consumed = Counter(0)
        dataset.mark_running(Position(opened.epoch, opened.history, where.world, where.rank,
                                      self.threads, RANK_WIDE, consumed))
        return self._run(dataset, opened, consumed)

    def _run(self, dataset, opened, consumed: Counter):
        stop = threading.Event()
        queues = [Handoff() for _ in range(self.threads)]
        workers = [threading.Thread(target=_work, name=f"shardpack-worker-{i}", daemon=True,
                                    args=(dataset, opened, Runtime(
                                        i, self.threads, thread=True, dataset=dataset),
                                        queues[i], stop))
                   for i in range(self.threads)]
        for worker in workers:
            worker.start()
        turns = deque(range(self.threads))
        try:
            while turns:
                i = turns.popleft()
                kind, item, moved = queues[i].get()
                if kind == "end":
                    continue
                if kind == "error":
                    raise item
                turns.append(i)
                if isinstance(item, Samples):  # a part's samples, one by one
                    before = item.start
                    for sample, after in zip(item, item.positions, strict=True):
                        consumed.value += after - before
                        before = after
                        yield sample
                    consumed.value += item.end - before
                else:
                    consumed.value += moved
                    yield item
        finally:
            stop.set()
            for i, worker in enumerate(workers):
                while worker.is_alive():  # unblock a worker waiting for its item to be taken
                    queues[i].drop()
                    worker.join(POLL_S)


def _work(dataset, opened, runtime: Runtime, out: "Handoff", stop: threading.Event) -> None:
    """A worker thread: its pipeline's items into ``out``, then ("end", None), or
    ("error", exc) on any failure (the consumer raises it)."""
    with running_as(runtime):
        items = dataset.run_pipeline(opened, parts=True)
        try:
            for item, moved in items:
                if not _put(out, ("item", item, moved), stop):
                    return
            _put(out, ("end", None, 0), stop)
        except BaseException as exc:  # hand every failure to the consumer, never hang
            _put(out, ("error", exc, 0), stop)
        finally:
            items.close()


def _put(out: "Handoff", entry, stop: threading.Event) -> bool:
    """Hand ``entry`` over; False if the consumer stopped first."""
    return out.put(entry, stop)


class Handoff:
    """One item at a time from a worker thread to the consumer: ``put`` returns once the
    consumer has taken it, so a worker holds at most one item, made or in the making.  The
    DataLoader keeps two per worker process in flight besides the one being made
    (``prefetch_factor``); memory is what threads are chosen for, and the DeviceLoader's own
    prefetch keeps the device fed."""

    def __init__(self):
        self._cond = threading.Condition()
        self._entry, self._full = None, False

    def put(self, entry, stop: threading.Event) -> bool:
        """Offer ``entry`` and wait until it is taken (True) or ``stop`` is set (False)."""
        with self._cond:
            self._entry, self._full = entry, True
            self._cond.notify_all()
            while self._full and not stop.is_set():
                self._cond.wait(POLL_S)
            return not self._full

    def get(self):
        """The next entry, waiting for it."""
        with self._cond:
            while not self._full:
                self._cond.wait()
            entry, self._entry, self._full = self._entry, None, False
            self._cond.notify_all()
            return entry

    def drop(self) -> None:
        """Throw away an entry not taken (the consumer stopped)."""
        with self._cond:
            self._entry, self._full = None, False
            self._cond.notify_all()


def execution_of(execution: str, workers: int | None):
    """The execution named ``execution``, refusing what does not fit in one line.

    Args:
        execution: ``"processes"`` or ``"threads"``.
        workers: worker threads for ``"threads"`` (None: one per CPU).
    """
    if execution not in EXECUTIONS:
        raise ValueError(f"execution must be one of {EXECUTIONS}, got {execution!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if execution == "processes":
        if workers is not None:
            raise ValueError("workers= is for execution='threads'; with processes the "
                             "DataLoader's num_workers says how many")
        return ProcessExecution()
    return ThreadExecution(workers)
