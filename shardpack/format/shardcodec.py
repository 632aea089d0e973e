"""What a shard format is to the rest of shardpack: one :class:`ShardCodec` per format, looked up
once by name (:func:`shardpack.format.codecs.codec_for`) by whoever writes, plans, reads or checks
shards of it.  Nothing outside ``shardpack/format/`` compares format names."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Sequence

from .names import shard_stem

if TYPE_CHECKING:
    from .index import ShardIndex


class ShardCodec(ABC):
    """One shard format: its file name, its index code, and how its samples are written, sized
    for the plan, read back and checked.  Codecs hold no state: one instance per format.

    A record is one sample's stored bytes (``[starts[i], starts[i+1])`` of the shard); its
    payload is what the index's field offsets point into.
    """

    name: str = ""           # the manifest's and the CLI's shard_format
    suffix: str = ""         # shard file suffix
    code: int = -1           # the index header's format code
    compressions: tuple[str, ...] = ("none",)
    payload_offset: int = 0  # bytes before an uncompressed record's payload (field spans)
    field_overhead: int = 0  # the plan's estimate: bytes each field costs besides its data...
    field_align: int = 1     # ...and the size each field's data is padded to
    framed_records: bool = False  # records have headers of their own (check_record_heads)
    max_field: int | None = None  # the largest field value the format holds (None: no limit)

    def shard_name(self, number: int) -> str:
        """The file name of shard ``number`` in this format: ``shard-NNNNN<suffix>``.

        Args:
            number: the shard's position in the manifest.
        """
        return f"{shard_stem(number)}{self.suffix}"

    def options_problem(self, compression: str) -> str | None:
        """Why shards of this format cannot be written with ``compression``, or None.

        Args:
            compression: one of :data:`~shardpack.format.names.COMPRESSIONS`.
        """
        if compression in self.compressions:
            return None
        return (f"{self.name} shards are not compressed: use a format that takes "
                f"--compression {compression}")

    def sample_overhead(self, key: str) -> int:
        """The plan's estimate of the bytes one sample costs besides its fields (see
        :attr:`field_overhead` and :attr:`field_align` for each field).

        Args:
            key: the sample's key.
        """
        return 0

    def file_header(self) -> bytes:
        """The bytes a shard file starts with, before its first record."""
        return b""

    def file_end(self) -> bytes:
        """The bytes a shard file ends with, after its last record."""
        return b""

    @abstractmethod
    def encode_sample(self, key: str, fields: Sequence[tuple[str, bytes]],
                      compressor=None) -> tuple[bytes, list[int], int]:
        """``(record, offsets, raw_size)`` of one sample: its stored bytes, the offset of each
        field's data in the payload, and the payload's size.

        Args:
            key: the sample's key.
            fields: ``(name, bytes)`` of each field, in the order to write them.
            compressor: a ``zstandard.ZstdCompressor`` for compressed shards, else None.
        """

    def sample_parts(self, key: str, fields: Sequence[tuple[str, object]],
                     checksum=None) -> tuple[list, list[int], int]:
        """:meth:`encode_sample` of an uncompressed record before the join: ``(parts, offsets,
        raw_size)``, the parts in order, each bytes or a field's value as given (a sized
        stand-in for bytes the caller copies in chunks: the shard writer's large fields).  The
        joined parts are exactly :meth:`encode_sample`'s record.

        Args:
            key: the sample's key.
            fields: ``(name, value)`` of each field, in the order to write them.
            checksum: for formats whose record header holds a CRC32C of the record: a function
                of the parts giving it.
        """
        raise NotImplementedError

    @abstractmethod
    def payload(self, index: ShardIndex, row: int, record, path: str):
        """The payload of sample ``row`` from its stored ``record`` bytes, checked against the
        index; raises :class:`~shardpack.core.errors.FormatError` (or IntegrityError).

        Args:
            index: the shard's index.
            row: the sample's row in the shard.
            record: the sample's stored bytes.
            path: the shard, for errors.
        """

    @abstractmethod
    def check_index_spans(self, starts, raw_sizes, compressed: bool, path: str | None) -> None:
        """Raise :class:`~shardpack.core.errors.FormatError` where an index's raw sizes do not
        fit its record spans as this format stores records.

        Args:
            starts: uint64[n+1] record starts.
            raw_sizes: uint64[n] payload sizes.
            compressed: whether the shard's records are compressed.
            path: the index, for errors.
        """

    @abstractmethod
    def check_members(self, index: ShardIndex, row: int, payload, whole: bool = False) -> None:
        """Raise :class:`~shardpack.core.errors.FormatError` (``offset``: in the payload) where
        the payload's own structure disagrees with the index's entries of sample ``row``.
        Cheap without ``whole`` (what ``unpack`` checks before writing files); with ``whole``,
        everything ``verify`` checks.

        Args:
            index: the shard's index.
            row: the sample's row.
            payload: the sample's payload (:meth:`payload`).
            whole: also check that the payload holds nothing the index does not list.
        """

    def check_file_head(self, data, path: str | None = None) -> None:
        """Raise :class:`~shardpack.core.errors.FormatError` unless ``data`` starts as a shard
        of this format does.

        Args:
            data: the shard's bytes (at least its first ones).
            path: the shard, for errors.
        """
        return None  # formats without a file header

    def file_tail_problem(self, data, end: int) -> str | None:
        """Why the bytes after the last record (from ``end``) are not what this format ends
        with, or None.

        Args:
            data: the whole shard.
            end: where the last record ends.
        """
        return None

    def check_record_heads(self, index: ShardIndex, rows, buf, path: str) -> None:
        """Raise :class:`~shardpack.core.errors.IntegrityError` where a record's own framing
        of rows ``rows`` of an uncompressed shard disagrees with the index: the check the
        batched reader does on every batch, besides the sample hashes.

        Args:
            index: the shard's index.
            rows: int64 rows of the batch in this shard.
            buf: the shard's bytes.
            path: the shard, for errors.
        """
        return None  # formats whose records have no framing of their own

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
