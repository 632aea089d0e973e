"""The per-shard binary index (``shard-NNNNN.idx``): offsets, sizes, hashes, fields and keys of a
shard's samples, encoded and decoded with every count and offset checked (docs/format.md,
"Index")."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import xxhash

from shardpack.core.errors import FormatError, IntegrityError, VersionError

from .codecs import FORMAT_CODES, codec_by_code, codec_for
from .names import FORMAT_VERSION, READ_VERSIONS, reserved_field_reason
from .shardcodec import ShardCodec
from .tar import tar_member_name

INDEX_MAGIC = b"SPKINDEX"
INDEX_HEADER = struct.Struct("<8sIBBHQIIQ16sQQ")  # 72 bytes, see docs/format.md
INDEX_TRAILER = struct.Struct("<Q")
INDEX_WIDE = 1  # header flags (v2): entry offsets and sizes are u64; else u32 (all < 2^32)
MAX_INDEX_FIELDS = 0xFFFF  # entry field numbers are u16
MISSING = np.uint64(0xFFFF_FFFF_FFFF_FFFF)  # field offset of a field a sample lacks
MIN_INDEX_BYTES = 32  # the least index bytes one sample takes (v1 and v2: starts, sizes, hash,
#                       key offset, and v2's field run)
COMPRESSION_CODES = {"none": 0, "zstd": 1}
_COMPRESSIONS = {code: name for name, code in COMPRESSION_CODES.items()}


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index.  Arrays are read-only numpy views of the index bytes (version 1's dense
    tables are turned into the same sparse entries when the index is decoded)."""

    shard_format: str
    compression: str
    shard_bytes: int
    shard_hash: bytes        # 16-byte xxh3-128 digest of the shard file
    plan_digest: int         # fingerprint of the plan task that made the shard (used by --resume)
    skipped: int             # samples of the plan task the writer skipped (--skip-bad)
    fields: tuple[str, ...]
    starts: np.ndarray       # uint64[n+1]: sample i is bytes [starts[i], starts[i+1]) of the shard
    raw_sizes: np.ndarray    # uint64[n]: payload size after decompression (tar: record size)
    sample_hashes: np.ndarray  # uint64[n]: xxh3-64 of the sample's stored bytes
    field_runs: np.ndarray     # int64[n+1]: sample i's fields are entries [runs[i], runs[i+1])
    entry_fields: np.ndarray   # [m]: field number (into ``fields``) of each entry
    entry_offsets: np.ndarray  # [m]: offset of the entry's field in its sample's payload
    entry_sizes: np.ndarray    # [m]: its size
    key_offsets: np.ndarray    # uint64[n+1] into key_blob
    key_blob: bytes
    version: int = FORMAT_VERSION

    @functools.cached_property
    def codec(self) -> ShardCodec:
        """The codec of the shard's format, looked up once."""
        return codec_for(self.shard_format)

    def member_name(self, key: str, field: str) -> str:
        """The tar member name this shard holds for ``field`` of ``key``.

        Args:
            key: the sample's key.
            field: the field's name.
        """
        return tar_member_name(key, field) if self.version >= 2 else f"{key}.{field}"

    @property
    def num_samples(self) -> int:
        """The number of samples in the shard."""
        return len(self.raw_sizes)

    def key(self, i: int) -> str:
        """The key of sample ``i``.

        Args:
            i: the sample's row in the shard.
        """
        a, b = int(self.key_offsets[i]), int(self.key_offsets[i + 1])
        return self.key_blob[a:b].decode("utf-8", "surrogateescape")

    def keys(self) -> list[str]:
        """Every sample's key, in row order."""
        return [self.key(i) for i in range(self.num_samples)]

    @functools.cached_property
    def entry_rows(self) -> np.ndarray:
        """int64[m]: the sample of each entry."""
        return np.repeat(np.arange(self.num_samples), np.diff(self.field_runs))

    @functools.cached_property
    def field_spans(self) -> FieldSpans:
        """Uncompressed shards: per field, (start in the shard file, size) of every sample's value
        as int64, size 0 where a sample lacks the field.  Each field's arrays are made on first
        use and kept, so a batch gather does two lookups per field instead of re-deriving them,
        and memory grows with the fields asked for, not with every name in the shard."""
        return FieldSpans(self)

    @functools.cached_property
    def field_offsets(self) -> np.ndarray:
        """Dense uint64[n, F] view of the entries, MISSING where a sample lacks a field (tools and
        tests; readers use the entries)."""
        out = np.full((self.num_samples, len(self.fields)), MISSING, dtype="<u8")
        out[self.entry_rows, self.entry_fields] = self.entry_offsets
        return out

    @functools.cached_property
    def field_sizes(self) -> np.ndarray:
        """Dense uint64[n, F] sizes of the entries, 0 where a sample lacks a field."""
        out = np.zeros((self.num_samples, len(self.fields)), dtype="<u8")
        out[self.entry_rows, self.entry_fields] = self.entry_sizes
        return out

    @functools.cached_property
    def key_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every key in ``key_blob``, int64."""
        offsets = self.key_offsets.astype(np.int64)
        return offsets[:-1], offsets[1:]

    def span(self, i: int) -> tuple[int, int]:
        """``(start, end)`` of sample ``i``'s record in the shard file.

        Args:
            i: the sample's row in the shard.
        """
        return int(self.starts[i]), int(self.starts[i + 1])

    def sample_fields(self, i: int) -> list[tuple[str, int, int]]:
        """``[(field, offset, size)]`` of the fields sample ``i`` has, offsets into its payload.

        Args:
            i: the sample's row in the shard.
        """
        a, b = int(self.field_runs[i]), int(self.field_runs[i + 1])
        return [(self.fields[f], off, size) for f, off, size in zip(
            self.entry_fields[a:b].tolist(), self.entry_offsets[a:b].tolist(),
            self.entry_sizes[a:b].tolist(), strict=True)]


class FieldSpans:
    """``name -> (starts, sizes)`` of :attr:`ShardIndex.field_spans`, made per field on use."""

    def __init__(self, index: ShardIndex):
        self.index = index
        self.numbers = {name: i for i, name in enumerate(index.fields)}
        self.made: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __contains__(self, name) -> bool:
        return name in self.numbers

    def __getitem__(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        spans = self.made.get(name)
        if spans is None:
            index = self.index
            base = index.starts[:-1].astype(np.int64)
            base += index.codec.payload_offset
            mine = index.entry_fields == self.numbers[name]
            rows = index.entry_rows[mine]
            starts = base.copy()
            sizes = np.zeros(index.num_samples, dtype=np.int64)
            starts[rows] += index.entry_offsets[mine].astype(np.int64)
            sizes[rows] = index.entry_sizes[mine].astype(np.int64)
            spans = self.made[name] = (starts, sizes)
        return spans


def encode_index(*, shard_format: str, compression: str, shard_bytes: int, shard_hash: bytes,
                 plan_digest: int, skipped: int, fields: Sequence[str], starts: Sequence[int],
                 raw_sizes: Sequence[int], sample_hashes: Sequence[int],
                 field_offsets: np.ndarray, field_sizes: np.ndarray,
                 keys: Iterable[str]) -> bytes:
    """Version 2: the fields each sample has are listed sparsely (CSR: per sample a run of
    (field number, offset, size) entries), so the index grows with the fields a sample has, not
    with the number of distinct field names in the shard.

    Args:
        shard_format, compression: the shard's format and compression.
        shard_bytes, shard_hash: the shard file's size and 16-byte xxh3-128 digest.
        plan_digest: the fingerprint of the plan task that made the shard.
        skipped: samples of the plan task the writer skipped.
        fields: the shard's field names, in column order.
        starts: n+1 record starts (the last: where the last record ends).
        raw_sizes, sample_hashes: each sample's payload size and xxh3-64.
        field_offsets, field_sizes: dense ``[n, len(fields)]``, MISSING where a sample lacks a
            field.
        keys: the n keys.
    """
    n = len(raw_sizes)
    if len(fields) > MAX_INDEX_FIELDS:
        raise FormatError(f"{len(fields):,} distinct field names in one shard: at most "
                          f"{MAX_INDEX_FIELDS:,} fit an index")
    names = b"".join(struct.pack("<H", len(f.encode())) + f.encode() for f in fields)
    names += bytes(-len(names) % 8)
    key_bytes = [k.encode("utf-8", "surrogateescape") for k in keys]
    key_offsets = np.zeros(n + 1, dtype="<u8")
    np.cumsum([len(k) for k in key_bytes], out=key_offsets[1:])
    offsets = np.asarray(field_offsets, dtype="<u8").reshape(n, len(fields))
    sizes = np.asarray(field_sizes, dtype="<u8").reshape(n, len(fields))
    rows, cols = np.nonzero(offsets != MISSING)  # row-major: each sample's fields in order
    field_index = np.zeros(n + 1, dtype="<u8")
    np.cumsum(np.bincount(rows, minlength=n), out=field_index[1:])
    entry_offsets, entry_sizes = offsets[rows, cols], sizes[rows, cols]
    wide = bool(len(rows)) and int(max(entry_offsets.max(), entry_sizes.max())) >> 32 != 0
    width = "<u8" if wide else "<u4"  # u32 entries unless a field lies past 4 GiB
    header = INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, codec_for(shard_format).code,
                               COMPRESSION_CODES[compression], INDEX_WIDE if wide else 0, n,
                               len(fields), len(names), shard_bytes, shard_hash, plan_digest,
                               skipped)
    arrays = [np.asarray(starts, dtype="<u8"), np.asarray(raw_sizes, dtype="<u8"),
              np.asarray(sample_hashes, dtype="<u8"), field_index,
              entry_offsets.astype(width), entry_sizes.astype(width), cols.astype("<u2"),
              key_offsets]
    body = header + names + b"".join(map(_padded, arrays)) + b"".join(key_bytes)
    return body + INDEX_TRAILER.pack(xxhash.xxh3_64_intdigest(body))


def _padded(a: np.ndarray) -> bytes:
    raw = a.tobytes()
    return raw + bytes(-len(raw) % 8)


def decode_index(buf, path: str | None = None) -> ShardIndex:
    """Parse and validate an index.

    Args:
        buf: the index's bytes, or a memory map of them.
        path: the index, for errors.
    """
    (version, fmt, comp, flags, n, nfields, names_len, shard_bytes, shard_hash, plan_digest,
     skipped) = _index_header(buf, path)
    size = len(buf)
    end = INDEX_HEADER.size + names_len
    if end > size - INDEX_TRAILER.size or 2 * nfields > names_len:
        raise FormatError("index field-name table runs past the index", path=path)
    fields = _index_field_names(buf, nfields, end, path)
    arrays = _IndexArrays(buf, end, path)
    starts, raw_sizes, hashes = arrays.take(n + 1), arrays.take(n), arrays.take(n)
    if version == 1:
        runs, rows, entry_fields, entry_offsets, entry_sizes = _index_entries_v1(arrays, n,
                                                                                 nfields)
    else:
        runs, rows, entry_fields, entry_offsets, entry_sizes = _index_entries(arrays, n, nfields,
                                                                              flags, path)
    koff = arrays.take(n + 1)
    pos, key_len = arrays.pos, int(koff[-1])
    if pos + key_len + INDEX_TRAILER.size != size:
        raise FormatError("index size does not match its header", path=path)
    codec = codec_by_code(fmt)
    _check_index_spans(codec, comp, starts, raw_sizes, koff, shard_bytes, path)
    raw = raw_sizes[rows]  # compared without a sum that could wrap around 2^64
    if np.any((entry_sizes > raw) | (entry_offsets > raw - np.minimum(entry_sizes, raw))):
        raise FormatError("index field extends past its sample", path=path)
    return ShardIndex(codec.name, _COMPRESSIONS[comp], int(shard_bytes), bytes(shard_hash),
                      int(plan_digest), int(skipped), tuple(fields), starts, raw_sizes, hashes,
                      runs, entry_fields, entry_offsets, entry_sizes, koff,
                      bytes(buf[pos:pos + key_len]), version)


def _index_header(buf, path: str | None) -> tuple:
    """The header's values after the magic, once magic, version, format and compression codes
    and the checksum of the whole index are checked."""
    size = len(buf)
    if size < INDEX_HEADER.size + INDEX_TRAILER.size:
        raise FormatError(f"index is {size} bytes, too short", path=path)
    magic, version, fmt, comp, *rest = INDEX_HEADER.unpack_from(buf)
    if magic != INDEX_MAGIC:
        raise FormatError(f"not a shardpack index (magic {magic!r})", path=path, offset=0)
    if version not in READ_VERSIONS:
        raise VersionError(f"unsupported index version: expected one of {READ_VERSIONS}, found "
                           f"{version}", path=path)
    formats, comps = set(FORMAT_CODES), set(_COMPRESSIONS)
    if fmt not in formats or comp not in comps:
        raise VersionError(f"unknown shard format code {fmt} or compression code {comp}: "
                           f"expected one of {sorted(formats)} and {sorted(comps)}", path=path)
    (stored,) = INDEX_TRAILER.unpack_from(buf, size - INDEX_TRAILER.size)
    if xxhash.xxh3_64_intdigest(memoryview(buf)[:size - INDEX_TRAILER.size]) != stored:
        raise IntegrityError("index checksum mismatch (corrupt or truncated index)", path=path)
    return (version, fmt, comp, *rest)


def _index_field_names(buf, nfields: int, end: int, path: str | None) -> list[str]:
    """The field-name table (``nfields`` length-prefixed UTF-8 names) that ends at ``end``."""
    pos = INDEX_HEADER.size
    fields = []
    for _ in range(nfields):
        (ln,) = struct.unpack_from("<H", buf, pos)
        if pos + 2 + ln > end:
            raise FormatError("index field-name table runs past its length", path=path)
        try:
            name = bytes(buf[pos + 2:pos + 2 + ln]).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError("index field name is not UTF-8", path=path) from None
        why = reserved_field_reason(name) if name else "field name is empty"
        if why:
            raise FormatError(f"index {why}"[:300], path=path)
        fields.append(name)
        pos += 2 + ln
    return fields


class _IndexArrays:
    """The index's arrays in order, each padded to 8 bytes; none may run into the trailer."""

    def __init__(self, buf, pos: int, path: str | None):
        self.buf, self.pos, self.path = buf, pos, path
        self.limit = len(buf) - INDEX_TRAILER.size

    def take(self, count: int, dtype: str = "<u8") -> np.ndarray:
        width = np.dtype(dtype).itemsize
        if self.pos + width * count > self.limit:
            raise FormatError("index arrays run past the end of the index", path=self.path)
        out = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
        self.pos += width * count + (-(width * count) % 8)
        return out


def _index_entries_v1(arrays: _IndexArrays, n: int, nfields: int) -> tuple:
    """Version 1: dense n x F tables (their size is bounded by the file's), turned into
    ``(runs, rows, entry_fields, entry_offsets, entry_sizes)``."""
    foff = arrays.take(n * nfields).reshape(n, nfields)
    fsize = arrays.take(n * nfields).reshape(n, nfields)
    rows, cols = np.nonzero(foff != MISSING)
    runs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=runs[1:])
    return runs, rows, cols, foff[rows, cols], fsize[rows, cols]


def _index_entries(arrays: _IndexArrays, n: int, nfields: int, flags: int,
                   path: str | None) -> tuple:
    """Version 2 on: per-sample runs of (field, offset, size) entries, checked, as
    ``(runs, rows, entry_fields, entry_offsets, entry_sizes)``."""
    if flags & ~INDEX_WIDE:
        raise VersionError(f"unknown index flags {flags:#x}: expected only "
                           f"{INDEX_WIDE:#x}", path=path)
    runs = arrays.take(n + 1).astype(np.int64)  # int64: a crafted u64 past 2^63 turns negative
    entries = int(runs[-1]) if n else 0
    if n and (runs[0] != 0 or np.any(runs[1:] < runs[:-1]) or entries > n * nfields):
        raise FormatError("index field runs are not increasing", path=path)
    width = "<u8" if flags & INDEX_WIDE else "<u4"
    entry_offsets, entry_sizes = arrays.take(entries, width), arrays.take(entries, width)
    entry_fields = arrays.take(entries, "<u2")
    if entries and int(entry_fields.max()) >= nfields:
        raise FormatError("index names a field number past its field table", path=path)
    rows = np.repeat(np.arange(n), np.diff(runs))
    # within a sample, field numbers strictly increase: no field listed twice
    if entries > 1 and not np.all((np.diff(entry_fields.astype(np.int32)) > 0)
                                  | (np.diff(rows) != 0)):
        raise FormatError("index field numbers of a sample are not increasing", path=path)
    return runs, rows, entry_fields, entry_offsets, entry_sizes


def _check_index_spans(codec: ShardCodec, comp: int, starts: np.ndarray,
                       raw_sizes: np.ndarray, koff: np.ndarray, shard_bytes: int,
                       path: str | None) -> None:
    """Sample and key offsets increase and stay inside the shard; raw sizes agree with the
    spans as the shard's format stores records (:meth:`ShardCodec.check_index_spans`)."""
    n = len(raw_sizes)
    if n and (np.any(starts[1:] < starts[:-1]) or int(starts[-1]) > shard_bytes
              or np.any(koff[1:] < koff[:-1])):
        raise FormatError("index offsets are not increasing or run past the shard", path=path)
    codec.check_index_spans(starts, raw_sizes, comp != COMPRESSION_CODES["none"], path)
