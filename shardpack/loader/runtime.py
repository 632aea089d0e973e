"""Where a read pipeline runs: the one object that says which worker this is, whether its batches
cross to another process, and whether it runs in a forked DataLoader worker.

The stages never ask PyTorch (or a thread) where they are; they ask :func:`current`.  A
DataLoader worker process answers from ``get_worker_info()``; a worker thread of
``ShardDataset(execution="threads")`` runs inside :func:`running_as`, which sets its answer for
that thread only; anything else is the training process itself, worker 0 of 1.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from dataclasses import dataclass, field

from shardpack.loader.torchenv import dist, get_worker_info


@dataclass(frozen=True)
class Runtime:
    """Where a pipeline runs.

    Attributes:
        worker: this worker's number (0 outside workers).
        num_workers: the workers reading this rank's share together (1 outside workers).
        shared: the batches made here cross to another process (a DataLoader worker process):
            large buffers go into memory that crosses cheaply.
        forked: this is a DataLoader worker process (it inherited the trainer's heap).
        thread: this is a worker thread of a thread execution (it shares the trainer's memory
            with the other workers).
        dataset: the dataset the worker reads, where known (errors name its shards).
    """

    worker: int = 0
    num_workers: int = 1
    shared: bool = False
    forked: bool = False
    thread: bool = False
    dataset: object = field(default=None, compare=False, repr=False)


MAIN = Runtime()
_local = threading.local()


def current() -> Runtime:
    """Where the calling thread's pipeline runs."""
    mine = getattr(_local, "runtime", None)
    if mine is not None:
        return mine
    info = get_worker_info()
    if info is None:
        return MAIN
    return Runtime(info.id, info.num_workers, shared=True, forked=True,
                   dataset=getattr(info, "dataset", None))


@contextlib.contextmanager
def running_as(runtime: Runtime):
    """Run the calling thread's pipeline as ``runtime`` (a worker thread of a thread
    execution) until the block ends.

    Args:
        runtime: what :func:`current` answers in this thread meanwhile.
    """
    before = getattr(_local, "runtime", None)
    _local.runtime = runtime
    try:
        yield runtime
    finally:
        _local.runtime = before


@dataclass(frozen=True)
class Placement:
    """Where a pipeline reads from: DDP rank and world size, worker number and count."""

    rank: int
    world: int
    worker: int
    num_workers: int


def placement(rank: int | None = None, world: int | None = None) -> Placement:
    """Where this pipeline reads from: DDP rank and world (explicit arguments, else
    ``torch.distributed`` when initialised, else the RANK / WORLD_SIZE variables that torchrun
    sets, else 0 / 1), and the worker number and count of :func:`current`."""
    if rank is None or world is None:
        if dist.is_available() and dist.is_initialized():
            found = dist.get_rank(), dist.get_world_size()
        else:
            found = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = found[0] if rank is None else rank
        world = found[1] if world is None else world
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    here = current()
    return Placement(rank, world, here.worker, here.num_workers)


_settled_pid = None  # the worker process already settled (a fork of it is another process)


def settle_worker() -> None:
    """Once per DataLoader worker process: move every object it inherited from the training
    process out of the garbage collector's reach (``gc.freeze``).  A forked worker shares the
    parent's heap; its first full collection walks all of it (torch's included), touching every
    page and so copying it: 150 ms a worker here, twice an epoch of 100,000 tiny samples
    (docs/reading.md, "Garbage collection in workers").  Objects the worker makes later are
    collected as usual.  Worker threads share the trainer's heap and need nothing."""
    global _settled_pid
    if not current().forked or _settled_pid == os.getpid():
        return
    _settled_pid = os.getpid()
    gc.freeze()
