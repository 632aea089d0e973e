"""The format's checksums: xxh3-128 of whole files (the manifest), xxh3-64 of each sample's stored
bytes (the index), CRC32C of each msgpack record's stored bytes."""

from __future__ import annotations

import crc32c as _crc32c
import xxhash


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


def crc32c(data) -> int:
    """CRC32C of ``data``, as msgpack record headers store it.

    Args:
        data: the record's stored bytes.
    """
    return _crc32c.crc32c(data)


def crc32c_function():
    """The CRC32C function itself, for loops over many records (no wrapper call each)."""
    return _crc32c.crc32c
