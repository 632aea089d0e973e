"""Tar shards (``.tar``): each sample is its fields as consecutive tar members
``<key>.<field>``, so any WebDataset reader reads the shard; the shard ends with two zero
blocks.  A record is its own payload (no compression)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from shardpack.core.errors import FormatError

from .names import shown_name
from .shardcodec import ShardCodec
from .tar import TAR_BLOCK, TAR_END, parse_tar_member, tar_header, tar_member_name

_PADDING = [bytes(-n % TAR_BLOCK) for n in range(TAR_BLOCK)]


class TarCodec(ShardCodec):
    """The ``tar`` shard format (docs/format.md, "Tar shards")."""

    name = "tar"
    suffix = ".tar"
    code = 0
    field_overhead = TAR_BLOCK  # one header block a field (pax headers are rare)
    field_align = TAR_BLOCK

    def options_problem(self, compression: str) -> str | None:
        """Why tar shards cannot be written with ``compression`` (any but none), or None.

        Args:
            compression: one of :data:`~shardpack.format.names.COMPRESSIONS`.
        """
        if compression in self.compressions:
            return None
        return ("tar shards are not compressed (WebDataset readers expect plain tar): use "
                "--format msgpack with --compression zstd")

    def file_end(self) -> bytes:
        """Two zero blocks: the end-of-archive marker."""
        return TAR_END

    def encode_sample(self, key: str, fields: Sequence[tuple[str, bytes]],
                      compressor=None) -> tuple[bytes, list[int], int]:
        """One sample's tar members, where each field's data starts in them, and their size.

        Args:
            key: the sample's key.
            fields: ``(name, bytes)`` of each field, in the order to write them.
            compressor: unused (tar shards are not compressed).
        """
        parts, offsets, size = self.sample_parts(key, fields)
        return b"".join(parts), offsets, size

    def sample_parts(self, key: str, fields: Sequence[tuple[str, object]],
                     checksum=None) -> tuple[list, list[int], int]:
        """Each field's header, its value as given and its padding, in order; the field
        offsets; the record's size.

        Args:
            key: the sample's key.
            fields: ``(name, value)`` of each field, a value bytes or any sized stand-in.
            checksum: unused (tar members carry no checksum of their data).
        """
        parts, offsets, offset = [], [], 0
        for name, data in fields:
            header = tar_header(tar_member_name(key, name), len(data))
            pad = _PADDING[len(data) % TAR_BLOCK]
            offset += len(header)
            offsets.append(offset)
            offset += len(data) + len(pad)
            parts += (header, data, pad)
        return parts, offsets, offset

    def payload(self, index, row: int, record, path: str):
        """The record itself: a tar record is its own payload.

        Args:
            index: the shard's index (unused).
            row: the sample's row (unused).
            record: the sample's stored bytes.
            path: the shard (unused).
        """
        return record

    def check_index_spans(self, starts, raw_sizes, compressed: bool, path: str | None) -> None:
        """A tar sample's raw size is its span.

        Args:
            starts: uint64[n+1] record starts.
            raw_sizes: uint64[n] payload sizes.
            compressed: unused (the index decoder refuses compressed tar).
            path: the index, for errors.
        """
        if len(raw_sizes) and np.any(raw_sizes != np.diff(starts)):
            raise FormatError("index raw sizes of tar samples differ from their spans", path=path)

    def check_members(self, index, row: int, payload, whole: bool = False) -> None:
        """Each member is a regular file named, sized and placed as the index says; with
        ``whole``, nothing follows the last one.

        Args:
            index: the shard's index.
            row: the sample's row.
            payload: the sample's record.
            whole: also refuse bytes after the last listed member.
        """
        key = index.key(row)
        pos = 0
        for name, off, size in index.sample_fields(row):
            member = parse_tar_member(payload, pos)
            why = _mismatch(member, index.member_name(key, name), size, pos, off)
            if why:
                raise FormatError(why, offset=pos)
            pos += member.end
        if whole and pos != len(payload):
            raise FormatError("tar record has bytes the index does not account for")

    def file_tail_problem(self, data, end: int) -> str | None:
        """Why the shard does not end with two zero blocks right after its last sample, or
        None.

        Args:
            data: the whole shard.
            end: where the last record ends.
        """
        if data[end:] != TAR_END:
            return "tar shard does not end with two zero blocks"
        return None


def _mismatch(member, name: str, size: int, pos: int, off: int) -> str | None:
    """What differs between a tar member found at ``pos`` of a payload and the index's entry
    (member ``name``, ``size`` bytes of data at payload offset ``off``), or None."""
    if member.name != name:
        return (f"tar member {shown_name(member.name)!r} does not match the index, which names "
                f"it {shown_name(name)!r}")
    if member.size != size:
        return f"tar member {shown_name(name)!r} is {member.size} bytes, the index says {size}"
    if pos + member.data_offset != off:
        return (f"tar member {shown_name(name)!r} has its data at payload offset "
                f"{pos + member.data_offset}, the index says {off}")
    return None
