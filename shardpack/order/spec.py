"""The order of a dataset's epochs as one frozen value: :class:`Order`.

Everything that decides which sample comes where in an epoch, apart from the data and the epoch
number: the algorithm (a block + window shuffle, or the samples in sequence), its seed, the block
and window sizes, shard affinity, and what becomes of an epoch that does not split evenly over
the ranks (``partial``).  ``ShardDataset`` builds one from its arguments and hands it to
:func:`shardpack.order.partition.share`.

Its state form (:meth:`Order.state`) is the part of a saved ``ShardDataset`` state that a resume
must match, with the keys and values states have always had: ``version``, ``seed``, ``shuffle``,
``partial``, ``block_size``, ``shuffle_window``, ``shard_affinity``.  ``version`` is the order
algorithm's: it changes whenever the order of a (seed, epoch) changes (docs/reading.md).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from .state import is_int, same, short

STATE_VERSION = 3  # versions 1 and 2 shuffled from other random draws (unshuffled: the same)
PARTIAL_POLICIES = ("pad", "drop")
ALGORITHMS = ("sequential", "blocks")
# (state key, Order field), in the order a mismatch is reported
STATE_KEYS = (("seed", "seed"), ("shuffle", "shuffle"), ("partial", "partial"),
              ("block_size", "block_size"), ("shuffle_window", "window"),
              ("shard_affinity", "affinity"))


@dataclass(frozen=True)
class Order:
    """How a dataset's epochs are ordered and cut over ranks: a frozen, hashable value.

    Args:
        seed: seeds every random draw of the order (with the epoch, span and window).
        shuffle: True for the block + window shuffle (algorithm ``"blocks"``), False for the
            samples in their stored order (``"sequential"``).
        block_size: consecutive samples of a shard that stay together (shuffled as blocks).
        window: positions shuffled together after the blocks are (the shuffle window).
        affinity: shard affinity: each rank shuffles within its own span of the shuffled shards,
            so a job reads the dataset about once an epoch, not once per rank (docs/scale.md).
        partial: ``"pad"`` (repeat the first samples so every rank gets as many) or ``"drop"``
            (drop the remainder) for an epoch that does not split evenly over the ranks.
    """

    seed: int = 0
    shuffle: bool = True
    block_size: int = 256
    window: int = 4096
    affinity: bool = True
    partial: str = "pad"

    def __post_init__(self):
        if self.partial not in PARTIAL_POLICIES:
            raise ValueError(f"partial must be one of {PARTIAL_POLICIES}, got {self.partial!r}")
        for name in ("seed", "block_size", "window"):
            value = getattr(self, name)
            try:
                if isinstance(value, bool):
                    raise TypeError
                object.__setattr__(self, name, operator.index(value))
            except TypeError:
                raise ValueError(f"{name} must be an integer, got {short(value)}") from None
        object.__setattr__(self, "shuffle", bool(self.shuffle))
        object.__setattr__(self, "affinity", bool(self.affinity))
        if self.shuffle and (self.block_size < 1 or self.window < 1):
            raise ValueError(f"block_size and shuffle_window must be >= 1, got "
                             f"{self.block_size}, {self.window}")

    @property
    def algorithm(self) -> str:
        """``"blocks"`` (the block + window shuffle) or ``"sequential"`` (no shuffle)."""
        return ALGORITHMS[self.shuffle]

    def spans(self, world: int, history=()) -> int:
        """Spans the shuffled shards are cut into: with shard affinity the world size the epoch
        started with (the first resume step's, else ``world``), else 1.

        Args:
            world: ranks reading now.
            history: the epoch's resume steps, ``[(world, samples_seen), ...]``.
        """
        if not self.affinity:
            return 1
        return int(history[0][0]) if len(history) else world

    def state(self) -> dict:
        """The order's part of a saved state: a JSON-safe dict with the keys and values states
        have always had (``version``, ``seed``, ``shuffle``, ``partial``, ``block_size``,
        ``shuffle_window``, ``shard_affinity``)."""
        return {"version": STATE_VERSION,
                **{key: getattr(self, field) for key, field in STATE_KEYS}}

    @classmethod
    def from_state(cls, state: dict) -> "Order":
        """The order a saved state was made with (states from before shard affinity had none:
        False).  A state of another order version is refused (:func:`check_version`).

        Args:
            state: a saved state, or its order part (:meth:`state`).
        """
        check_version(state)
        missing = [key for key, _ in STATE_KEYS[:-1] if key not in state]
        if missing:
            raise ValueError(f"not an order state: it has no {', '.join(map(repr, missing))}")
        return cls(**{field: state.get(key, False) for key, field in STATE_KEYS})

    def check_saved(self, state: dict) -> None:
        """Refuse, in one line, a saved state whose order is not this one: its version first
        (:func:`check_version`), then each setting, named with its saved value.

        Args:
            state: a saved state (any values: they are compared, never trusted).
        """
        check_version(state)
        mine = self.state()
        for key, _ in STATE_KEYS:
            saved = state.get(key, False)  # (states from before shard_affinity: False)
            if not same(saved, mine[key]):
                raise ValueError(f"state was saved with {key}={short(saved)}, this dataset has "
                                 f"{mine[key]!r}: resume needs the same dataset and order "
                                 "settings" + (f" (pass shard_affinity={short(saved)})"
                                               if key == "shard_affinity" else ""))


def saved_unshuffled(state: dict) -> bool:
    """Whether a saved state's epochs were unshuffled (a value of another type: False, refused
    later by :meth:`Order.check_saved`).

    Args:
        state: a saved state.
    """
    shuffle = state.get("shuffle")
    return (shuffle is None or isinstance(shuffle, bool) or is_int(shuffle)) and not shuffle


def check_version(state: dict) -> None:
    """Refuse a state of another order version: versions 1 and 2 shuffled blocks and windows
    from other random draws (3: one key per span and window, so a process computes its own
    share alone), so they load only for unshuffled epochs, which are the same in all of them.

    Args:
        state: a saved state.
    """
    version = state.get("version")
    old = is_int(version) and version in (1, 2)
    if same(version, STATE_VERSION) or (old and saved_unshuffled(state)):
        return
    why = ("states of order versions 1 and 2 resume only unshuffled epochs: do not load this "
           "one; start the epoch from its beginning, or finish it with the shardpack that saved "
           "it") if old else "saved by another shardpack (or not a ShardDataset state)"
    raise ValueError(f"unsupported state version: expected {STATE_VERSION}, found "
                     f"{short(version)}: {why}")
