"""Batches -> training process: reusable shared buffers between DataLoader workers and the trainer.

A DataLoader worker normally hands every batch tensor over in a new shared-memory segment: the
worker creates it, the kernel zeroes and maps fresh pages on both sides, and both unmap it when the
batch dies.  For a 25.6 MB batch that costs 28 ms in the worker alone here, against 4 ms to copy
the same bytes into memory that is already mapped (docs/reading.md, "Batch buffers").

A :class:`SlotPool` is an anonymous shared mapping of fixed-size slots that the dataset creates in
the training process, before the DataLoader forks its workers, so every worker inherits it.  A
worker claims a free slot, fills it, and sends only ``(pool, slot, size)``; the training process
rebuilds the tensor as a view of its own mapping of that slot and frees the slot when the last
view of it dies.  Nothing outlives the processes: the mapping is anonymous, the lock is an
unlinked semaphore.

Where it does not apply the old path is taken, never a wait: no free slot (the trainer holds many
batches), a batch larger than a slot, workers started with ``spawn``/``forkserver`` (the pool does
not cross a pickle), or a pool that could not be mapped.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import secrets
import weakref

import numpy as np

from .errors import ShardpackError

SLOTS = 64                # slots per pool; a worker takes the lowest free one
SLOT_BYTES = 256 << 20    # a batch field larger than this goes the old way
KEEP = 8                  # slots past these give their pages back when freed
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux; virtual space only, no commit
_LOCK_TIMEOUT = 1.0       # a claim that cannot get the lock in time takes the old path
_FREE, _BUSY = 0, 1

_pools: "weakref.WeakValueDictionary[str, SlotPool]" = weakref.WeakValueDictionary()


class SlotPool:
    """Fixed-size shared slots for batch tensors.  Create it in the training process; workers
    forked afterwards share it.  ``lease`` is used in workers only."""

    def __init__(self, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        self.slots, self.slot_bytes = slots, slot_bytes
        # slot states live in the first page, slot s at page_end + s * slot_bytes
        self._base = mmap.PAGESIZE * max(1, -(-slots // mmap.PAGESIZE))
        self._map = mmap.mmap(-1, self._base + slots * slot_bytes,
                              flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        self._state = np.frombuffer(self._map, dtype=np.uint8, count=slots)
        self._lock = multiprocessing.get_context("fork").Lock()
        self._broken = False  # the lock timed out once in this process: stop trying
        self.owner = os.getpid()
        self.token = f"{self.owner}-{secrets.token_hex(8)}"
        _pools[self.token] = self

    @classmethod
    def create(cls) -> "SlotPool | None":
        """A pool, or None where this system cannot map one (strict overcommit, address limits,
        no fork)."""
        try:
            return cls()
        except (OSError, ValueError):
            return None

    def __reduce__(self):  # a pool is shared by fork only; a pickled copy goes without
        return _no_pool, ()

    def free_slots(self) -> int:
        return int(np.count_nonzero(self._state == _FREE))

    def lease(self, nbytes: int) -> "Lease | None":
        """A free slot holding ``nbytes``, claimed for this process; None when none is free, the
        size does not fit, or this is the process that owns the pool (it has nobody to send to)."""
        if not 0 < nbytes <= self.slot_bytes or os.getpid() == self.owner or self._broken:
            return None
        if not self._lock.acquire(timeout=_LOCK_TIMEOUT):  # a process died holding it
            self._broken = True
            return None
        try:
            free = np.flatnonzero(self._state == _FREE)
            if not len(free):
                return None
            slot = int(free[0])
            self._state[slot] = _BUSY
        finally:
            self._lock.release()
        return Lease(self, slot, nbytes)

    def view(self, slot: int, nbytes: int) -> np.ndarray:
        return np.frombuffer(self._map, dtype=np.uint8, count=nbytes,
                             offset=self._base + slot * self.slot_bytes)

    def release(self, slot: int) -> None:
        """Free a slot.  Workers take the lowest free slot, so the first KEEP slots are the ones in
        use; a slot past them was needed only while many batches were held: its pages go back."""
        if slot >= KEEP and hasattr(mmap, "MADV_REMOVE"):
            try:
                self._map.madvise(mmap.MADV_REMOVE, self._base + slot * self.slot_bytes,
                                  self.slot_bytes)
            except OSError:
                pass
        self._state[slot] = _FREE


def _no_pool():
    return None


class Lease:
    """One claimed slot in a worker.  ``array`` is the slot's bytes; whatever is built on it
    (``torch.from_numpy``) keeps it alive.  When the lease and the last view die the slot is
    freed, unless the batch was sent: then the receiving process frees it."""

    __slots__ = ("pool", "slot", "nbytes", "array", "_sent", "tensor")

    def __init__(self, pool: SlotPool, slot: int, nbytes: int):
        self.pool, self.slot, self.nbytes = pool, slot, nbytes
        self._sent = [False]  # shared with the finalizer, which must not hold the lease
        self.array = pool.view(slot, nbytes)
        self.tensor = None    # weakref to the tensor made of `array`, set by the caller
        weakref.finalize(self.array, _release_unsent, self._sent, pool, slot)

    @property
    def sent(self) -> bool:
        return self._sent[0]

    def handle(self) -> tuple:
        """What crosses the process boundary instead of the bytes (marks the lease sent)."""
        self._sent[0] = True
        return self.pool.token, self.slot, self.nbytes


def _release_unsent(sent: list, pool: SlotPool, slot: int) -> None:
    if not sent[0]:
        pool.release(slot)


def pool_for(token: str) -> SlotPool:
    pool = _pools.get(token)
    if pool is None:
        raise ShardpackError(
            f"a batch refers to shared buffer pool {token}, which this process does not have",
            hint="unpickle DataLoader batches in the process that created the ShardDataset")
    return pool


def sending_from_worker(token: str) -> bool:
    """True in a process that shares pool ``token`` but did not create it (a forked worker)."""
    pool = _pools.get(token)
    return pool is not None and pool.owner != os.getpid()


def receive(token: str, slot: int, nbytes: int) -> np.ndarray:
    """The slot's bytes as an array of this process's mapping; the slot is freed when the array
    and everything built on it die."""
    pool = pool_for(token)
    array = pool.view(slot, nbytes)
    weakref.finalize(array, pool.release, slot)
    return array
