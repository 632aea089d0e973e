"""Several datasets read as one: the sources of a mixture and the reader that joins them.

``ShardDataset([a, b], weights=[3, 1])`` mixes datasets (docs/mixing.md).  The order of a mixed
epoch is a pure function (:func:`shardpack.order.partition.mix_order`); this module holds what
touches
data: :class:`Source` (one dataset of a mixture and how much of it an epoch takes) and
:class:`MixReader`, which presents the sources' readers as one reader whose shards are the
sources' shards one after another (source 0's first), so the batch gatherer, the key lookup and
the sample checks work on a mixture unchanged.  A mixture-global sample id is the source's offset
plus the sample's id in its source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from shardpack.read.access import Burst
from shardpack.read.reader import DatasetReader, locate, locate_many

SOURCE_BITS = 56  # fetch-ahead unit keys: the source in the top bits, its own key below


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture.  How much of it an epoch takes, one of:

    * ``weight`` (relative): the epoch's samples left after the fixed sources are shared by
      weight (no source with a weight: by the sources' sizes, each sample once);
    * ``repeat=k``: k passes of the source per epoch (k may be fractional: 0.5 is half a pass);
    * ``samples=n``: n samples per epoch.

    ``storage_options`` and ``cache_dir`` are the source's own (None: the dataset's)."""

    path: object
    weight: float | None = None
    repeat: float | None = None
    samples: int | None = None
    storage_options: dict | None = None
    cache_dir: object = None

    def __post_init__(self):
        given = [x is not None for x in (self.weight, self.repeat, self.samples)]
        if sum(given) > 1:
            raise ValueError(f"source {self.path!s}: give one of weight, repeat, samples")
        for name in ("weight", "repeat", "samples"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and value != float("inf")):
                raise ValueError(f"source {self.path!s}: {name} must be a finite number >= 0, "
                                 f"got {value!r}")
        if self.samples is not None and int(self.samples) != self.samples:
            raise ValueError(f"source {self.path!s}: samples must be a whole number, got "
                             f"{self.samples!r}")

    def fixed(self, size: int) -> int | None:
        """Samples per epoch for an absolute source (repeat or samples), else None."""
        if self.samples is not None:
            return int(self.samples)
        if self.repeat is not None:
            return int(round(self.repeat * size))
        return None


def sources_of(paths, weights: Sequence[float] | None) -> list[Source]:
    """The user's list (paths or :class:`Source`) with ``weights=`` applied, as Sources."""
    items = [p if isinstance(p, Source) else Source(p) for p in paths]
    if not items:
        raise ValueError("a mixture needs at least one source")
    if len(items) >= 1 << (63 - SOURCE_BITS):
        raise ValueError(f"a mixture of {len(items)} sources: at most "
                         f"{(1 << (63 - SOURCE_BITS)) - 1}")
    if weights is not None:
        if len(weights) != len(items):
            raise ValueError(f"{len(weights)} weights for {len(items)} sources")
        if any(s.repeat is not None or s.samples is not None or s.weight is not None
               for s in items):
            raise ValueError("weights= and Source(weight/repeat/samples) both given: use one")
        items = [Source(s.path, weight=float(w), storage_options=s.storage_options,
                        cache_dir=s.cache_dir) for s, w in zip(items, weights, strict=True)]
    return items


class _MixAccess:
    """Fetch-ahead across sources: unit keys carry their source in the top bits."""

    fast_start = False

    def __init__(self, readers: Sequence[DatasetReader], first: np.ndarray):
        self.readers, self.first = readers, first
        self.prefetches = any(r.access.prefetches for r in readers)

    def _split(self, shards: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.first, shards, side="right") - 1

    def unit_keys(self, shards: np.ndarray, rows: np.ndarray) -> np.ndarray:
        src = self._split(shards)
        keys = np.zeros(len(shards), dtype=np.int64)
        for s in np.unique(src).tolist():
            sel = src == s
            own = self.readers[s].access.unit_keys(shards[sel] - self.first[s], rows[sel])
            keys[sel] = (s << SOURCE_BITS) | np.asarray(own, dtype=np.int64)
        return keys

    def unit(self, key: int):
        s = key >> SOURCE_BITS
        return s, self.readers[s].access.unit(key & ((1 << SOURCE_BITS) - 1))

    def all_cached(self, keys) -> bool:
        mask = (1 << SOURCE_BITS) - 1
        return all(self.readers[k >> SOURCE_BITS].access.all_cached([k & mask]) for k in keys)

    def ahead(self, window: int) -> int:
        return max(r.access.ahead(window) for r in self.readers)


class MixReader:
    """The readers of a mixture's sources as one reader (see the module docstring).  Fields are
    the union of the sources' fields; a sample read on its own gets an empty value for a field
    its source lacks, as the batch gatherer gives it (docs/mixing.md, "Fields")."""

    def __init__(self, sources: Sequence[Source], *, storage_options=None, cache_dir=None,
                 cache_limit="50GB", prefetch: int = 2, trust_storage: bool = False,
                 burst: Burst | None = None, check: str | None = None):
        self.sources = list(sources)
        self.readers = [DatasetReader(s.path, storage_options=s.storage_options
                                      if s.storage_options is not None else storage_options,
                                      cache_dir=s.cache_dir if s.cache_dir is not None
                                      else cache_dir, cache_limit=cache_limit,
                                      prefetch=prefetch, trust_storage=trust_storage,
                                      burst=burst, check=check) for s in self.sources]
        self.prefetch = prefetch
        self.check = self.readers[0].check  # (the same in every source)
        self.trust_storage = self.check == "none"
        self.shards = tuple(e for r in self.readers for e in r.shards)
        self.first = np.zeros(len(self.readers) + 1, dtype=np.int64)  # each source's shard 0
        np.cumsum([len(r.shards) for r in self.readers], out=self.first[1:])
        self.starts = np.zeros(len(self.readers) + 1, dtype=np.int64)  # each source's id 0
        np.cumsum([len(r) for r in self.readers], out=self.starts[1:])
        self.offsets = np.concatenate([r.offsets[:-1] + self.starts[i]
                                       for i, r in enumerate(self.readers)] + [self.starts[-1:]])
        self.access = _MixAccess(self.readers, self.first)
        self.storage = self.readers[0].storage
        self.keys_token: str | None = None
        seen: dict[str, None] = {}
        for r in self.readers:
            seen.update(dict.fromkeys(r.fields))
        self._fields = list(seen)
        self.has_pieces = False

    @property
    def manifest(self):
        """The first source's manifest (what the sources share)."""
        return self.readers[0].manifest

    @property
    def classes(self):
        """The class names, where every source has the same ones; else None (labels are each
        source's own: tell them apart by ``__source__``)."""
        names = {tuple(r.manifest.classes or ()) for r in self.readers}
        return list(names.pop()) if len(names) == 1 else None

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def fields(self) -> list[str]:
        """The union of the sources' fields, in first-seen order."""
        return list(self._fields)

    def source_sizes(self) -> list[list[int]]:
        """Each source's shard sizes in samples."""
        return [[e.samples for e in r.shards] for r in self.readers]

    def source_of(self, ids) -> np.ndarray:
        """The source of each mixture-global sample id."""
        return np.searchsorted(self.starts, np.asarray(ids, dtype=np.int64), side="right") - 1

    # -- the reader interface, shard k = (source, its own shard) ------------------------------
    def _own(self, shard: int) -> tuple[DatasetReader, int]:
        s = int(np.searchsorted(self.first, shard, side="right")) - 1
        return self.readers[s], shard - int(self.first[s])

    def shard_path(self, shard: int) -> str:
        """The name users see for shard ``shard`` (its source's).

        Args:
            shard: a shard number of the mixture.
        """
        reader, own = self._own(shard)
        return reader.shard_path(own)

    def index(self, shard: int):
        """The index of shard ``shard`` (its source's, checked).

        Args:
            shard: a shard number of the mixture.
        """
        reader, own = self._own(shard)
        return reader.index(own)

    def locate(self, i: int) -> tuple[int, int]:
        """(shard, row in shard) of mixture-global sample ``i``.

        Args:
            i: a mixture-global sample id.
        """
        return locate(self.offsets, i, "a mixture")

    def locate_many(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """(shard, row in shard) of each mixture-global sample id (int64 arrays).

        Args:
            ids: mixture-global sample ids.
        """
        return locate_many(self.offsets, ids)

    def shard_buffer(self, shard: int):
        """The source's map of shard ``shard`` (None without one).

        Args:
            shard: a shard number of the mixture.
        """
        reader, own = self._own(shard)
        return reader.shard_buffer(own)

    def revalidate(self) -> int:
        """Every source's :meth:`~shardpack.read.reader.DatasetReader.revalidate`; how many
        maps were dropped."""
        return sum(r.revalidate() for r in self.readers)

    def unchecked(self, shard: int, rows: np.ndarray) -> np.ndarray:
        """The rows of ``rows`` the next check would hash (the source's rule).

        Args:
            shard: a shard number of the mixture.
            rows: rows of that shard.
        """
        reader, own = self._own(shard)
        return reader.unchecked(own, rows)

    def check_rows(self, shard: int, rows, buf, base: int = 0, fresh: bool = False) -> None:
        """Check samples ``rows`` of shard ``shard`` against its index (the source's rule).

        Args:
            shard: a shard number of the mixture.
            rows: rows of that shard.
            buf: the shard's bytes from offset ``base`` on.
            base: the offset of ``buf`` in the shard.
            fresh: whether ``buf`` is a fresh read (checked whatever the mode).
        """
        reader, own = self._own(shard)
        reader.check_rows(own, rows, buf, base, fresh)

    def label_memo(self, shard: int, field: str, create: bool = False):
        """The source's parsed labels of field ``field`` of shard ``shard``.

        Args:
            shard: a shard number of the mixture.
            field: the label field.
            create: make the memo when there is none.
        """
        reader, own = self._own(shard)
        return reader.label_memo(own, field, create)

    def serve_keys(self, token: str) -> None:
        """Keys of batches made in workers are looked up in this process (the pool ``token``).

        Args:
            token: the slot pool's name.
        """
        self.keys_token = token

    def is_cached(self, shard: int) -> bool:
        """Whether the source's cache holds shard ``shard`` now.

        Args:
            shard: a shard number of the mixture.
        """
        reader, own = self._own(shard)
        return reader.is_cached(own)

    def read(self, shard: int, row: int, views: bool = False) -> dict:
        """Sample ``row`` of shard ``shard``, with an empty value for every field of the
        mixture its source lacks.

        Args:
            shard: a shard number of the mixture.
            row: a row of it.
            views: fields as memoryviews of the stored bytes.
        """
        reader, own = self._own(shard)
        sample = reader.read(own, row, views)
        for name in self._fields:  # every sample has every field of the mixture
            if name not in sample:
                sample[name] = memoryview(b"") if views else b""
        return sample

    def read_sample(self, i: int) -> dict:
        """Mixture-global sample ``i``.

        Args:
            i: a mixture-global sample id.
        """
        return self.read(*self.locate(i))

    # -- fetching ahead and the fast start: per source ---------------------------------------
    def warm(self, unit) -> None:
        """Fetch ahead one unit of one source.

        Args:
            unit: (source, its own unit).
        """
        s, own = unit
        self.readers[s].warm(own)

    def prefetcher(self, units: list, needs, ahead: int = 0):
        """A background fetcher for ``units`` (see
        :meth:`~shardpack.read.reader.DatasetReader.prefetcher`).

        Args:
            units: (source, unit) of each unit, in order of first need.
            needs: the first reading position that needs each unit.
            ahead: positions fetched ahead beyond the current batch.
        """
        from shardpack.read.prefetch import NOTHING, Prefetcher

        if not self.access.prefetches or self.prefetch <= 0 or not units:
            return NOTHING
        return Prefetcher(self, units, needs, self.prefetch, ahead)

    def fetch_pieces(self, ids) -> int:
        """0: no fast start for mixtures (each source's shards come whole, docs/mixing.md).

        Args:
            ids: mixture-global sample ids.
        """
        return 0  # not for mixtures: each source's shards come whole (docs/mixing.md)

    def drop_pieces(self) -> None:
        """Nothing: a mixture fetches no pieces."""
