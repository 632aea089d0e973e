"""Map-style access to a packed dataset: ``ds[i]`` and ``ds.get(key)``."""

from __future__ import annotations

from typing import Callable

from shardpack.read.reader import DatasetReader


class MapDataset:
    """Map-style access to a packed dataset: ``ds[i]`` and ``ds.get(key)``, one ranged read (or
    memory-map slice) per sample.  Works as a map-style dataset for ``DataLoader``."""

    def __init__(self, path, *, decode: Callable | None = None,
                 storage_options: dict | None = None, trust_storage: bool = False,
                 check: str | None = None):
        """``check``: as :class:`ShardDataset`'s (every read by default)."""
        self.reader = DatasetReader(path, storage_options=storage_options,
                                    trust_storage=trust_storage, check=check)
        self.decode = decode
        self._keys: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int) -> dict:
        if i < 0:
            i += len(self)
        sample = self.reader.read_sample(i)
        sample["__index__"] = i
        return self.decode(sample) if self.decode else sample

    def index_of(self, key: str) -> int:
        """The global index of the sample named ``key`` (KeyError if none is).

        Args:
            key: the sample's key.
        """
        if self._keys is None:  # built on first use: one dict over all keys
            keys: dict[str, int] = {}
            for shard in range(len(self.reader.shards)):
                base = int(self.reader.offsets[shard])
                for row, k in enumerate(self.reader.index(shard).keys()):
                    keys[k] = base + row
            self._keys = keys
        try:
            return self._keys[key]
        except KeyError:
            raise KeyError(f"no sample with key {key!r} in {self.reader.storage.url}") from None

    def get(self, key: str) -> dict:
        """The sample named ``key``, as ``ds[i]`` gives it.

        Args:
            key: the sample's key.
        """
        return self[self.index_of(key)]


def open_dataset(path, **kwargs) -> MapDataset:
    """A :class:`MapDataset` of ``path``.

    Args:
        path: a packed dataset (a folder or a URL).
        **kwargs: :class:`MapDataset`'s (decode, storage_options, trust_storage, check).
    """
    return MapDataset(path, **kwargs)
