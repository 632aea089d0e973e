"""The one place that imports torch, and the one function that says where this process sits.

Everything torch-related in shardpack imports from here, so the packer and the CLI never pay for
importing torch, and rank/worker discovery has exactly one definition.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__ = ["DataLoader", "IterableDataset", "Placement", "dist", "get_worker_info", "placement",
           "settle_worker", "torch"]


@dataclass(frozen=True)
class Placement:
    """Where a process reads from: DDP rank and world size, DataLoader worker id and count."""

    rank: int
    world: int
    worker: int
    num_workers: int


def placement(rank: int | None = None, world: int | None = None) -> Placement:
    """Where this process reads from: DDP rank and world (explicit arguments, else
    ``torch.distributed`` when initialised, else the RANK / WORLD_SIZE variables that torchrun
    sets, else 0 / 1), and DataLoader worker id and count (0 / 1 outside workers)."""
    if rank is None or world is None:
        if dist.is_available() and dist.is_initialized():
            found = dist.get_rank(), dist.get_world_size()
        else:
            found = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = found[0] if rank is None else rank
        world = found[1] if world is None else world
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    info = get_worker_info()
    worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return Placement(rank, world, worker, num_workers)


_settled_pid = None  # the worker process already settled (a fork of it is another process)


def settle_worker() -> None:
    """Once per DataLoader worker process: move every object it inherited from the training
    process out of the garbage collector's reach (``gc.freeze``).  A forked worker shares the
    parent's heap; its first full collection walks all of it (torch's included), touching every
    page and so copying it: 150 ms a worker here, twice an epoch of 100,000 tiny samples
    (docs/reading.md, "Garbage collection in workers").  Objects the worker makes later are
    collected as usual."""
    global _settled_pid
    if get_worker_info() is None or _settled_pid == os.getpid():
        return
    _settled_pid = os.getpid()
    gc.freeze()
