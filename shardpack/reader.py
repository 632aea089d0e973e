"""Reader: manifest + lazily loaded shard indexes -> sample bytes, through the storage layer.

One ranged read fetches one sample (``read_sample``); ``iter_shard`` reads a whole shard with one
sequential read and slices every sample out of it.  Every read is bounded by sizes the index
records: zstd decompression gets ``max_output_size`` from the index and must produce exactly that
many bytes; msgpack unpacking (verification only) is limited to the record's own size.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict

import numpy as np

from . import format as fmt
from .errors import DatasetNotFoundError, FormatError, IntegrityError
from .storage import Storage


class DatasetReader:
    def __init__(self, url, storage_options: dict | None = None):
        self.storage = Storage(url, storage_options)
        try:
            data = self.storage.read_bytes(fmt.MANIFEST_NAME)
        except DatasetNotFoundError:
            raise DatasetNotFoundError(
                f"no shardpack dataset here ({fmt.MANIFEST_NAME} is missing)",
                path=self.storage.url,
                hint="an interrupted pack has no manifest: rerun it with --resume") from None
        self.manifest = fmt.decode_manifest(data, self.storage.display(fmt.MANIFEST_NAME))
        self.shards: list[dict] = self.manifest["shards"]
        self.offsets = np.zeros(len(self.shards) + 1, dtype=np.int64)
        np.cumsum([s["samples"] for s in self.shards], out=self.offsets[1:])
        self._indexes: dict[int, fmt.ShardIndex] = {}
        self._buffers: OrderedDict[int, memoryview] = OrderedDict()

    MAX_OPEN_SHARDS = 64

    def __getstate__(self):
        # memory maps and loaded indexes stay in their process: a worker opens its own, lazily
        state = dict(self.__dict__)
        state["_indexes"], state["_buffers"] = {}, OrderedDict()
        return state

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def fields(self) -> list[str]:
        return self.manifest["fields"]

    def shard_path(self, shard: int) -> str:
        return self.storage.display(self.shards[shard]["name"])

    def index(self, shard: int) -> fmt.ShardIndex:
        """The index of shard number ``shard``, checked against the manifest's size and hash."""
        cached = self._indexes.get(shard)
        if cached is not None:
            return cached
        entry = self.shards[shard]
        path = self.storage.display(entry["index"])
        data = self.storage.read_bytes(entry["index"])
        if len(data) != entry["index_bytes"] or fmt.content_hash(data) != entry["index_hash"]:
            raise IntegrityError(f"index does not match the manifest ({len(data)} bytes, "
                                 f"manifest says {entry['index_bytes']})", path=path)
        index = fmt.decode_index(data, path)
        if index.num_samples != entry["samples"] or index.shard_bytes != entry["bytes"]:
            raise IntegrityError("index disagrees with the manifest on sample count or shard "
                                 "size", path=path)
        self._indexes[shard] = index
        return index

    def locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for a dataset of {len(self)} samples")
        shard = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return shard, i - int(self.offsets[shard])

    def shard_buffer(self, shard: int) -> memoryview | None:
        """A read-only memory map of a local shard (None for remote storage), checked against the
        manifest's size; at most MAX_OPEN_SHARDS stay open per process."""
        buf = self._buffers.get(shard)
        if buf is not None:
            self._buffers.move_to_end(shard)
            return buf
        if not self.storage.local:
            return None
        entry = self.shards[shard]
        path = self.storage.path(entry["name"])
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise DatasetNotFoundError("shard is missing", path=self.shard_path(shard)) from None
        try:
            size = os.fstat(fd).st_size
            if size != entry["bytes"]:
                raise FormatError(f"shard is {size} bytes, the manifest says {entry['bytes']} "
                                  "(truncated or replaced)", path=self.shard_path(shard),
                                  hint="run 'shardpack verify'")
            buf = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ)) if size else \
                memoryview(b"")
        finally:
            os.close(fd)
        self._buffers[shard] = buf
        if len(self._buffers) > self.MAX_OPEN_SHARDS:
            self._buffers.popitem(last=False)
        return buf

    def sample_bytes(self, shard: int, row: int):
        """The stored bytes of one sample: a slice of the memory map, or one ranged read."""
        index = self.index(shard)
        start, end = index.span(row)
        buf = self.shard_buffer(shard)
        if buf is not None:
            return buf[start:end]
        data = self.storage.read_bytes(self.shards[shard]["name"], start, end)
        if len(data) != end - start:
            raise FormatError(f"truncated shard: wanted {end - start} bytes, got {len(data)}",
                              path=self.shard_path(shard), offset=start, key=index.key(row))
        return data

    def read(self, shard: int, row: int) -> dict:
        return decode_sample(self.index(shard), row, self.sample_bytes(shard, row),
                             self.shard_path(shard))

    def read_sample(self, i: int) -> dict:
        """Sample ``i`` of the dataset: a slice of a memory map (local) or one ranged read."""
        return self.read(*self.locate(i))

    def iter_shard(self, shard: int):
        """Every sample of one shard, from one sequential read of the shard file."""
        index = self.index(shard)
        data = self.storage.read_bytes(self.shards[shard]["name"])
        path = self.shard_path(shard)
        if len(data) != index.shard_bytes:
            raise FormatError(f"shard is {len(data)} bytes, the index says {index.shard_bytes}",
                              path=path, hint="the shard is truncated or replaced; run "
                                              "'shardpack verify'")
        view = memoryview(data)
        for row in range(index.num_samples):
            start, end = index.span(row)
            yield decode_sample(index, row, view[start:end], path)

    def __iter__(self):
        for shard in range(len(self.shards)):
            yield from self.iter_shard(shard)


def open_reader(url, storage_options: dict | None = None) -> DatasetReader:
    return DatasetReader(url, storage_options)


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


def decode_sample(index: fmt.ShardIndex, row: int, record, path: str) -> dict:
    """``{"__key__": key, field: bytes, ...}`` from one sample's stored bytes."""
    payload = record_payload(index, row, record, path)
    sample = {"__key__": index.key(row)}
    for name, off, size in index.sample_fields(row):
        sample[name] = bytes(payload[off:off + size])
    return sample

