"""``shardpack.ShardNode``: the dataset as a ``torchdata.nodes`` node, for users of that API.

``torchdata.nodes.Loader(ShardNode(path, ...))`` iterates it, and its ``state_dict()`` /
``load_state_dict()`` resume mid-epoch.  The node is a thin adapter: a
:class:`~shardpack.ShardDataset` made with the same arguments does the work, on worker threads
by default (no DataLoader starts worker processes around a node).
"""

from __future__ import annotations

try:
    from torchdata.nodes import BaseNode
except ImportError:  # torchdata is optional: the node says what it needs when made
    BaseNode = None

from shardpack.loader.dataset import ShardDataset

__all__ = ["ShardNode"]


class _NoBase:
    def __init__(self, *args, **kwargs):
        raise ImportError("shardpack.ShardNode needs torchdata >= 0.10 (torchdata.nodes): "
                          "pip install 'torchdata>=0.10'")


class ShardNode(BaseNode or _NoBase):
    """A packed dataset as a ``torchdata.nodes.BaseNode``: one item per ``next`` (a batch with
    ``batched=True``), passes that follow ``set_epoch`` (else one more each reset), and a state
    (``{"dataset": ds.state_dict()}``) that resumes mid-epoch, also with another world size
    when it was saved by the default thread execution.

    Args:
        path: the dataset (as for :class:`~shardpack.ShardDataset`).
        execution: as for ShardDataset, but ``"threads"`` by default.
        **kwargs: every other :class:`~shardpack.ShardDataset` argument.
    """

    def __init__(self, path, *, execution: str = "threads", **kwargs):
        super().__init__()
        self.dataset = ShardDataset(path, execution=execution, **kwargs)
        self._items = None

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` from the next reset on.

        Args:
            epoch: the epoch.
        """
        self.dataset.set_epoch(epoch)

    def reset(self, initial_state: dict | None = None) -> None:
        """Start a pass: from ``initial_state`` (what :meth:`get_state` returned), else the next
        epoch's start.

        Args:
            initial_state: a saved state, or None.
        """
        super().reset(initial_state)
        if self._items is not None:
            self._items.close()
        if initial_state is not None:
            self.dataset.load_state_dict(initial_state["dataset"])
        self._items = iter(self.dataset)

    def next(self):
        """The next item of the pass (StopIteration at its end)."""
        return next(self._items)

    def get_state(self) -> dict:
        """Where the pass stands: the dataset's state after the items handed out."""
        return {"dataset": self.dataset.state_dict()}

    def stats(self) -> dict:
        """The dataset's per-stage table (:meth:`ShardDataset.stats`)."""
        return self.dataset.stats()
