"""msgpack shards (``.spk``): a file header, then one record a sample, [record header | payload],
the payload a msgpack map of the sample's fields, optionally zstd-compressed (docs/format.md,
"msgpack shards")."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from shardpack.core.errors import FormatError, IntegrityError

from .hashing import crc32c
from .names import KEY_FIELD
from .records import (
    FLAG_ZSTD, MAX_EXPANSION, MSGPACK_HEADER, RECORD_HEADER, RECORD_HEADER_DTYPE,
    check_msgpack_file_header, decode_payload, encode_payload, msgpack_file_header,
    payload_parts, record_header,
)
from .shardcodec import ShardCodec


class MsgpackCodec(ShardCodec):
    """The ``msgpack`` shard format."""

    name = "msgpack"
    suffix = ".spk"
    code = 1
    compressions = ("none", "zstd")
    payload_offset = RECORD_HEADER.size
    field_overhead = 8  # the field name's and the bin value's msgpack headers, about
    framed_records = True
    max_field = (1 << 32) - 1  # a msgpack bin 32 value

    def sample_overhead(self, key: str) -> int:
        """The record header, the map header and the key entry, about.

        Args:
            key: the sample's key.
        """
        return 40 + len(key)

    def file_header(self) -> bytes:
        """Magic, format version, reserved (16 bytes)."""
        return msgpack_file_header()

    def encode_sample(self, key: str, fields: Sequence[tuple[str, bytes]],
                      compressor=None) -> tuple[bytes, list[int], int]:
        """The record header and the payload (compressed by ``compressor`` when given), the
        field offsets in the payload, and the payload's size.

        Args:
            key: the sample's key.
            fields: ``(name, bytes)`` of each field, in the order to write them.
            compressor: a ``zstandard.ZstdCompressor``, or None.
        """
        payload, offsets = encode_payload(key, fields)
        stored = compressor.compress(payload) if compressor else payload
        return (record_header(stored, len(payload), compressor is not None) + stored, offsets,
                len(payload))

    def sample_parts(self, key: str, fields: Sequence[tuple[str, object]],
                     checksum=None) -> tuple[list, list[int], int]:
        """An uncompressed record in pieces: its header, then the payload's encoded pieces with
        each field's value as given; the field offsets; the payload's size.  The header's
        CRC32C is ``checksum(pieces)``, so a caller holding stand-ins for large values reads
        them once for it, and once more to write them.

        Args:
            key: the sample's key.
            fields: ``(name, value)`` of each field, a value bytes or any sized stand-in.
            checksum: the CRC32C of the payload's pieces, in order.
        """
        parts, offsets, size = payload_parts(key, fields)
        head = RECORD_HEADER.pack(size, size, checksum(parts), 0)
        return [head, *parts], offsets, size

    def payload(self, index, row: int, record, path: str):
        """The payload of one record: CRC checked, then decompressed to exactly the size the
        index records.

        Args:
            index: the shard's index.
            row: the sample's row.
            record: the sample's stored bytes.
            path: the shard, for errors.
        """
        key = index.key(row)
        where = int(index.starts[row])
        if len(record) < RECORD_HEADER.size:
            raise FormatError("truncated record header", path=path, offset=where, key=key)
        stored_len, raw_len, crc, flags = RECORD_HEADER.unpack_from(record)
        body = record[RECORD_HEADER.size:]
        raw_size = int(index.raw_sizes[row])
        if stored_len != len(body) or raw_len != raw_size:
            raise FormatError(f"record sizes ({stored_len}, {raw_len}) disagree with the index "
                              f"({len(body)}, {raw_size})", path=path, offset=where, key=key)
        if crc32c(body) != crc:
            raise IntegrityError("record CRC32C mismatch", path=path, offset=where, key=key)
        if flags & ~FLAG_ZSTD:
            raise FormatError(f"unknown record flags {flags:#x}", path=path, offset=where,
                              key=key)
        if not flags & FLAG_ZSTD:
            if len(body) != raw_size:  # (a flag flipped off: the header's flags have no CRC)
                raise FormatError(f"uncompressed record of {len(body)} bytes, the index says "
                                  f"{raw_size}", path=path, offset=where, key=key)
            return body
        return _decompressed(body, raw_size, path, where, key)

    def check_index_spans(self, starts, raw_sizes, compressed: bool, path: str | None) -> None:
        """An uncompressed record's raw size is its span less the record header; a compressed
        one's is bounded by it (decompression is sized by raw sizes).

        Args:
            starts: uint64[n+1] record starts.
            raw_sizes: uint64[n] payload sizes.
            compressed: whether the records are zstd-compressed.
            path: the index, for errors.
        """
        if not len(raw_sizes):
            return
        stored = np.diff(starts.astype(np.int64)) - RECORD_HEADER.size
        if not compressed:
            bad = np.any(raw_sizes.astype(np.int64) != stored)
        else:
            bad = np.any(raw_sizes > np.maximum(stored, 0).astype(np.uint64) * MAX_EXPANSION
                         + (1 << 20))
        if bad:
            raise FormatError("index raw sizes of msgpack records disagree with their spans"
                              + (f" (more than {MAX_EXPANSION}x the stored size)" if compressed
                                 else ""), path=path)

    def check_members(self, index, row: int, payload, whole: bool = False) -> None:
        """With ``whole``: the payload unpacks to the index's key and fields, each holding the
        indexed bytes.  Without: nothing (fields are sliced by the index's offsets).

        Args:
            index: the shard's index.
            row: the sample's row.
            payload: the sample's payload.
            whole: unpack and compare the whole payload.
        """
        if not whole:
            return
        fields = index.sample_fields(row)
        obj = decode_payload(bytes(payload), max_fields=len(index.fields))
        if obj[KEY_FIELD] != index.key(row):
            raise FormatError(f"record key {obj[KEY_FIELD]!r} != index key")
        names = sorted(n for n in obj if n != KEY_FIELD)
        if names != [n for n, _, _ in fields]:
            raise FormatError(f"record fields {names} != index fields")
        for name, off, size in fields:
            if obj[name] != bytes(payload[off:off + size]):
                raise FormatError(f"field {name!r} does not match its indexed bytes")

    def check_file_head(self, data, path: str | None = None) -> None:
        """The msgpack shard header: magic and a version this release reads.

        Args:
            data: the shard's bytes (at least its first 16).
            path: the shard, for errors.
        """
        check_msgpack_file_header(data[:MSGPACK_HEADER.size], path)

    def check_record_heads(self, index, rows, buf, path: str) -> None:
        """Record headers (stored size, no flags) of records ``rows`` of ``buf``, read in one
        numpy gather.  Their bytes are checked by the sample hash as the reader's ``check``
        says, so the CRC32C is not computed again here.

        Args:
            index: the shard's index.
            rows: int64 rows to check.
            buf: the shard's bytes.
            path: the shard, for errors.
        """
        size = RECORD_HEADER.size
        src = np.frombuffer(buf, dtype=np.uint8)
        starts = index.starts[rows].astype(np.int64)
        ends = index.starts[rows + 1].astype(np.int64)
        bad = (ends - starts < size) | (starts + size > len(src))
        heads = np.zeros(len(rows), dtype=RECORD_HEADER_DTYPE)
        ok = np.flatnonzero(~bad)
        if len(ok):
            windows = np.lib.stride_tricks.as_strided(src, shape=(len(src) - size + 1, size),
                                                      strides=(1, 1))
            heads[ok] = windows[starts[ok]].view(RECORD_HEADER_DTYPE).ravel()
        bad |= (heads["stored"].astype(np.int64) != ends - starts - size) | (heads["flags"] != 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise IntegrityError("record header mismatch (stored size or flags)", path=path,
                                 offset=int(starts[i]), key=index.key(int(rows[i])))


def _decompressed(body, raw_size: int, path: str, where: int, key: str) -> bytes:
    """A zstd record's payload, never more than ``raw_size`` bytes, and exactly that many."""
    import zstandard

    try:
        payload = zstandard.ZstdDecompressor().decompress(bytes(body), max_output_size=raw_size)
    except zstandard.ZstdError as exc:
        raise FormatError(f"zstd: {exc}", path=path, offset=where, key=key) from None
    if len(payload) != raw_size:
        raise FormatError(f"decompressed to {len(payload)} bytes, the index says {raw_size}",
                          path=path, offset=where, key=key)
    return payload
