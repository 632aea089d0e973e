"""MosaicML Streaming (MDS) datasets -> samples.

``index.json`` (version 2) lists the shards; each has ``column_names`` / ``column_encodings`` /
``column_sizes`` (None for variable-size columns), ``raw_data`` (the uncompressed shard: name,
bytes) and ``zip_data`` (the compressed one, or None), ``compression`` and ``samples``.  A
shard file is::

    uint32 n | uint32 offsets[n + 1] (from the file start) | the writer's config JSON | samples

and a sample is ``uint32 size`` for each variable-size column, in column order, then every
column's bytes in column order.  Uncompressed shards become byte ranges (the shard writer reads
them in large windows); compressed ones (zstd, gz, bz2) are decompressed one at a time, bounded
by ``raw_data.bytes``, and carried inline.

Fields: see :func:`~shardpack.interop.sources.common.field_name` and ``ENCODINGS`` below.  Samples
have
no keys: shardpack numbers them (``0000000000``...) in index order.  MDS hashes and size_limit
have no place in a shardpack manifest and are reported as notes.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from shardpack.core.errors import SourceError
from shardpack.format import unsafe_name_reason
from shardpack.write.samples import SourceField
from shardpack.interop.sources.base import ContainerSource, inline
from .common import CODECS, ByteRanges, Memory, Window, check_fields, decimal, decompress, \
    field_name, npy, pil_to_png

CARRIED = {"bytes": None, "str": "txt", "json": "json", "jpeg": "jpg", "png": "png",
           "str_int": None, "str_float": None, "str_decimal": None, "pkl": "pkl"}
SCALARS = {"int": "<i8", "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
           "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8", "float16": "<f2",
           "float32": "<f4", "float64": "<f8"}
REFUSED = {"list[pil]", "list[jpeg]", "list[png]", "jpeg_array", "jpegarray"}
NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16",
                  32: "uint32", 33: "int32", 34: "float32", 64: "uint64", 65: "int64",
                  66: "float64"}
CONVERTED = {"scalar": "ASCII decimal text", "pil": "PNG of the same pixels",
             "ndarray": ".npy array", "pkl": "pickled bytes as they are, never unpickled"}
KNOWN = sorted(set(CARRIED) | set(SCALARS) | {"pil", "ndarray"})


class Column(NamedTuple):
    """One MDS column: its ``name``, the ``field`` it becomes, its ``encoding``, how it is
    carried (``kind``), its fixed ``size`` (None: each sample records it), and the ``dtype`` and
    ``shape`` of a scalar or static ndarray."""

    name: str
    field: str
    encoding: str
    kind: str                 # "carried", "scalar", "pil", "ndarray"
    size: int | None          # fixed size, or None when each sample records it
    dtype: str | None = None  # scalar / static ndarray dtype
    shape: tuple[int, ...] | None = None  # static ndarray shape


class Shard(NamedTuple):
    """One MDS shard entry of index.json, checked: its columns, sample count, raw file and
    size, and its compression and compressed file, if any."""

    columns: list[Column]
    samples: int
    raw_name: str
    raw_bytes: int
    compression: str | None
    zip_name: str | None
    zip_bytes: int | None


class MDSSource(ContainerSource):
    """A MosaicML Streaming (MDS) dataset (index.json and ``.mds`` shards): every sample of
    every shard, each column a field (docs/convert.md, "MDS")."""

    format = "mds"
    suffixes = (".mds",)

    def __init__(self, src, **kwargs):
        super().__init__(src, **kwargs)
        index, shown = self.read_json("index.json")
        if not isinstance(index, dict) or index.get("version") != 2 \
                or not isinstance(index.get("shards"), list):
            found = index.get("version") if isinstance(index, dict) else type(index).__name__
            raise SourceError(f"unsupported MDS index: expected version 2 with a shards list, "
                              f"found version {found!r}", path=shown)
        # every shard entry is checked here, before anything is written
        self.shards = [self._entry(shard, f"{shown}: shard {number}")
                       for number, shard in enumerate(index["shards"])]

    def samples(self) -> Iterator[tuple[str | None, list[SourceField], str]]:
        """``(None, fields, where)`` of each sample of each shard, in index order."""
        for shard in self.shards:
            yield from self._shard(shard)

    def _entry(self, shard, where: str) -> Shard:
        columns = self._columns(shard, where)
        raw_name, raw_bytes = _file(shard.get("raw_data"), "raw_data", where)
        count = shard.get("samples")
        if not isinstance(count, int) or count < 0:
            raise SourceError(f"bad sample count {count!r}", path=where)
        compression = shard.get("compression")
        zip_name = zip_bytes = None
        if compression is not None:
            codec = compression.split(":", 1)[0] if isinstance(compression, str) else None
            if codec not in CODECS:
                raise SourceError(f"unsupported MDS compression {compression!r}: expected one of "
                                  f"{', '.join(CODECS)}", path=where)
            zip_name, zip_bytes = _file(shard.get("zip_data"), "zip_data", where)
        self._notes(shard, columns)
        return Shard(columns, count, raw_name, raw_bytes, compression, zip_name, zip_bytes)

    # -- one shard ---------------------------------------------------------------------------
    def _shard(self, shard: Shard):
        if not self.source_file(shard.zip_name or shard.raw_name):
            return
        columns = shard.columns
        src, url, mtime = self._shard_bytes(shard)
        offsets = _sample_offsets(src, shard.samples, shard.raw_bytes)
        variable = [c for c in columns if c.size is None]
        fixed = sum(c.size for c in columns if c.size is not None)
        head = 4 * len(variable)
        for i in range(len(offsets) - 1):
            start, end = int(offsets[i]), int(offsets[i + 1])
            sample_where = f"{src.shown}: sample {i}"
            if end - start < head + fixed:
                self.bad(sample_where, f"sample is {end - start} bytes, shorter than its column "
                                       "sizes", "corrupt")
                continue
            sizes = iter(int(s) for s in np.frombuffer(src.get(start, start + head), "<u4"))
            lengths = [c.size if c.size is not None else next(sizes) for c in columns]
            if head + sum(lengths) != end - start:
                self.bad(sample_where, f"column sizes add up to {head + sum(lengths)} bytes, the "
                                       f"sample is {end - start}", "corrupt")
                continue
            pos, fields = start + head, []
            try:
                for column, length in zip(columns, lengths, strict=True):
                    if column.kind == "carried" and url is not None:
                        fields.append(SourceField(column.field, url, length, mtime, None, pos,
                                                  None, ByteRanges))
                    else:
                        fields.append(inline(column.field, _value(column,
                                                                  src.get(pos, pos + length))))
                    pos += length
            except SourceError:
                raise
            except ValueError as exc:
                self.bad(sample_where, f"column {column.name!r} ({column.encoding}): {exc}",
                         "bad-value")
                continue
            yield None, fields, sample_where

    def _shard_bytes(self, shard: Shard):
        """(the shard's bytes: decompressed in memory, or a Window on the file; the URL and
        mtime carried fields point into, or None and 0 when they are copied out)."""
        raw_bytes = shard.raw_bytes
        if shard.compression:
            codec, zip_name = shard.compression.split(":", 1)[0], shard.zip_name
            zip_shown, zip_bytes = self.storage.display(zip_name), shard.zip_bytes
            data = self.storage.read_bytes(zip_name)
            if len(data) != zip_bytes:
                raise SourceError(f"shard file is {len(data)} bytes, index.json records "
                                  f"{zip_bytes}: truncated or replaced", path=zip_shown)
            src = Memory(decompress(codec, data, raw_bytes, zip_shown), zip_shown)
            del data
            return src, None, 0
        size = self.storage.size(shard.raw_name)
        src = Window(self.storage, shard.raw_name, size)
        if size != raw_bytes:
            raise SourceError(f"shard file is {size} bytes, index.json records {raw_bytes}: "
                              "truncated or replaced", path=src.shown)
        return src, self.url(shard.raw_name), self.mtime_ns(shard.raw_name)

    def _columns(self, shard, where: str) -> list[Column]:
        if not isinstance(shard, dict):
            raise SourceError("shard entry is not an object", path=where)
        if shard.get("format") != "mds":
            raise SourceError(f"unsupported shard format: expected 'mds', found "
                              f"{shard.get('format')!r}", path=where)
        if shard.get("version", 2) != 2:
            raise SourceError(f"unsupported MDS shard version: expected 2, found "
                              f"{shard.get('version')!r}", path=where)
        names = shard.get("column_names")
        encodings = shard.get("column_encodings")
        sizes = shard.get("column_sizes")
        if not (isinstance(names, list) and isinstance(encodings, list)
                and isinstance(sizes, list) and len(names) == len(encodings) == len(sizes)
                and names and all(isinstance(n, str) for n in names)):
            raise SourceError("column_names, column_encodings and column_sizes must be lists of "
                              "the same, non-zero length", path=where)
        columns = [self._column(n, e, s, where)
                   for n, e, s in zip(names, encodings, sizes, strict=True)]
        check_fields([c.field for c in columns], names, "MDS column", where)
        return columns

    def _column(self, name: str, encoding, size, where: str) -> Column:
        if not isinstance(encoding, str):
            raise SourceError(f"column {name!r}: encoding {encoding!r} is not a string",
                              path=where)
        kind, _, arg = encoding.partition(":")
        if encoding == "pkl" and not self.allow_pickle:
            raise SourceError(f"column {name!r} uses encoding 'pkl': unpickling runs code from "
                              "the file, so it is refused", path=where,
                              hint="pass --allow-pickle to carry the pickled bytes as they are; "
                                   "shardpack never unpickles them")
        if encoding in CARRIED:
            column = Column(name, field_name(name, CARRIED[encoding]), encoding, "carried", None)
        elif encoding in SCALARS:
            dtype = SCALARS[encoding]
            column = Column(name, name, encoding, "scalar", np.dtype(dtype).itemsize, dtype)
        elif encoding == "pil":
            column = Column(name, field_name(name, "png"), encoding, "pil", None)
        elif kind == "ndarray":
            column = _ndarray_column(name, encoding, arg, where)
        elif encoding in REFUSED:
            raise SourceError(f"column {name!r}: encoding {encoding!r} (a list of images) is not "
                              f"supported; supported: {', '.join(KNOWN)}", path=where)
        else:
            raise SourceError(f"column {name!r}: unknown MDS encoding {encoding!r}: expected one "
                              f"of {', '.join(KNOWN)}", path=where)
        if size != column.size:
            raise SourceError(f"column {name!r} ({encoding}): index.json records size {size!r}, "
                              f"the encoding has size {column.size!r}", path=where)
        return column

    def _notes(self, shard: dict, columns: list[Column]) -> None:
        if shard.get("hashes"):
            self.note(f"MDS shard hashes ({', '.join(map(str, shard['hashes']))}) were not "
                      "checked or carried; shardpack records its own")
        if shard.get("size_limit"):
            self.note(f"MDS size_limit {shard['size_limit']} was not carried (--shard-size sets "
                      "shardpack's shard size)")
        if shard.get("compression"):
            self.note(f"MDS shards were compressed ({shard['compression']}); fields were "
                      "decompressed")
        for c in columns:
            if c.encoding in CONVERTED or c.kind in CONVERTED:
                self.note(f"MDS column {c.name!r} ({c.encoding}) -> field {c.field!r} "
                          f"({CONVERTED.get(c.encoding) or CONVERTED[c.kind]})")


def _sample_offsets(src, count: int, raw_bytes: int) -> np.ndarray:
    """The sample offsets of a shard (one more than its samples), checked against the count
    and size index.json records."""
    n = int(np.frombuffer(src.get(0, 4), "<u4")[0])
    if n != count:
        raise SourceError(f"shard holds {n} samples, index.json says {count}: corrupt",
                          path=src.shown)
    offsets = np.frombuffer(src.get(4, 8 + 4 * n), "<u4").astype(np.int64)
    if n and (offsets[0] < 8 + 4 * n or np.any(np.diff(offsets) < 0)
              or offsets[-1] != raw_bytes):
        raise SourceError("corrupt shard: its sample offsets are out of order or do not end "
                          "at the end of the shard", path=src.shown)
    return offsets


def _file(entry, what: str, where: str) -> tuple[str, int]:
    if not isinstance(entry, dict) or not isinstance(entry.get("basename"), str) \
            or not isinstance(entry.get("bytes"), int):
        raise SourceError(f"{what} must name a file (basename, bytes)", path=where)
    why = unsafe_name_reason(entry["basename"])
    if why:
        raise SourceError(f"{what} basename {entry['basename']!r}: {why}", path=where)
    return entry["basename"], entry["bytes"]


def _ndarray_column(name: str, encoding: str, arg: str, where: str) -> Column:
    parts = arg.split(":") if arg else []
    dtype = parts[0] if parts else None
    shape = None
    try:
        if len(parts) > 2 or (dtype is not None and dtype not in NDARRAY_DTYPES.values()):
            raise ValueError
        if len(parts) == 2:
            shape = tuple(int(d) for d in parts[1].split(","))
            if any(d < 1 for d in shape):
                raise ValueError
    except ValueError:
        raise SourceError(f"column {name!r}: bad ndarray encoding {encoding!r}: expected "
                          "ndarray[:DTYPE[:D1,D2,...]] with DTYPE one of "
                          f"{', '.join(NDARRAY_DTYPES.values())}", path=where) from None
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize if dtype and shape else None
    return Column(name, field_name(name, "npy"), encoding, "ndarray", size, dtype, shape)


def _value(column: Column, data: bytes) -> bytes:
    if column.kind == "carried":
        return data
    if column.kind == "scalar":
        return decimal(data, column.dtype)
    if column.kind == "pil":
        return pil_to_png(data)
    return _ndarray(column, data)


def _ndarray(column: Column, data: bytes) -> bytes:
    """MDS ``ndarray``: [dtype code: 1 byte unless static] [ndim << 2 | shape width code:
    1 byte, then the shape, unless static] [values]."""
    pos, dtype, shape = 0, column.dtype, column.shape
    if dtype is None:
        if not data or data[0] not in NDARRAY_DTYPES:
            raise ValueError(f"unknown array dtype code {data[:1].hex() or 'none'}")
        dtype, pos = NDARRAY_DTYPES[data[0]], 1
    if shape is None:
        if len(data) <= pos:
            raise ValueError("array has no shape byte")
        ndim, width = data[pos] >> 2, 1 << (data[pos] & 3)
        end = pos + 1 + ndim * width
        if len(data) < end:
            raise ValueError("array shape runs past the value")
        shape = tuple(int(d) for d in np.frombuffer(data[pos + 1:end], f"<u{width}"))
        pos = end
    return npy("<" + np.dtype(dtype).str[1:], shape, data[pos:])
