"""How a reader gets at a shard's bytes: one class per access mode, chosen once per reader.

* :class:`LocalAccess`: the shard file is memory-mapped where it lies (local disk, NFS).
* :class:`CachedAccess`: remote shards are fetched whole into the node's shared cache
  (:class:`~shardpack.storage.cache.ShardCache`), verified there, then memory-mapped; indexes too.
* :class:`RangedAccess`: remote shards without a cache: samples come from ranged reads of about
  CHUNK_BYTES ("chunks"), kept in a small per-process memory LRU.

The reader (shardpack/read/reader.py) keeps what does not depend on the mode: indexes, the sample
checks and their memo, the open maps.  A mode says where a shard's file is (``open``), how an
index's bytes are read (``index_bytes``), what "fetch ahead" means for it (``unit_keys``,
``warm``: whole shards for the cache, chunks without one, nothing locally), and how much it keeps
(its tuning values are constructor arguments, from :class:`Burst`: what one shuffle window reads).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardpack import format as fmt
from shardpack.storage import Storage, check_regular, read_fd, read_regular

MAX_OPEN_SHARDS = 64     # local maps a process keeps open
CHUNK_BYTES = 8 << 20    # ranged reads without a cache
CHUNK_MEMORY = 96 << 20  # ... chunks a process keeps, at least


@dataclass(frozen=True)
class Burst:
    """What a reader is asked for at once: up to ``samples`` samples from up to ``places``
    places of the dataset (a shuffle window: its samples, and its blocks).  Sizes what a mode
    keeps: cached shards open, chunks in memory."""

    samples: int = 0
    places: int = 0


class ShardAccess:
    """The interface; see the module docstring."""

    name = "access"
    prefetches = False   # whether fetching ahead helps (remote modes)
    fast_start = False   # whether a cold first batch is worth ranged reads (cache only)

    def __init__(self, storage: Storage, shards: Sequence[fmt.ShardEntry]):
        self.storage, self.shards = storage, shards

    def index_bytes(self, shard: int) -> bytes:
        """The bytes of shard ``shard``'s index (the reader checks them).

        Args:
            shard: a shard number.
        """
        return self.storage.read_bytes(self.shards[shard].index)

    def open(self, shard: int) -> tuple[str, object] | None:
        """(local path of the shard's file, a held cache entry or None), or None when this mode
        does not map shards (ranged reads)."""
        return self.storage.path(self.shards[shard].name), None

    @property
    def open_limit(self) -> int:
        """Maps of this mode a process keeps open at most."""
        return MAX_OPEN_SHARDS

    def is_cached(self, shard: int) -> bool:
        """Whether shard ``shard`` is in a cache now (never, without one).

        Args:
            shard: a shard number.
        """
        return False

    def unit_keys(self, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Int64 keys of the units fetched ahead for samples (shards, rows)."""
        return shards

    def unit(self, key: int):
        """The unit (a shard, or (shard, chunk)) of a key :meth:`unit_keys` made.

        Args:
            key: a unit key.
        """
        return int(key)

    def warm(self, unit) -> None:
        """Fetch a unit ahead (a background thread calls this)."""

    def all_cached(self, keys) -> bool:
        """Whether every unit of ``keys`` is in a cache now.

        Args:
            keys: unit keys.
        """
        return False

    def ahead(self, window: int) -> int:
        """Positions to fetch ahead of the reader beyond the current batch."""
        return 0


class LocalAccess(ShardAccess):
    """Local shard files, mapped where they lie; indexes read as regular files."""

    name = "local"

    def index_bytes(self, shard: int) -> bytes:
        """The index file, a regular file of the size the manifest records (the reader checks
        its hash): never more bytes than that are read."""
        entry = self.shards[shard]
        return read_regular(self.storage.path(entry.index), self.storage.display(entry.index),
                            "index", entry.index_bytes)


class CachedAccess(ShardAccess):
    """Remote shards fetched whole into the shared cache (verified there), then mapped;
    indexes through the cache too."""

    name = "cached"
    prefetches = fast_start = True

    def __init__(self, storage: Storage, shards: Sequence[fmt.ShardEntry], cache, prefetch: int,
                 burst: Burst):
        super().__init__(storage, shards)
        self.cache = cache
        # cached shards a process keeps open (and locked against eviction): the prefetch depth,
        # a few more, and the places one shuffle window reads from (or every batch would
        # close and re-map them: docs/benchmarks.md, "Remote")
        self._open_limit = prefetch + 4 + burst.places

    @property
    def open_limit(self) -> int:
        """Cached shards a process keeps open (and locked against eviction) at most."""
        return self._open_limit

    def index_bytes(self, shard: int) -> bytes:
        """The index of shard ``shard``, through the cache (fetched into it when missing),
        read by the fd the cache verified.

        Args:
            shard: a shard number.
        """
        from shardpack.storage.cache import CacheItem

        entry = self.shards[shard]
        meta = CacheItem(entry.index, entry.index_hash, entry.index_bytes)
        held = self.cache.open(self.storage.url, meta, lambda tmp: self.storage.download(
            entry.index, tmp, entry.index_bytes))
        try:  # through the fd the cache verified, bounded by the manifest's size
            display = self.storage.display(entry.index)
            check_regular(os.fstat(held.fd), display, "cached index")
            return read_fd(held.fd, entry.index_bytes, display, "cached index")
        finally:
            held.close()

    def _downloader(self, shard: int):
        meta = self.shards[shard]
        return lambda tmp: self.storage.download(meta.name, tmp, meta.bytes)

    def open(self, shard: int) -> tuple[str, object]:
        """(the cached file's path, the cache entry held open) of shard ``shard``, fetched
        into the cache when missing.

        Args:
            shard: a shard number.
        """
        entry = self.cache.open(self.storage.url, self.shards[shard], self._downloader(shard))
        return entry.path, entry

    def is_cached(self, shard: int) -> bool:
        """Whether the cache holds the shard now (a look, not a promise: eviction may remove
        it; it is verified when opened)."""
        return os.path.exists(self.cache.entry_path(self.storage.url, self.shards[shard]))

    def warm(self, unit) -> None:
        """The shard into the cache; one another process or thread is fetching is left to it
        (the reader waits for it when it gets there)."""
        entry = self.cache.open(self.storage.url, self.shards[unit], self._downloader(unit),
                                wait=False)
        if entry is not None:
            entry.close()

    def all_cached(self, keys) -> bool:
        """Whether every shard of ``keys`` is in the cache now.

        Args:
            keys: shard numbers.
        """
        return all(self.is_cached(int(k)) for k in keys)

    def ahead(self, window: int) -> int:
        """A whole shuffle window ahead: a window is read in a burst.

        Args:
            window: the shuffle window's positions.
        """
        return window  # a shuffle window is read in a burst: fetch the next one early


class RangedAccess(ShardAccess):
    """Chunks of about CHUNK_BYTES by ranged reads, an LRU of at least ``chunk_memory`` bytes
    (a shuffle window's worth, or every window would fetch its chunks again), and one fetch per
    chunk however many threads ask for it."""

    name = "ranged"
    prefetches = True

    def __init__(self, storage: Storage, shards: Sequence[fmt.ShardEntry], index, burst: Burst,
                 mean_sample: float):
        super().__init__(storage, shards)
        self.index = index  # the reader's (checked) index of a shard
        self.chunk_memory = max(CHUNK_MEMORY, int(1.25 * burst.samples * mean_sample) +
                                4 * CHUNK_BYTES) if burst.samples else CHUNK_MEMORY
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._chunks: OrderedDict[tuple, tuple] = OrderedDict()
        self._chunk_bytes = 0
        self._inflight: dict[tuple, _Flight] = {}
        self._lock = threading.RLock()

    def __getstate__(self):  # chunks and locks stay in their process
        state = dict(self.__dict__)
        for key in ("_chunks", "_chunk_bytes", "_inflight", "_lock"):
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_process_state()

    def open(self, shard: int) -> None:
        """None: this mode maps nothing, it reads chunks.

        Args:
            shard: a shard number.
        """
        return None

    def rows_per_chunk(self, shard: int) -> int:
        """Samples of shard ``shard`` per chunk of about CHUNK_BYTES.

        Args:
            shard: a shard number.
        """
        meta = self.shards[shard]
        return max(1, CHUNK_BYTES * meta.samples // max(1, meta.bytes))

    def unit_keys(self, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Keys of the chunks that hold samples (shards, rows): shard << 32 | chunk.

        Args:
            shards: shard numbers (int64).
            rows: rows in those shards.
        """
        per = np.array([self.rows_per_chunk(s) for s in range(len(self.shards))])
        return shards * (1 << 32) + rows // per[shards]

    def unit(self, key: int):
        """(shard, chunk) of a key :meth:`unit_keys` made.

        Args:
            key: a unit key.
        """
        return int(key >> 32), int(key & 0xFFFFFFFF)

    def warm(self, unit) -> None:
        """Fetch chunk ``unit`` into memory.

        Args:
            unit: (shard, chunk).
        """
        self.chunk(*unit)

    def chunk_of(self, shard: int, row: int) -> tuple[bytes, int]:
        """(bytes, offset in the shard) of the chunk that holds row ``row`` of shard ``shard``.

        Args:
            shard: a shard number.
            row: a row of it.
        """
        return self.chunk(shard, row // self.rows_per_chunk(shard))

    def chunk(self, shard: int, number: int) -> tuple[bytes, int]:
        """Rows of chunk ``number`` of a shard with one ranged read: (bytes, offset)."""
        key = (shard, number)
        with self._lock:
            hit = self._chunks.get(key)
            if hit is not None:
                self._chunks.move_to_end(key)
                return hit
            flight = self._inflight.get(key)
            owner = flight is None
            if owner:  # nobody is fetching it: this thread does, others wait for its outcome
                flight = self._inflight[key] = _Flight()
        if not owner:
            flight.done.wait()
            if flight.error is not None:
                with self._lock:  # a failed fetch is reported once, then forgotten
                    if self._inflight.get(key) is flight:
                        del self._inflight[key]
                raise flight.error
            return flight.result
        try:
            flight.result = self._fetch(shard, number)
            return flight.result
        except BaseException as exc:
            flight.error = exc  # kept for the next thread that asks (the reader, after a
            raise               # prefetcher's failure): the error after retries, not a new try
        finally:
            if flight.error is None:
                with self._lock:
                    self._inflight.pop(key, None)
            flight.done.set()

    def _fetch(self, shard: int, number: int) -> tuple[bytes, int]:
        index = self.index(shard)
        per = self.rows_per_chunk(shard)
        first, last = number * per, min(index.num_samples, (number + 1) * per)
        start, end = int(index.starts[first]), int(index.starts[last])
        data = self.storage.read_bytes(self.shards[shard].name, start, end)
        with self._lock:
            self._chunks[(shard, number)] = (data, start)
            self._chunk_bytes += len(data)
            while self._chunk_bytes > self.chunk_memory and len(self._chunks) > 1:
                _, (old, _) = self._chunks.popitem(last=False)
                self._chunk_bytes -= len(old)
        return data, start


class _Flight:
    """One fetch in progress: threads wanting the same chunk wait for its result or error."""

    __slots__ = ("done", "result", "error")

    def __init__(self):
        self.done = threading.Event()
        self.result = None
        self.error = None


def make_access(storage: Storage, shards: Sequence[fmt.ShardEntry], *, index, cache_dir=None,
                cache_limit="50GB", prefetch: int = 2, burst: Burst | None = None,
                mean_sample: float = 0.0) -> ShardAccess:
    """The mode for a dataset at ``storage``: local files are mapped where they are; remote
    ones go through the cache when ``cache_dir`` is given, else ranged reads."""
    burst = burst or Burst()
    if storage.local_path() is not None:  # files of this machine: mapped where they are
        return LocalAccess(storage, shards)
    if cache_dir is not None:
        from shardpack.storage.cache import ShardCache
        from shardpack.core.sizes import parse_size

        return CachedAccess(storage, shards, ShardCache(cache_dir, parse_size(cache_limit)),
                            prefetch, burst)
    return RangedAccess(storage, shards, index, burst, mean_sample)
