"""Where one process's iteration of an epoch is: what ``ShardDataset.state_dict()`` reads inside
the iterating process (``StatefulDataLoader``'s per-worker states)."""

from __future__ import annotations

import dataclasses


class Counter:
    """A count that a frozen :class:`Position` carries and the reading loop moves on."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0):
        self.value = value


@dataclasses.dataclass(frozen=True)
class Position:
    """Where this process's iteration is: the epoch, its resume history, the placement (rank
    and DataLoader worker), and how many of its share's samples it has yielded (the one part
    that moves, a :class:`Counter`).  ``state_dict()`` reads it."""

    epoch: int
    history: tuple
    world: int
    rank: int
    num_workers: int
    worker: int
    yielded: Counter
