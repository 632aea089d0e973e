"""Reader: manifest + lazily loaded shard indexes -> sample bytes, through the storage layer.

One ranged read fetches one sample (``read_sample``); ``iter_shard`` reads a whole shard with one
sequential read and slices every sample out of it.  Every read is bounded by sizes the index
records: zstd decompression gets ``max_output_size`` from the index and must produce exactly that
many bytes; msgpack unpacking (verification only) is limited to the record's own size.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict

import numpy as np

from shardpack import format as fmt
from shardpack.read.access import MAX_OPEN_SHARDS, Burst, make_access
from shardpack.core.errors import DatasetNotFoundError, FormatError, IntegrityError, ShardpackError
from shardpack.read.prefetch import NOTHING, Prefetcher
from shardpack.storage import Storage, check_regular, open_regular, read_regular


UNPARSED = np.iinfo(np.int64).min  # a label not parsed yet (label_memo)


MAX_INDEXES = 512  # parsed shard indexes a process keeps (docs/scale.md)

# How often a sample's stored bytes are hashed against its index (docs/reading.md, "Integrity"):
# every time it is read (the default), once per process and copy of its shard, or never
CHECKS = ("every", "once", "none")


def check_mode(check: str | None, trust_storage: bool = False) -> str:
    """The sample check a reader runs: ``check`` (one of CHECKS), or for None the default,
    "every"; ``trust_storage=True`` is the older spelling of ``check="none"``."""
    if check is None:
        return "none" if trust_storage else "every"
    if check not in CHECKS:
        raise ValueError(f"check must be one of {', '.join(map(repr, CHECKS))}, got {check!r}")
    if trust_storage and check != "none":
        raise ValueError(f"trust_storage=True means check='none', which contradicts "
                         f"check={check!r}: pass one of them")
    return check


def locate(offsets: np.ndarray, i: int, what: str) -> tuple[int, int]:
    """(shard, row in shard) of sample ``i``; ``offsets`` are the shards' first sample ids."""
    if not 0 <= i < int(offsets[-1]):
        raise IndexError(f"sample {i} out of range for {what} of {int(offsets[-1])} samples")
    shard = int(np.searchsorted(offsets, i, side="right")) - 1
    return shard, i - int(offsets[shard])


def locate_many(offsets: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray]:
    """(shard, row in shard) of each sample id of ``ids`` (int64 arrays)."""
    ids = np.asarray(ids, dtype=np.int64)
    shards = np.searchsorted(offsets, ids, side="right") - 1
    return shards, ids - offsets[shards]


def no_dataset(storage: Storage) -> DatasetNotFoundError:
    """The error for a path without a manifest, saying why: nothing there, a file, or a folder
    without a manifest; ``--resume`` is suggested only where an unfinished pack left its state
    file, since elsewhere it could not help."""
    why, hint = f"{fmt.MANIFEST_NAME} is missing", None
    if storage.local and not os.path.exists(storage.root):
        why = "the path does not exist"
    elif storage.local and not os.path.isdir(storage.root):
        why = "a file, not a dataset folder"
    else:
        try:
            unfinished = storage.exists(fmt.STATE_NAME)
        except (OSError, ShardpackError):  # no answer: the message stays without a hint
            unfinished = False
        if unfinished:
            hint = ("a pack into this folder has not finished (or is still running): to finish "
                    "it, run the same pack or convert command again with --resume")
    return DatasetNotFoundError(f"no shardpack dataset here ({why})", path=storage.url,
                                hint=hint)


class DatasetReader:
    """A dataset's manifest, its shard indexes (loaded when first needed, checked against the
    manifest), and its samples' bytes, each checked against its index hash when read
    (``check``: every time, the default; "once" per process and copy of the shard; "none").

    How shard bytes are reached is the access mode (shardpack/read/access.py), chosen once here:
    local files are mapped where they are; remote shards go through the shared cache at
    ``cache_dir`` (fetched whole, verified, mapped), or without one by ranged reads of chunks.
    ``prefetch`` shards (or chunks) are fetched ahead by a background :class:`Prefetcher`
    (shardpack/read/prefetch.py).  ``burst`` (an :class:`~shardpack.read.access.Burst`) says what
    is read
    at once, which sizes what the mode keeps."""

    MAX_OPEN_SHARDS = MAX_OPEN_SHARDS
    PIECE_GAP = 64 << 10      # fetch_pieces: samples closer than this share one request
    PIECE_REQUEST = 4 << 20   # ... up to this many bytes a request

    def __init__(self, url, storage_options: dict | None = None, *, cache_dir=None,
                 cache_limit="50GB", prefetch: int = 2, trust_storage: bool = False,
                 burst: Burst | None = None, check: str | None = None):
        """``check``: how often a sample is hashed against its index (:meth:`check_rows`):
        ``"every"`` read (the default), ``"once"`` per process and copy of its shard, or
        ``"none"`` for storage the user trusts (``trust_storage=True`` is the same); shard
        identity at mapping, index hashes and the shard's size before each use are checked
        in every mode (docs/reading.md, "Integrity")."""
        self.storage = Storage(url, storage_options)
        self.check = check_mode(check, trust_storage)
        self.trust_storage = self.check == "none"
        self.keys_token: str | None = None  # serve_keys
        self.prefetch = prefetch
        try:
            if self.storage.local:  # a regular file: never a FIFO's wait or /dev/zero's flood
                data = read_regular(self.storage.path(fmt.MANIFEST_NAME),
                                    self.storage.display(fmt.MANIFEST_NAME), "manifest",
                                    limit=fmt.MANIFEST_CAP)
            else:
                data = self.storage.read_bytes(fmt.MANIFEST_NAME)
        except (DatasetNotFoundError, NotADirectoryError):  # (the latter: a file's path)
            raise no_dataset(self.storage) from None
        self.manifest = fmt.decode_manifest(data, self.storage.display(fmt.MANIFEST_NAME))
        self.shards: tuple[fmt.ShardEntry, ...] = self.manifest.shards
        self.offsets = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum([s.samples for s in self.shards], out=self.offsets[1:])
        mean = (self.manifest.num_bytes or 0) / max(1, int(self.offsets[-1]))
        self.access = make_access(self.storage, self.shards, index=self.index,
                                  cache_dir=cache_dir, cache_limit=cache_limit,
                                  prefetch=prefetch, burst=burst or Burst(),
                                  mean_sample=mean)
        self._init_process_state()

    @property
    def cache(self):
        """The shared cache (:class:`~shardpack.storage.cache.ShardCache`), or None (not cached)."""
        return getattr(self.access, "cache", None)

    @property
    def open_cached(self) -> int:
        """Cached shards a process keeps open (and locked against eviction) at most."""
        return self.access.open_limit

    def _init_process_state(self) -> None:
        # at most MAX_INDEXES parsed indexes per process, least recently used out (with what
        # was memoised for their shards): a billion-sample dataset has 10^5 of them
        self._indexes: OrderedDict[int, fmt.ShardIndex] = OrderedDict()
        self._buffers: OrderedDict[int, _Mapped] = OrderedDict()  # shard -> its open map
        self._pieces: dict[tuple, bytes] = {}  # (shard, row) -> stored bytes, read once
        self.labels: dict[tuple, np.ndarray] = {}  # (shard, field) -> parsed labels (batches.py)
        # shard -> samples whose stored bytes matched their index hash in this process, in the
        # file whose identity (identity_of) is _copies[shard] (check="once")
        self.checked: dict[int, np.ndarray] = {}
        self._copies: dict[int, tuple] = {}
        self._lock = threading.RLock()

    def __getstate__(self):
        # memory maps, cache locks and loaded indexes stay in their process: a worker opens its
        # own, lazily
        state = dict(self.__dict__)
        for key in ("_indexes", "_buffers", "_pieces", "labels", "checked", "_copies", "_lock"):
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_process_state()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def fields(self) -> list[str]:
        return list(self.manifest.fields)

    def shard_path(self, shard: int) -> str:
        return self.storage.display(self.shards[shard].name)

    def index(self, shard: int) -> fmt.ShardIndex:
        """The index of shard number ``shard``, checked against the manifest's size and hash."""
        cached = self._indexes.get(shard)  # the hot path: no lock (each call is atomic)
        if cached is not None:
            try:
                self._indexes.move_to_end(shard)
            except KeyError:  # another thread evicted it just now: still good for this call
                pass
            return cached
        entry = self.shards[shard]
        path = self.storage.display(entry.index)
        data = self.access.index_bytes(shard)
        if len(data) != entry.index_bytes:
            raise IntegrityError(f"index is {len(data)} bytes, the manifest says "
                                 f"{entry.index_bytes}", path=path)
        if fmt.content_hash(data) != entry.index_hash:
            raise IntegrityError("index hash does not match the manifest (same size, other "
                                 "bytes: corrupt, or from another version of the dataset)",
                                 path=path)
        index = fmt.decode_index(data, path)
        if index.num_samples != entry.samples or index.shard_bytes != entry.bytes:
            raise IntegrityError("index disagrees with the manifest on sample count or shard "
                                 "size", path=path)
        with self._lock:
            self._indexes[shard] = index
            self._evict_indexes()
        return index

    def _evict_indexes(self) -> None:
        """Least recently used indexes out, down to MAX_INDEXES, but never one of a shard whose
        file is mapped now (a batch being gathered uses it), with what was memoised for their
        shards.  Called with the lock held."""
        over = len(self._indexes) - MAX_INDEXES
        for old in [s for s in list(self._indexes) if s not in self._buffers][:max(0, over)]:
            self._indexes.pop(old, None)
            self.checked.pop(old, None)  # (its samples are checked again if read again)
            self._copies.pop(old, None)
            for key in [k for k in list(self.labels) if k[0] == old]:
                self.labels.pop(key, None)

    def locate(self, i: int) -> tuple[int, int]:
        return locate(self.offsets, i, "a dataset")

    def locate_many(self, ids) -> tuple[np.ndarray, np.ndarray]:
        return locate_many(self.offsets, ids)

    def shard_buffer(self, shard: int) -> memoryview | None:
        """A read-only memory map of the shard (local file, or its verified copy in the cache),
        checked against the manifest's size; None for remote storage without a cache.  At most
        MAX_OPEN_SHARDS stay open per process (closing one releases its cache lock).

        Every call first checks that the mapped file still has the size its index records (an
        fstat): a page of a map past the end of its file faults (SIGBUS) when touched, and
        the part of a page past the end reads as zeros, so a shard truncated or rewritten in
        place while mapped is unmapped and refused in one line instead.  A file truncated in
        the moment between this check and the copy of its bytes still faults: nothing but
        not mapping could rule that out (docs/reading.md, "Integrity")."""
        with self._lock:
            held = self._buffers.get(shard)
            if held is not None:
                self._buffers.move_to_end(shard)
        if held is not None:
            self._in_bounds(shard, held)
            return held.view
        opened = self.access.open(shard)
        if opened is None:  # this mode reads chunks, it maps nothing
            return None
        path, entry = opened
        try:
            # a cached copy through the fd the cache locked and verified: the path could
            # name another file by now (evicted and fetched again)
            view, mapped, identity = _map(path, self.shards[shard].bytes,
                                          self.shard_path(shard),
                                          getattr(entry, "fd", -1) if entry is not None else -1)
            if self._copies.get(shard) != identity:
                # another file than the one this process checked samples of (replaced since,
                # or first seen): what was checked says nothing about it
                self._forget(shard)
                self._copies[shard] = identity
            if entry is not None and self.check == "once":  # the cache hashed the whole file
                self._seen(shard)[:] = True
            elif entry is None:
                self._check_identity(shard, view)
        except BaseException:
            if entry is not None:
                entry.close()
            raise
        # cached shards stay locked (never evicted) while open: keep few open, so the cache
        # limit can be honoured; local files can stay open freely
        limit = self.MAX_OPEN_SHARDS if entry is None else self.access.open_limit
        with self._lock:
            self._buffers[shard] = _Mapped(view, mapped, entry, path, identity)
            while len(self._buffers) > limit:
                _, old = self._buffers.popitem(last=False)
                if old.entry is not None:
                    old.entry.close()
        return view

    def _in_bounds(self, shard: int, held: "_Mapped") -> None:
        """Refuse a mapped shard whose file no longer has its mapped size (see
        :meth:`shard_buffer`), unmapping it: a later read maps it again, and checks it."""
        try:  # mmap.size() is an fstat of the mapped file: its size now
            size = held.map.size() if held.map is not None else 0
        except OSError:
            size = -1
        if size == held.identity[2]:
            return
        self._unmap(shard, held)
        now = f"now {size} bytes" if size >= 0 else "no longer readable"
        raise IntegrityError(f"shard is {now}, its index says {held.identity[2]}: truncated or "
                             "rewritten in place while it was being read",
                             path=self.shard_path(shard),
                             hint="a published shard must not change; run 'shardpack verify'")

    def _unmap(self, shard: int, held: "_Mapped") -> None:
        """Close the map ``held`` of ``shard`` (if it is still the open one) and forget what was
        checked or parsed of the shard.  Views of it handed out stay valid (the memory map
        closes when the last one goes)."""
        with self._lock:
            if self._buffers.get(shard) is held:
                del self._buffers[shard]
            self._forget(shard)
            self._copies.pop(shard, None)
        if held.entry is not None:
            held.entry.close()

    def _forget(self, shard: int) -> None:
        """Drop what this process checked (the memo) and parsed (labels) of ``shard``."""
        self.checked.pop(shard, None)
        for key in [k for k in list(self.labels) if k[0] == shard]:
            self.labels.pop(key, None)

    def revalidate(self) -> int:
        """Stat the file of every shard mapped now (ShardDataset calls this at each epoch's
        start, in each process that reads): one whose device, inode, size, mtime or ctime
        changed since it was mapped (replaced, rewritten or touched in place) is unmapped and
        what was checked of it forgotten, so its next read maps the file that is there now and
        checks it as any newly mapped shard.  Returns how many were unmapped."""
        with self._lock:
            held = list(self._buffers.items())
        changed = 0
        for shard, mapped in held:
            try:
                st = os.stat(mapped.path)
                now = identity_of(st, cached=mapped.entry is not None)
            except OSError:  # gone (a cached copy removed by another reader): map again
                now = None
            if now != mapped.identity:
                self._unmap(shard, mapped)
                changed += 1
        return changed

    def unchecked(self, shard: int, rows: np.ndarray) -> np.ndarray:
        """The rows of ``rows`` the next :meth:`check_rows` would hash: all of them unless
        ``check="once"`` (then those not yet checked in this process), none with "none"."""
        if self.check == "none":
            return rows[:0]
        seen = self.checked.get(shard) if self.check == "once" else None
        return rows if seen is None else rows[~seen[rows]]

    def label_memo(self, shard: int, field: str, create: bool = False) -> np.ndarray | None:
        """Labels of field ``field`` of shard ``shard`` parsed so far in this process (int64,
        UNPARSED where not yet): the batched path parses each once (shardpack/loader/gather.py)."""
        memo = self.labels.get((shard, field))
        if memo is None and create:
            memo = self.labels[(shard, field)] = np.full(self.index(shard).num_samples,
                                                         UNPARSED, dtype=np.int64)
        return memo

    def serve_keys(self, token: str) -> None:
        """Batches made in DataLoader workers carry sample ids; keys are looked up here, in the
        process that owns the slot pool named ``token`` (shardpack/loader/buffers.py)."""
        self.keys_token = token

    def _seen(self, shard: int) -> np.ndarray:
        seen = self.checked.get(shard)
        if seen is None:
            seen = self.checked[shard] = np.zeros(self.index(shard).num_samples, dtype=bool)
        return seen

    def _check_identity(self, shard: int, view) -> None:
        """A shard just mapped must be the one its index describes: its first, middle and last
        samples are hashed now (three samples, whatever the shard's size).  All of them wrong is
        a swapped or replaced shard, refused before any of its bytes are used; a single wrong
        one is a corrupt sample, left for :meth:`check_rows` to name when it is read (so
        ``on_error="skip"`` can skip it).  docs/reading.md, "Integrity"."""
        index = self.index(shard)
        n = index.num_samples
        if not n:
            return
        probes = sorted({0, n // 2, n - 1})
        h, good = fmt.sample_hash, []
        for row in probes:
            a, b = index.span(row)
            if b <= len(view) and h(view[a:b]) == int(index.sample_hashes[row]):
                good.append(row)
        if not good and len(probes) > 1:  # (one sample: a corrupt sample, named when read)
            a = index.span(probes[0])[0]
            raise IntegrityError(f"the shard does not match its index (all {len(probes)} "
                                 "samples checked when it was mapped differ): replaced, "
                                 "swapped with another shard, or changed since the index was "
                                 "written",
                                 path=self.shard_path(shard), offset=a,
                                 hint="run 'shardpack verify' on the dataset")
        self._seen(shard)[good] = True

    def check_rows(self, shard: int, rows: np.ndarray, buf, base: int = 0,
                   fresh: bool = False) -> None:
        """Check the stored bytes of samples ``rows`` of shard ``shard`` against the index's
        sample hashes: every time (``check="every"``, and whatever the mode for a ``fresh``
        read of the bytes), each sample once per process and copy of the shard ("once":
        ``checked``), or not at all ("none").  ``buf`` holds the shard's bytes from offset
        ``base`` on.  Raises :class:`IntegrityError` naming the shard and the first bad
        sample."""
        if self.check == "none":
            return
        index = self.index(shard)
        seen = self._seen(shard) if self.check == "once" and not fresh else None
        todo = rows if seen is None else rows[~seen[rows]]
        if not len(todo):
            return
        starts = index.starts[todo].astype(np.int64) - base
        ends = index.starts[todo + 1].astype(np.int64) - base
        # hashes computed in one C-driven pass (map), compared as arrays: per-sample Python
        # work was most of the cost for small samples
        outside = (starts < 0) | (ends > len(buf))
        if outside.any():
            inside = np.flatnonzero(~outside)
            starts_in, ends_in = starts[inside], ends[inside]
        else:  # (the usual case: no fancy-indexed copies)
            inside, starts_in, ends_in = slice(None), starts, ends
        got = np.zeros(len(todo), dtype=np.uint64)
        got[inside] = np.fromiter(map(fmt.sample_hash, map(buf.__getitem__, map(
            slice, starts_in.tolist(), ends_in.tolist()))), dtype=np.uint64,
            count=len(starts_in))
        bad = outside | (got != index.sample_hashes[todo])
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise self._mismatch(shard, index, int(todo[k]), int(starts[k]) + base)
        if seen is not None:
            seen[todo] = True

    def is_cached(self, shard: int) -> bool:
        """Whether the cache holds shard ``shard`` now (never, without a cache)."""
        return self.access.is_cached(shard)

    def warm(self, unit) -> None:
        """Fetch ahead one unit of the access mode (a shard into the cache, with its index
        first; a chunk into memory)."""
        if isinstance(unit, int):
            self.index(unit)
        self.access.warm(unit)

    def prefetcher(self, units: list, needs, ahead: int = 0):
        """A background fetcher for ``units`` (distinct, in order of first need; ``needs[i]`` is
        the first reading position that needs unit i); a do-nothing one when there is nothing
        to fetch ahead (local data, or prefetch=0)."""
        if not self.access.prefetches or self.prefetch <= 0 or not units:
            return NOTHING
        return Prefetcher(self, units, needs, self.prefetch, ahead)

    def fetch_pieces(self, ids) -> int:
        """Fast start for a cold cache: fetch the stored bytes of samples ``ids`` (global ids)
        whose shards are not in the cache yet with concurrent ranged reads, each checked against
        the index's sample hash, and keep them for one read each.  The first batch of a shuffled
        epoch draws from many shards; without this it waits until every one of them is
        downloaded whole.  Returns the number of requests made (0 for local data, no cache, or
        shards already cached)."""
        if not self.access.fast_start or len(ids) == 0:
            return 0
        shards, rows = self.locate_many(ids)
        missing = sorted({int(s) for s in shards.tolist()
                          if s not in self._buffers and not self.is_cached(s)})
        if not missing:
            return 0
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(16, len(missing))) as pool:
            list(pool.map(self.index, missing))  # the indexes, fetched side by side
        wanted = set(missing)
        spans = sorted({(s, r) + self.index(s).span(r)
                        for s, r in zip(shards.tolist(), rows.tolist(), strict=True)
                        if s in wanted})
        requests: list[list] = []  # [shard, start, end, [(row, start, end), ...]]
        for shard, row, start, end in spans:
            last = requests[-1] if requests else None
            if last and last[0] == shard and start - last[2] <= self.PIECE_GAP \
                    and end - last[1] <= self.PIECE_REQUEST:
                last[2] = max(last[2], end)
                last[3].append((row, start, end))
            else:
                requests.append([shard, start, end, [(row, start, end)]])

        got = self.storage.read_ranges([(self.shards[shard].name, first, last)
                                        for shard, first, last, _ in requests])
        pieces = {}
        for (shard, first, _, members), data in zip(requests, got, strict=True):
            data, index = memoryview(data), self.index(shard)
            for row, start, end in members:
                piece = data[start - first:end - first]
                if fmt.sample_hash(piece) != int(index.sample_hashes[row]):
                    raise IntegrityError("sample does not match its index hash (ranged read)",
                                         path=self.shard_path(shard), offset=start,
                                         key=index.key(row))
                pieces[(shard, row)] = piece
        with self._lock:
            self._pieces.update(pieces)
        return len(requests)

    @property
    def has_pieces(self) -> bool:
        return bool(self._pieces)

    def drop_pieces(self) -> None:
        """Forget samples fetched by :meth:`fetch_pieces` and not read."""
        with self._lock:
            self._pieces.clear()

    def sample_bytes(self, shard: int, row: int):
        """The stored bytes of one sample: a slice of a memory map, or of a fetched chunk (or a
        piece fetched ahead by :meth:`fetch_pieces`)."""
        if self._pieces:
            with self._lock:
                piece = self._pieces.pop((shard, row), None)
            if piece is not None:  # hash-checked when it was fetched
                return piece
        index = self.index(shard)
        start, end = index.span(row)
        buf = self.shard_buffer(shard)
        if buf is not None:
            piece = buf[start:end]
            self._check_one(shard, index, row, piece, start)
            return piece
        data, base = self.access.chunk_of(shard, row)
        piece = data[start - base:end - base]
        if len(piece) != end - start:
            raise FormatError(f"truncated shard: wanted {end - start} bytes, got {len(piece)}",
                              path=self.shard_path(shard), offset=start, key=index.key(row))
        # a chunk is a fresh read each time it is fetched: checked each time (no memo)
        self._check_one(shard, index, row, piece, start, fresh=True)
        return piece

    def _check_one(self, shard: int, index: fmt.ShardIndex, row: int, piece, offset: int,
                   fresh: bool = False) -> None:
        """:meth:`check_rows` for one sample whose stored bytes are ``piece`` (at ``offset``
        of the shard), without its array work: 10 us a sample of the per-sample path's 45
        went to it."""
        if self.check == "none":
            return
        seen = self._seen(shard) if self.check == "once" and not fresh else None
        if seen is not None and seen[row]:
            return
        end = int(index.starts[row + 1])
        if offset + len(piece) != end or fmt.sample_hash(piece) != int(index.sample_hashes[row]):
            raise self._mismatch(shard, index, row, offset)
        if seen is not None:
            seen[row] = True

    def _mismatch(self, shard: int, index: fmt.ShardIndex, row: int,
                  offset: int) -> IntegrityError:
        return mismatch(self.shard_path(shard), index, row, offset)

    def read(self, shard: int, row: int, views: bool = False) -> dict:
        """Sample ``row`` of shard ``shard``; with ``views``, fields are memoryviews of the
        stored bytes (no copy; for a caller that copies them into a batch at once)."""
        return decode_sample(self.index(shard), row, self.sample_bytes(shard, row),
                             self.shard_path(shard), views)

    def read_sample(self, i: int) -> dict:
        """Sample ``i`` of the dataset: a slice of a memory map (local) or one ranged read."""
        return self.read(*self.locate(i))

    def read_shard(self, shard: int, exact: bool = True) -> bytes:
        """The whole shard file, by one read: a local one must be a regular file (one line
        otherwise; never a FIFO's wait or /dev/zero's flood) of the size the manifest records.
        ``exact=False`` (verify, unpack: they name a wrong size themselves) reads a local file
        of any size, bounded by its fstat; a remote one is bounded by the manifest's size
        either way (shardpack.storage)."""
        entry = self.shards[shard]
        if self.storage.local:
            return read_regular(self.storage.path(entry.name), self.shard_path(shard), "shard",
                                entry.bytes if exact else None)
        return self.storage.read_bytes(entry.name)

    def iter_shard(self, shard: int):
        """Every sample of one shard, from one sequential read of the shard file."""
        index = self.index(shard)
        path = self.shard_path(shard)
        data = self.read_shard(shard)
        if len(data) != index.shard_bytes:
            raise FormatError(f"shard is {len(data)} bytes, the index says {index.shard_bytes}",
                              path=path, hint="the shard is truncated or replaced; run "
                                              "'shardpack verify'")
        view = memoryview(data)
        # a whole new read of the file: every sample checked, whatever was checked before
        self.check_rows(shard, np.arange(index.num_samples, dtype=np.int64), view, fresh=True)
        for row in range(index.num_samples):
            start, end = index.span(row)
            yield decode_sample(index, row, view[start:end], path)

    def __iter__(self):
        for shard in range(len(self.shards)):
            yield from self.iter_shard(shard)


def open_reader(url, storage_options: dict | None = None, **kwargs) -> DatasetReader:
    return DatasetReader(url, storage_options, **kwargs)


def mismatch(path: str, index: fmt.ShardIndex, row: int, offset: int) -> IntegrityError:
    """The error for sample ``row`` (at ``offset`` of shard ``path``) whose stored bytes do not
    match its index hash."""
    return IntegrityError("sample bytes do not match the index hash (corrupt shard)",
                          path=path, offset=offset, key=index.key(row),
                          hint="run 'shardpack verify' on the dataset")


def identity_of(st: os.stat_result, cached: bool = False) -> tuple:
    """What tells one copy of a shard from another: device, inode, size, mtime, and ctime,
    which every change through the file system moves (a write, a truncation, and the
    ``os.utime`` that puts an mtime back), so a file rewritten in place counts as another
    copy even with its mtime kept.  Not ctime for a ``cached`` copy: the cache moves it itself
    (its access-time stamps, for LRU), on every open by any reader; a new copy there is a new
    inode (a rename), and bytes changed in place are the hash check's to catch."""
    if cached:
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class _Mapped:
    """One shard's open map in a process: the view handed out, the mmap (whose ``size()`` is
    an fstat of the mapped file: the check before each use), the cache entry held open (or
    None), the file's path and its identity (:func:`identity_of`) when mapped."""

    __slots__ = ("view", "map", "entry", "path", "identity")

    def __init__(self, view, mapped, entry, path: str, identity: tuple):
        self.view, self.map, self.entry, self.path, self.identity = \
            view, mapped, entry, path, identity


def _map(path: str, expected: int, display: str,
         held: int = -1) -> tuple[memoryview, object, tuple]:
    """(read-only view of the file, its mmap (None for an empty file), its identity:
    :func:`identity_of`).  A regular file of the size the manifest records, or a one-line
    error.  ``held``: an open fd of the file (a cache entry's) to map instead of ``path``; it
    stays open."""
    if held >= 0:
        st = os.fstat(held)
        check_regular(st, display, "shard")
        fd = os.dup(held)
    else:
        fd, st = open_regular(path, display, "shard")
    try:
        if st.st_size != expected:
            raise IntegrityError(f"shard is {st.st_size} bytes, the manifest says {expected} "
                                 "(truncated or replaced)", path=display,
                                 hint="run 'shardpack verify'")
        identity = identity_of(st, cached=held >= 0)
        if not st.st_size:
            return memoryview(b""), None, identity
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        return memoryview(mapped), mapped, identity
    finally:
        os.close(fd)


def record_payload(index: fmt.ShardIndex, row: int, record, path: str):
    """The payload bytes of sample ``row`` given its stored ``record`` bytes (tar: the record
    itself; msgpack: CRC checked, then decompressed to exactly the size the index records)."""
    if index.shard_format == "tar":
        return record
    key = index.key(row)
    where = int(index.starts[row])
    if len(record) < fmt.RECORD_HEADER.size:
        raise FormatError("truncated record header", path=path, offset=where, key=key)
    stored_len, raw_len, crc, flags = fmt.RECORD_HEADER.unpack_from(record)
    body = record[fmt.RECORD_HEADER.size:]
    raw_size = int(index.raw_sizes[row])
    if stored_len != len(body) or raw_len != raw_size:
        raise FormatError(f"record sizes ({stored_len}, {raw_len}) disagree with the index "
                          f"({len(body)}, {raw_size})", path=path, offset=where, key=key)
    if fmt.crc32c(body) != crc:
        raise IntegrityError("record CRC32C mismatch", path=path, offset=where, key=key)
    if flags & ~fmt.FLAG_ZSTD:
        raise FormatError(f"unknown record flags {flags:#x}", path=path, offset=where, key=key)
    if not flags & fmt.FLAG_ZSTD:
        if len(body) != raw_size:  # (a flag flipped off: the header's flags have no CRC)
            raise FormatError(f"uncompressed record of {len(body)} bytes, the index says "
                              f"{raw_size}", path=path, offset=where, key=key)
        return body
    import zstandard

    try:
        payload = zstandard.ZstdDecompressor().decompress(bytes(body), max_output_size=raw_size)
    except zstandard.ZstdError as exc:
        raise FormatError(f"zstd: {exc}", path=path, offset=where, key=key) from None
    if len(payload) != raw_size:
        raise FormatError(f"decompressed to {len(payload)} bytes, the index says {raw_size}",
                          path=path, offset=where, key=key)
    return payload


def decode_sample(index: fmt.ShardIndex, row: int, record, path: str,
                  views: bool = False) -> dict:
    """``{"__key__": key, field: bytes, ...}`` from one sample's stored bytes (with ``views``,
    memoryviews of them)."""
    payload = record_payload(index, row, record, path)
    sample = {"__key__": index.key(row)}
    if views:
        payload = memoryview(payload)
        for name, off, size in index.sample_fields(row):
            sample[name] = payload[off:off + size]
        return sample
    for name, off, size in index.sample_fields(row):
        sample[name] = bytes(payload[off:off + size])
    return sample

