"""msgpack shards: a file header, then records of [record header | payload], each payload a
msgpack map ``{"__key__": key, field: bin, ...}``."""

from __future__ import annotations

import struct
from typing import Sequence

import msgpack
import numpy as np

from shardpack.core.errors import FormatError, VersionError

from .hashing import crc32c
from .names import FORMAT_VERSION, KEY_FIELD, READ_VERSIONS

MSGPACK_MAGIC = b"SPKMSGPK"
MSGPACK_HEADER = struct.Struct("<8sII")      # magic, version, reserved
RECORD_HEADER = struct.Struct("<QQII")       # stored_len, raw_len, crc32c(stored), flags
RECORD_HEADER_DTYPE = np.dtype([("stored", "<u8"), ("raw", "<u8"), ("crc", "<u4"),
                                ("flags", "<u4")])  # the same, for many records at once
FLAG_ZSTD = 1
MAX_EXPANSION = 1024  # a zstd record may decompress to at most this times its stored size + 1 MiB


def msgpack_file_header() -> bytes:
    """The 16 bytes a msgpack shard starts with: magic, format version, reserved."""
    return MSGPACK_HEADER.pack(MSGPACK_MAGIC, FORMAT_VERSION, 0)


def check_msgpack_file_header(data: bytes, path: str | None = None) -> None:
    """Raise :class:`FormatError` (or :class:`VersionError`) unless ``data`` starts with a
    msgpack shard header of a version this release reads.

    Args:
        data: the shard's first bytes (at least the header's 16, else it is truncated).
        path: the shard, for the error.
    """
    if len(data) < MSGPACK_HEADER.size:
        raise FormatError("truncated shard header", path=path, offset=0)
    magic, version, _ = MSGPACK_HEADER.unpack_from(data)
    if magic != MSGPACK_MAGIC:
        raise FormatError(f"not a shardpack msgpack shard (magic {magic!r}, expected "
                          f"{MSGPACK_MAGIC!r})", path=path, offset=0)
    if version not in READ_VERSIONS:
        raise VersionError(f"unsupported shard version: expected one of {READ_VERSIONS}, found "
                           f"{version}", path=path, offset=0)


_packb = msgpack.Packer(use_bin_type=True).pack
_packed_names: dict[str, bytes] = {}
_PACKED_KEY_FIELD = _packb(KEY_FIELD)


def _bin_header(n: int) -> bytes:
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _map_header(n: int) -> bytes:
    return bytes((0x80 | n,)) if n < 16 else b"\xde" + n.to_bytes(2, "big")


def encode_payload(key: str, fields: Sequence[tuple[str, bytes]]) -> tuple[bytes, list[int]]:
    """A msgpack map ``{"__key__": key, field: bin, ...}`` (fields in the given order) and the
    offset of each field's bytes inside it, so readers can slice fields without unpacking.

    Args:
        key: the sample's key.
        fields: ``(name, bytes)`` of each field, in the order to write them.
    """
    parts, offsets, _ = payload_parts(key, fields)
    return b"".join(parts), offsets


def payload_parts(key: str, fields: Sequence[tuple[str, object]]) -> tuple[list, list[int], int]:
    """:func:`encode_payload` before the join: the map's encoded pieces with each field's value
    as given (bytes, or a sized stand-in for bytes copied later), the field offsets, and the
    payload's size.

    Args:
        key: the sample's key.
        fields: ``(name, value)`` of each field, in the order to write them.
    """
    parts = [_map_header(len(fields) + 1), _PACKED_KEY_FIELD, _packb(key)]
    size = len(parts[0]) + len(parts[1]) + len(parts[2])
    offsets = []
    for name, value in fields:
        head = _packed_names.get(name)
        if head is None:
            head = _packed_names.setdefault(name, _packb(name))
        bin_head = _bin_header(len(value))
        size += len(head) + len(bin_head)
        offsets.append(size)
        size += len(value)
        parts += (head, bin_head, value)
    return parts, offsets, size


def record_header(stored: bytes, raw_len: int, zstd: bool) -> bytes:
    """The 24-byte header of a record: stored size, payload size, CRC32C of the stored bytes,
    flags.

    Args:
        stored: the record's stored bytes (the payload, compressed or not).
        raw_len: the payload's size.
        zstd: whether ``stored`` is zstd-compressed.
    """
    return RECORD_HEADER.pack(len(stored), raw_len, crc32c(stored), FLAG_ZSTD if zstd else 0)


def decode_payload(raw: bytes, max_fields: int) -> dict:
    """Unpack a record payload with every size bounded by the payload itself; no ext types.

    Args:
        raw: the payload.
        max_fields: the most fields the map may hold (the shard's field names).
    """
    try:
        obj = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True,
                              max_bin_len=len(raw), max_str_len=len(raw), max_array_len=0,
                              max_map_len=max_fields + 1, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise FormatError(f"bad msgpack payload: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get(KEY_FIELD), str):
        raise FormatError("msgpack payload is not a map with a '__key__' string")
    for name, value in obj.items():
        if name != KEY_FIELD and not isinstance(value, bytes):
            raise FormatError(f"field {name!r} is {type(value).__name__}, expected bytes")
    return obj
