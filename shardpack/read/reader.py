"""Reader: manifest + lazily loaded shard indexes -> sample bytes, through the storage layer.

One ranged read fetches one sample (``read_sample``); ``iter_shard`` reads a whole shard with one
sequential read and slices every sample out of it.  Every read is bounded by sizes the index
records: zstd decompression gets ``max_output_size`` from the index and must produce exactly that
many bytes; msgpack unpacking (verification only) is limited to the record's own size.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from shardpack import format as fmt
from shardpack.core.deprecation import renamed
from shardpack.core.errors import (RESUME, DatasetNotFoundError, FormatError, IntegrityError,
                                   ShardpackError)
from shardpack.read.access import MAX_OPEN_SHARDS, Burst, make_access
from shardpack.read.checks import SampleChecks
from shardpack.read.mapping import ShardMaps
from shardpack.read.prefetch import NOTHING, Prefetcher
from shardpack.storage import Storage, storage_options_by_keyword


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
    kind = storage.kind(request=False)  # (a remote folder: no request to tell)
    if kind is None:
        why = "the path does not exist"
    elif kind in ("file", "other"):
        why = "a file, not a dataset folder"
    else:
        try:
            unfinished = storage.exists(fmt.STATE_NAME)
        except (OSError, ShardpackError):  # no answer: the message stays without a hint
            unfinished = False
        if unfinished:
            hint = ("a pack into this folder has not finished (or is still running): to finish "
                    f"it, run the same pack or convert command again with {RESUME}")
    return DatasetNotFoundError(f"no shardpack dataset here ({why})", path=storage.url,
                                hint=hint)


class DatasetReader(ShardMaps, SampleChecks):
    """A dataset's manifest, its shard indexes (loaded when first needed, checked against the
    manifest), and its samples' bytes, each checked against its index hash when read
    (``check``: every time, the default; "once" per process and copy of the shard; "none").

    How shard bytes are reached is the access mode (shardpack/read/access.py), chosen once here:
    local files are mapped where they are; remote shards go through the shared cache at
    ``cache_dir`` (fetched whole, verified, mapped), or without one by ranged reads of chunks.
    ``prefetch`` shards (or chunks) are fetched ahead by a background :class:`Prefetcher`
    (shardpack/read/prefetch.py).  ``burst`` (an :class:`~shardpack.read.access.Burst`) says what
    is read at once, which sizes what the mode keeps.

    Args:
        dataset: the dataset's folder or URL (``url=`` is its deprecated spelling).
        storage_options: fsspec options, plus shardpack's own (docs/remote.md); keyword-only
            (by position it is deprecated).
        cache_dir: the shared cache for remote shards, or None (ranged reads).
        cache_limit: the bytes the cache may hold.
        prefetch: shards (or chunks) fetched ahead.
        trust_storage: the older spelling of ``check="none"``.
        burst: what is read at once (:class:`~shardpack.read.access.Burst`).
        check: how often a sample is hashed against its index (:meth:`check_rows`):
            ``"every"`` read (the default), ``"once"`` per process and copy of its shard, or
            ``"none"`` for storage the user trusts; shard identity at mapping, index hashes
            and the shard's size before each use are checked in every mode
            (docs/reading.md, "Integrity").
    """

    MAX_OPEN_SHARDS = MAX_OPEN_SHARDS
    PIECE_GAP = 64 << 10      # fetch_pieces: samples closer than this share one request
    PIECE_REQUEST = 4 << 20   # ... up to this many bytes a request

    @renamed(url="dataset")
    @storage_options_by_keyword
    def __init__(self, dataset, *, storage_options: dict | None = None, cache_dir=None,
                 cache_limit="50GB", prefetch: int = 2, trust_storage: bool = False,
                 burst: Burst | None = None, check: str | None = None):
        self.storage = Storage(dataset, storage_options)
        self.check = check_mode(check, trust_storage)
        self.trust_storage = self.check == "none"
        self.keys_token: str | None = None  # serve_keys
        self.prefetch = prefetch
        try:  # (a local one: a regular file, never a FIFO's wait or /dev/zero's flood)
            data = self.storage.read_manifest()
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
        self._buffers: OrderedDict = OrderedDict()  # shard -> its open map (mapping.Mapped)
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
        """The dataset's field names (the manifest's)."""
        return list(self.manifest.fields)

    def shard_path(self, shard: int) -> str:
        """The name users see for shard number ``shard``: its URL or path.

        Args:
            shard: a shard number.
        """
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
        """(shard, row in shard) of sample ``i``.

        Args:
            i: a sample id of the dataset.
        """
        return locate(self.offsets, i, "a dataset")

    def locate_many(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row in shard) of each sample id of ``ids`` (int64 arrays).

        Args:
            ids: sample ids of the dataset.
        """
        return locate_many(self.offsets, ids)

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
        """Whether samples fetched by :meth:`fetch_pieces` wait to be read."""
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
        otherwise; never a FIFO's wait or /dev/zero's flood); a remote one is bounded by the
        manifest's size either way (shardpack/storage).

        Args:
            shard: a shard number.
            exact: whether it must have the size the manifest records (False: verify and
                unpack, which name a wrong size themselves, read a local file of any size,
                bounded by its fstat).
        """
        entry = self.shards[shard]
        return self.storage.read_bytes(entry.name, size=entry.bytes if exact else None)

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


@renamed(url="dataset")
@storage_options_by_keyword
def open_reader(dataset, *, storage_options: dict | None = None, **kwargs) -> DatasetReader:
    """The :class:`DatasetReader` of the dataset at ``dataset``.

    Args:
        dataset: the dataset's folder or URL (``url=`` is its deprecated spelling).
        storage_options: fsspec options, plus shardpack's own; keyword-only (by position it is
            deprecated).
        **kwargs: :class:`DatasetReader`'s other arguments.
    """
    return DatasetReader(dataset, storage_options=storage_options, **kwargs)


def record_payload(index: fmt.ShardIndex, row: int, record, path: str):
    """The payload bytes of sample ``row`` given its stored ``record`` bytes (tar: the record
    itself; msgpack: CRC checked, then decompressed to exactly the size the index records):
    :meth:`~shardpack.format.ShardCodec.payload` of the shard's codec."""
    return index.codec.payload(index, row, record, path)


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

