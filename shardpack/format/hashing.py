"""The format's checksums: xxh3-128 of whole files (the manifest), xxh3-64 of each sample's stored
bytes (the index), CRC32C of each msgpack record's stored bytes."""

from __future__ import annotations

import functools

import crc32c as _crc32c
import numpy as np
import xxhash

from shardpack.core.extensions import optional_extension

RANGES_ENV = "SHARDPACK_HASH_RANGES"  # "0": never use the extension (benchmarks compare both)


def content_hash(data) -> str:
    """The manifest's shard and index hash: xxh3-128, hex.

    Args:
        data: the file's bytes (any bytes-like).
    """
    return xxhash.xxh3_128_hexdigest(data)


def new_content_hasher():
    """A fresh incremental xxh3-128 hasher, for files hashed as they are written or read."""
    return xxhash.xxh3_128()


# The index's per-sample hash over the sample's stored bytes: xxh3-64, as an int.  Bound
# directly, not wrapped: readers call it once per sample on their first read, and a Python
# wrapper was a quarter of that cost for 1 KB samples (docs/benchmarks.md, "Sample checks").
sample_hash = xxhash.xxh3_64_intdigest


@functools.lru_cache(maxsize=None)
def ranges_extension():
    """The optional C extension ``shardpack.format.libxxh3ranges`` (the system libxxhash), or None:
    not built, libxxhash.so.0 missing, or turned off by ``SHARDPACK_HASH_RANGES=0``."""
    return optional_extension("shardpack.format.libxxh3ranges", RANGES_ENV)


def sample_hashes(buf, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """:func:`sample_hash` of ``buf[starts[i]:ends[i]]`` for every i, as uint64: in one call that
    releases the GIL where the extension is built (docs/reading.md, "Integrity"), else one
    xxhash call a range.  The same digests either way.

    Args:
        buf: the bytes (any bytes-like; a shard's memory map).
        starts: int64 range starts, each within ``buf``.
        ends: int64 range ends, each from its start to ``len(buf)``.
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    ends = np.ascontiguousarray(ends, dtype=np.int64)
    out = np.empty(len(starts), dtype=np.uint64)
    ext = ranges_extension()
    if ext is not None:
        ext.hash_ranges(buf, starts, ends, out)
        return out
    if len(starts) and (starts.min() < 0 or np.any(starts > ends) or ends.max() > len(buf)):
        raise ValueError(f"a range is outside the buffer of {len(buf)} bytes")
    view = memoryview(buf)  # (slices of a memoryview share the bytes: no copies)
    out[:] = np.fromiter(map(sample_hash, map(view.__getitem__, map(
        slice, starts.tolist(), ends.tolist()))), dtype=np.uint64, count=len(starts))
    return out


def crc32c(data) -> int:
    """CRC32C of ``data``, as msgpack record headers store it.

    Args:
        data: the record's stored bytes.
    """
    return _crc32c.crc32c(data)


def crc32c_function():
    """The CRC32C function itself, for loops over many records (no wrapper call each)."""
    return _crc32c.crc32c
