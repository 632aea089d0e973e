"""Batches -> training process: reusable shared buffers between DataLoader workers and the trainer.

A DataLoader worker normally hands every batch tensor over in a new shared-memory segment: the
worker creates it, the kernel zeroes and maps fresh pages on both sides, and both unmap it when the
batch dies.  That costs several times more than copying the same bytes into memory that is
already mapped (figures: docs/reading.md, "Batch buffers").

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
import threading
import weakref

import numpy as np

from shardpack.core.errors import ShardpackError

SLOTS = 64                # slots per pool; a worker takes the lowest free one
SLOT_BYTES = 256 << 20    # a batch field larger than this goes the old way
KEEP = 8                  # slots past these give their pages back when freed
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux; virtual space only, no commit
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+
_LOCK_TIMEOUT = 1.0       # a claim that cannot get the lock in time takes the old path
_FREE, _TAKEN, _HELD = 0, 1, 2  # free; claimed by a worker; received by the owning process
_SENDER = "QueueFeederThread"   # multiprocessing.Queue's thread: the DataLoader's hand-off

_pools: "weakref.WeakValueDictionary[str, SlotPool]" = weakref.WeakValueDictionary()


class SlotPool:
    """Fixed-size shared slots for batch tensors.  Create it in the training process; workers
    forked afterwards share it.  ``lease`` is used in workers only.

    Per slot the first page holds a state (free / taken by a worker / held by the owner), a
    generation (bumped at every claim; a handle whose generation no longer matches is refused, so a
    reused slot can never be read as another batch) and the pid of the worker that took it (a slot
    taken by a worker that died before its batch was received is taken back)."""

    def __init__(self, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES):
        self.slots, self.slot_bytes = slots, slot_bytes
        head = 13 * slots  # int64 generation, int32 pid, uint8 state
        self._base = mmap.PAGESIZE * max(1, -(-head // mmap.PAGESIZE))
        self._map = mmap.mmap(-1, self._base + slots * slot_bytes,
                              flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        self._gen = np.frombuffer(self._map, dtype=np.int64, count=slots)
        self._pid = np.frombuffer(self._map, dtype=np.int32, count=slots, offset=8 * slots)
        self._state = np.frombuffer(self._map, dtype=np.uint8, count=slots, offset=12 * slots)
        self._lock = multiprocessing.get_context("fork").Lock()
        self._broken = False  # the lock timed out once in this process: stop trying
        self._mapped = {}     # slot -> bytes of it this process has page-table entries for
        self._mapped_pid = os.getpid()
        self.owner = os.getpid()
        self.reader = None    # the owning process's DatasetReader (keys are looked up there)
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
        """Slots free now (neither claimed by a worker nor held by the owner)."""
        return int(np.count_nonzero(self._state == _FREE))

    def _locked(self) -> bool:
        if self._broken:
            return False
        if not self._lock.acquire(timeout=_LOCK_TIMEOUT):  # a process died holding it
            self._broken = True
            return False
        return True

    def lease(self, nbytes: int) -> "Lease | None":
        """A free slot holding ``nbytes``, claimed for this process; None when none is free, the
        size does not fit, or this is the process that owns the pool (it has nobody to send to)."""
        me = os.getpid()
        if not 0 < nbytes <= self.slot_bytes or me == self.owner or not self._locked():
            return None
        try:
            free = np.flatnonzero(self._state == _FREE)
            if not len(free) or free[0] >= KEEP:  # only then look for slots of dead workers
                for slot in np.flatnonzero(self._state == _TAKEN).tolist():
                    if self._pid[slot] != me and not _alive(int(self._pid[slot])):
                        self._state[slot] = _FREE  # its worker died; its batch never comes
                free = np.flatnonzero(self._state == _FREE)
            if not len(free):
                return None
            slot = self._pick(free.tolist(), me)
            self._gen[slot] += 1
            self._pid[slot] = me
            self._state[slot] = _TAKEN
            gen = int(self._gen[slot])
        finally:
            self._lock.release()
        self._populate(slot, nbytes)
        return Lease(self, slot, nbytes, gen)

    def _pick(self, free: list, me: int) -> int:
        """The lowest free slot this process has written before, else the lowest free one.  A
        slot is shared memory: each process that writes it first takes a page fault for every
        4 KB of it (fork copies no page tables of shared mappings), ~15 ms for 25 MB, three
        times the copy itself; with the lowest free slot for everyone, two workers wrote 4-5
        slots each in a 12-batch epoch, with this 3."""
        if me != self._mapped_pid:  # (a forked worker: the owner's entries are not its own)
            self._mapped, self._mapped_pid = {}, me
        return next((s for s in free if s < KEEP and s in self._mapped), free[0])

    def _populate(self, slot: int, nbytes: int) -> None:
        """Map the slot's pages into this process in one call (``MADV_POPULATE_WRITE``, Linux
        5.14+; ignored where it fails) the first time it writes them: about half the cost of
        faulting them in one by one when another process already allocated them."""
        done = self._mapped.get(slot, 0)
        if nbytes <= done or slot >= KEEP:  # (past KEEP, pages go back when the slot is freed)
            return
        page = mmap.PAGESIZE
        start, end = done // page * page, -(-nbytes // page) * page
        try:
            self._map.madvise(_MADV_POPULATE_WRITE, self._base + slot * self.slot_bytes + start,
                              end - start)
        except (OSError, ValueError):
            pass
        self._mapped[slot] = end

    def view(self, slot: int, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of ``slot`` as a uint8 array over this process's mapping.

        Args:
            slot: the slot.
            nbytes: bytes to view (at most the slot's size).
        """
        return np.frombuffer(self._map, dtype=np.uint8, count=nbytes,
                             offset=self._base + slot * self.slot_bytes)

    def serve_keys(self, reader) -> None:
        """Look keys up in ``reader`` for batches that carry sample ids instead (workers send
        ids; the owning process turns them into keys when they are used)."""
        if self.reader is not None and self.reader is not reader:
            raise ValueError("this slot pool already serves another dataset's keys: give each "
                             "dataset a pool of its own")
        self.reader = reader
        reader.serve_keys(self.token)

    def receive(self, slot: int, nbytes: int, gen: int) -> np.ndarray:
        """The slot's bytes as an array of this process's mapping; the slot is freed when the
        array and everything built on it die.  Outside the owning process: a private copy."""
        if os.getpid() != self.owner:
            return self.view(slot, nbytes).copy()
        if not self._locked():
            raise ShardpackError("the batch buffer pool's lock is held by a process that died",
                                 hint="restart the DataLoader")
        try:
            if self._gen[slot] != gen or self._state[slot] != _TAKEN:
                raise ShardpackError(f"batch buffer slot {slot} was taken back before its "
                                     "batch arrived (its worker died?)",
                                     hint="restart the DataLoader")
            self._state[slot] = _HELD
        finally:
            self._lock.release()
        array = self.view(slot, nbytes)
        _finalize(array, self.release, slot, gen, _HELD)
        return array

    def release(self, slot: int, gen: int, state: int) -> None:
        """Free a slot still in ``state`` at generation ``gen``.  Workers take the lowest free
        slot, so the first KEEP slots are the ones in use; a slot past them was needed only while
        many batches were held: its pages go back."""
        if self._gen[slot] != gen or self._state[slot] != state:
            return
        if slot >= KEEP and hasattr(mmap, "MADV_REMOVE"):
            try:
                self._map.madvise(mmap.MADV_REMOVE, self._base + slot * self.slot_bytes,
                                  self.slot_bytes)
            except OSError:
                pass
        self._state[slot] = _FREE


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _no_pool():
    return None


def _finalize(obj, func, *args) -> None:
    """Run ``func(*args)`` when ``obj`` dies, in this process only: a forked child inherits the
    finalizer but not the right to free anything, and nothing runs at interpreter exit."""
    weakref.finalize(obj, _only_in, os.getpid(), func, *args).atexit = False


def _only_in(pid: int, func, *args) -> None:
    if os.getpid() == pid:
        func(*args)


class Lease:
    """One claimed slot in a worker.  ``array`` is the slot's bytes; whatever is built on it
    (``torch.from_numpy``) keeps it alive.  When the lease and the last view die the slot is
    freed, unless it was sent: then the receiving process frees it."""

    __slots__ = ("pool", "slot", "nbytes", "gen", "array", "_sent")

    def __init__(self, pool: SlotPool, slot: int, nbytes: int, gen: int):
        self.pool, self.slot, self.nbytes, self.gen = pool, slot, nbytes, gen
        self._sent = [False]  # shared with the finalizer, which must not hold the lease
        self.array = pool.view(slot, nbytes)
        _finalize(self.array, _release_unsent, self._sent, pool, slot, gen)

    @property
    def sent(self) -> bool:
        """Whether the slot went to the owning process (which frees it then)."""
        return self._sent[0]

    def handle(self) -> tuple | None:
        """What crosses to the owning process instead of the bytes (and marks the lease sent),
        or None when this is not the DataLoader's hand-off (a copy or pickle made by user code
        in the worker): then the bytes go by value."""
        if self._sent[0] or threading.current_thread().name != _SENDER:
            return None
        self._sent[0] = True
        return self.pool.token, self.slot, self.nbytes, self.gen


def _release_unsent(sent: list, pool: SlotPool, slot: int, gen: int) -> None:
    if not sent[0]:
        pool.release(slot, gen, _TAKEN)


def pool_for(token: str) -> SlotPool:
    """This process's pool named ``token``; a ShardpackError if it has none (a batch unpickled
    in another process than the dataset's).

    Args:
        token: the pool's token.
    """
    pool = _pools.get(token)
    if pool is None:
        raise ShardpackError(
            f"a batch refers to shared buffer pool {token}, which this process does not have",
            hint="unpickle DataLoader batches in the process that created the ShardDataset")
    return pool


def sending_from_worker(token: str) -> bool:
    """True on the DataLoader's hand-off thread of a process that shares pool ``token`` but did
    not create it (a forked worker)."""
    pool = _pools.get(token)
    return pool is not None and pool.owner != os.getpid() and \
        threading.current_thread().name == _SENDER


def receive(token: str, slot: int, nbytes: int, gen: int) -> np.ndarray:
    """The slot's bytes (see :meth:`SlotPool.receive`) of the pool named ``token``."""
    return pool_for(token).receive(slot, nbytes, gen)
