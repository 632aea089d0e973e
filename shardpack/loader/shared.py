"""One integer shared by a process and the DataLoader workers it starts.

NOTE [fork-shared pages]: ``set_epoch`` (shardpack/loader/dataset.py) and the head start
(shardpack/loader/headstart.py) signal workers through an anonymous shared 8-byte page, made in the
training process before the DataLoader starts its workers.  It has no name, so nothing of it
outlives the processes holding it (no file in /dev/shm after a crash).  Sent to a worker being
started (fork or spawn: ``get_spawning_popen`` is set), the page itself travels; any other
pickle (``copy.deepcopy``, a state saved to disk) carries a snapshot, and the copy gets a page of
its own, with that value (``keep_value``) or the initial one.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import get_spawning_popen


class SharedInt:
    """An int64 in an anonymous shared page: the process that made it and the DataLoader
    workers it starts see one value (NOTE above); any other copy gets a page of its own.

    Args:
        value: the initial value.
        keep_value: whether a copy starts from the current value (True) or the initial one.
    """

    __slots__ = ("initial", "keep_value", "_page")

    def __init__(self, value: int = -1, *, keep_value: bool = True):
        self.initial, self.keep_value = value, keep_value
        self._page = _page(value)

    @property
    def value(self) -> int:
        """The shared value (set: every process sharing the page sees it)."""
        return int(self._page.value)

    @value.setter
    def value(self, value: int) -> None:
        """Set the shared value."""
        self._page.value = value

    def carried(self) -> "SharedInt":
        """What an object holding this page hands to its ``__getstate__``: the page itself for a
        worker being started, a page of its own for any other copy (``copy.copy`` included,
        which does not pickle what the state holds)."""
        if get_spawning_popen() is not None:
            return self
        copy = SharedInt.__new__(SharedInt)
        copy.__setstate__(self.__getstate__())
        return copy

    def __getstate__(self):
        if get_spawning_popen() is not None:  # a worker being started: the page itself
            return (self.initial, self.keep_value, self._page)
        return (self.initial, self.keep_value, self.value if self.keep_value else self.initial)

    def __setstate__(self, state) -> None:
        self.initial, self.keep_value, page = state
        self._page = page if not isinstance(page, int) else _page(page)


def _page(value: int):
    try:
        return multiprocessing.get_context("fork").RawValue("q", value)
    except ValueError:  # no fork here: workers are spawned and receive the page with the object
        return multiprocessing.RawValue("q", value)
