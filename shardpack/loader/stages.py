"""Stages that follow the epoch, as protocols rather than attribute tests.

A ``ShardDataset``'s ``decode`` and ``transform`` stages run in whichever process iterates (a
DataLoader worker, usually).  One whose output depends on the epoch (random crops) is
:class:`EpochAware`: the dataset calls its ``begin(epoch)`` when an iteration starts, in that
process.  :class:`EpochStage` is the small base that keeps the epoch for a stage.  Something that
takes ``set_epoch`` (a ``ShardDataset``, a sampler) is :class:`EpochSettable`: ``DeviceLoader``
passes its ``set_epoch`` on to its loader's dataset when it is one.
"""

from __future__ import annotations

import warnings
from typing import Protocol, runtime_checkable


@runtime_checkable
class EpochAware(Protocol):
    """A stage told the epoch at each iteration start (``ShardDataset`` calls ``begin``)."""

    def begin(self, epoch: int) -> None:
        """An iteration of ``epoch`` starts, in this process.

        Args:
            epoch: the epoch the iteration reads.
        """


@runtime_checkable
class EpochSettable(Protocol):
    """Something whose epoch is set from outside, as PyTorch's samplers' is: a ``ShardDataset``."""

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` from the next iteration on.

        Args:
            epoch: the epoch.
        """


@runtime_checkable
class _HasEpoch(Protocol):
    """The older form of an epoch-aware stage: an ``epoch`` attribute, set from outside."""

    epoch: int


class EpochStage:
    """Base of a stage that keeps the epoch of the iteration running: ``self.epoch``, set by
    :meth:`begin` (0 until an iteration starts)."""

    epoch: int = 0

    def begin(self, epoch: int) -> None:
        """Keep ``epoch`` as ``self.epoch``.

        Args:
            epoch: the epoch the iteration reads.
        """
        self.epoch = epoch


def tell_epoch(stage, epoch: int) -> None:
    """Tell ``stage`` (a decode or transform stage, or None) that an iteration of ``epoch``
    starts.  A stage that only has an ``epoch`` attribute (the older form) still gets it set,
    with a DeprecationWarning.

    Args:
        stage: the stage.
        epoch: the epoch the iteration reads.
    """
    if isinstance(stage, EpochAware):
        stage.begin(epoch)
    elif isinstance(stage, _HasEpoch):
        warnings.warn(f"{type(stage).__name__}: a stage told the epoch through its 'epoch' "
                      "attribute is deprecated; give it a begin(epoch) method (or derive it "
                      "from shardpack.loader.stages.EpochStage)", DeprecationWarning,
                      stacklevel=3)
        stage.epoch = epoch
