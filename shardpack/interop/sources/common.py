"""What the MDS and LitData readers share: reading a shard file forward in large windows,
decompression bounded by the size an index records, field naming, and the few value
conversions (numbers -> ASCII decimal text, raw pixels -> PNG, raw arrays -> ``.npy``).

Both formats store a sample as per-column (per-leaf) byte strings; most are already files
(JPEG, PNG, UTF-8 text, JSON, raw bytes) and are carried byte for byte.  The rest have no file
form of their own and are converted losslessly: numbers to ASCII decimal (shardpack's ``cls``
convention: label 3 -> ``b"3"``), raw PIL pixels to PNG, numpy/torch arrays to ``.npy``.
"""

from __future__ import annotations

import bz2
import io
import math
import zlib

import numpy as np

from shardpack.core.errors import SourceError
from shardpack.images.formats.png import PNG
from shardpack.storage import storage_options_by_keyword
from shardpack.write.fields import FieldReader, open_container
from shardpack.format import check_field_name

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CODECS = ("zstd", "gz", "bz2")
# Decompression cap (docs/convert.md "Hostile inputs"): a compressed shard, chunk or frame may
# claim at most MAX_EXPANSION times its compressed size, or EXPANSION_FLOOR bytes whatever its
# size (every shard of the default 64 MB MDS / LitData writers fits).  A claim above both is
# refused before anything is decompressed; decompression itself stops at the claim.
MAX_EXPANSION = 1024
EXPANSION_FLOOR = 256 << 20


class Window:
    """Byte ranges of one file, read forward in blocks of ``block`` bytes: the headers and small
    values of consecutive samples cost one read per block, and a large value that is carried as
    a byte range (not asked for here) is skipped without being read."""

    def __init__(self, storage, name: str, size: int, block: int = 16 << 20):
        self.storage, self.name, self.size, self.block = storage, name, size, block
        self.shown = storage.display(name)
        self.start = self.end = 0
        self.buf = b""

    def get(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file, from the block read (one read of the next block
        when they are outside it); past the file's end is a SourceError.

        Args:
            start: the first byte.
            end: the byte after the last.
        """
        if end > self.size:
            raise SourceError(f"needs bytes {start}..{end} but the file has {self.size}: "
                              "truncated", path=self.shown)
        if start < self.start or end > self.end:
            stop = min(self.size, max(end, start + self.block))
            self.buf = b""  # let the old block go first
            self.buf = self.storage.read_bytes(self.name, start, stop)
            self.start, self.end = start, stop
        return self.buf[start - self.start:end - self.start]


class ByteRanges(FieldReader):
    """Reads fields that are byte ranges of container files (``SourceField.offset``: an
    uncompressed tar, MDS or LitData shard) through a :class:`Window` on the current container:
    one read of at least ``block`` bytes serves all the fields that follow in it, so a shard
    converted from a tar or MDS file costs a few large reads, not one per field.  Any storage
    fsspec reaches works; a local container is refused if it changed since the plan."""

    @storage_options_by_keyword
    def __init__(self, fields, *, storage_options: dict | None = None, block: int = 16 << 20):
        super().__init__(fields, storage_options=storage_options)
        self.block = block
        self.containers: dict[str, tuple] = {}  # path -> (storage, name, size)
        self.path = None
        self.window: Window | None = None

    def read(self, f) -> bytes:
        """The field's bytes, from the window on its container.

        Args:
            f: one of the fields this reader was opened on.
        """
        if f.path != self.path:
            self._open(f)
        start, end = f.offset, f.offset + f.size
        size = self.window.size
        if end > size:
            raise SourceError(f"field '{f.name}' runs past the end of the file ({end} > {size} "
                              "bytes): truncated or changed since it was indexed", path=f.path)
        return self.window.get(start, end)

    def _open(self, f) -> None:
        if f.path not in self.containers:
            storage, name = open_container(f, storage_options=self.options)
            self.containers[f.path] = storage, name, storage.size(name)
        self.window = None  # let the old window's block go before the next one is read
        self.window = Window(*self.containers[f.path], self.block)
        self.path = f.path

    @staticmethod
    def where(f) -> str:
        """The container and byte offset of ``f``, for error messages.

        Args:
            f: a field.
        """
        return f"{f.path} at byte {f.offset}"


class Memory:
    """The :class:`Window` interface over bytes already in memory (a decompressed shard)."""

    def __init__(self, data: bytes, shown: str):
        self.data, self.size, self.shown = memoryview(data), len(data), shown

    def get(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the data; past its end is a SourceError.

        Args:
            start: the first byte.
            end: the byte after the last.
        """
        if end > self.size:
            raise SourceError(f"needs bytes {start}..{end} but the decompressed data has "
                              f"{self.size}: truncated", path=self.shown)
        return bytes(self.data[start:end])


def check_expansion(expected: int, compressed: int, shown: str, what: str = "the index") -> None:
    """Refuse a decompressed size (``expected``, as ``what`` records it) that is negative or
    above the cap for ``compressed`` bytes (:data:`MAX_EXPANSION`, :data:`EXPANSION_FLOOR`)."""
    cap = max(EXPANSION_FLOOR, MAX_EXPANSION * compressed)
    if expected < 0 or expected > cap:
        raise SourceError(f"{what} records {expected} decompressed bytes for {compressed} "
                          f"compressed: refused (at most {MAX_EXPANSION}x the compressed size "
                          f"or {EXPANSION_FLOOR >> 20} MiB)", path=shown)


def decompress(codec: str, data: bytes, expected: int, shown: str) -> bytes:
    """``data`` decompressed with ``codec`` (zstd, gz or bz2), never more than ``expected``
    bytes (the size the index records): more, less or a broken stream is a SourceError, and so
    is an ``expected`` over the cap (:func:`check_expansion`) or, for zstd, one that differs
    from the sizes the frame headers declare; both are checked before decompressing.  Returns
    a bytes-like object (a bytearray: grown in place, never held twice)."""
    if codec == "zstd":
        declared = zstd_content_size(data)
        if declared is not None and declared != expected:
            raise SourceError(f"the index records {expected} decompressed bytes, the zstd frame "
                              f"header says {declared}: refused", path=shown)
    check_expansion(expected, len(data), shown)
    inflate = _INFLATE.get(codec)
    if inflate is None:
        raise SourceError(f"unsupported compression {codec!r}: expected one of "
                          f"{', '.join(CODECS)}", path=shown)
    try:
        out = inflate(data, expected + 1)  # one byte over is enough to know the index is wrong
    except (zlib.error, OSError, EOFError, ValueError) as exc:
        raise SourceError(f"cannot decompress ({codec}): {type(exc).__name__}: {exc}",
                          path=shown) from None
    except Exception as exc:  # noqa: BLE001 - zstandard.ZstdError and friends
        if type(exc).__module__.startswith("zstandard"):
            raise SourceError(f"cannot decompress ({codec}): {exc}", path=shown) from None
        raise
    if len(out) > expected:
        raise SourceError(f"decompresses to more than the {expected} bytes the index records: "
                          "refused", path=shown)
    if len(out) != expected:
        raise SourceError(f"decompresses to {len(out)} bytes, the index records {expected}: "
                          "truncated or replaced", path=shown)
    return out


def _zstd(data: bytes, limit: int) -> bytearray:
    import zstandard

    out = bytearray()
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as r:
        while len(out) < limit:
            part = r.read(min(limit - len(out), 16 << 20))
            if not part:
                break
            out += part
    return out


def _stream(d, data: bytes, limit: int) -> bytes:
    """Up to ``limit`` bytes out of the decompressor ``d``; a stream that ends early (less
    than ``limit``, no end marker) is a ValueError."""
    out = d.decompress(data, limit)
    if len(out) < limit and not d.eof:
        raise ValueError("the compressed stream ends early")
    return out


# codec -> (compressed bytes, most bytes wanted) -> decompressed bytes
_INFLATE = {"zstd": _zstd,
            "gz": lambda data, limit: _stream(zlib.decompressobj(wbits=31), data, limit),
            "bz2": lambda data, limit: _stream(bz2.BZ2Decompressor(), data, limit)}


def zstd_frame_size(data: bytes) -> int | None:
    """The decompressed size a zstd frame declares in its header, or None when it has none."""
    import zstandard

    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        return None
    return size if size >= 0 else None


def zstd_content_size(data) -> int | None:
    """The decompressed size the frame headers of ``data`` declare, summed over its frames
    (skippable frames count 0), or None when a frame declares none or the frames do not walk
    exactly to the end of ``data`` (the decompressor then says what is wrong).  Reads only the
    frame and block headers; every step advances at least 3 bytes."""
    import zstandard

    pos, total, n = 0, 0, len(data)
    while pos < n:
        if n - pos < 8:
            return None
        magic = int.from_bytes(data[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame: magic, u32 size, bytes
            pos += 8 + int.from_bytes(data[pos + 4:pos + 8], "little")
            continue
        if magic != 0xFD2FB528:
            return None
        head = bytes(data[pos:pos + 18])
        try:
            size = zstandard.frame_content_size(head)
            pos += zstandard.frame_header_size(head)
        except zstandard.ZstdError:
            return None
        if size < 0:
            return None
        checksum = head[4] & 4
        while True:  # blocks: 3-byte header (last, type, size), then the block's bytes
            if n - pos < 3:
                return None
            header = int.from_bytes(data[pos:pos + 3], "little")
            kind, length = (header >> 1) & 3, header >> 3
            if kind == 3:
                return None
            pos += 3 + (1 if kind == 1 else length)
            if header & 1:
                break
        pos += 4 if checksum else 0
        total += size
    return total if pos == n else None


# -- naming ------------------------------------------------------------------------------------
def field_name(column: str, ext: str | None) -> str:
    """A column's field name: the column name, plus ``.ext`` when the encoding implies a file
    type and the name has no dot and is not that extension already (``image``+jpeg ->
    ``image.jpg``; ``jpg``+jpeg -> ``jpg``; ``seg.png`` stays ``seg.png``)."""
    lowered = column.lower()
    if not column or not ext or "." in column or lowered == ext or \
            (ext == "jpg" and lowered == "jpeg"):
        return column
    return f"{column}.{ext}"


def check_fields(names: list[str], columns: list[str], what: str, shown: str) -> None:
    """Refuse, once for the whole source, column names that cannot be field names or that
    collide once named."""
    for name, column in zip(names, columns, strict=True):
        why = check_field_name(name)
        if why:
            raise SourceError(f"{what} {column!r} cannot become a field: {why}", path=shown)
    if len(set(names)) != len(names):
        raise SourceError(f"{what}s {columns} give the same field name twice ({names})",
                          path=shown, hint="rename the columns")


# -- value conversions ---------------------------------------------------------------------
def decimal(data: bytes, dtype: str) -> bytes:
    """A little-endian numpy scalar as ASCII text: ints in decimal, floats in the shortest form
    that reads back to the same value (``0.1``, ``1e+20``, ``nan``), bools as ``1``/``0``."""
    value = np.frombuffer(data, np.dtype(dtype))[0]
    if value.dtype == np.bool_:
        return b"1" if value else b"0"
    return str(value).encode()


def pil_to_png(data: bytes) -> bytes:
    """PIL's raw layout (uint32 width, height, mode length; mode; pixels), which MDS ``pil`` and
    LitData ``pil`` store, as a PNG of the same pixels.  ValueError says why it cannot be."""
    from PIL import Image

    from PIL import ImageMode

    if len(data) < 12:
        raise ValueError("raw image shorter than its 12-byte header")
    width, height, mode_size = (int(x) for x in np.frombuffer(data[:12], "<u4"))
    if mode_size > min(16, len(data) - 12):
        raise ValueError(f"raw image mode name of {mode_size} bytes: corrupt header")
    mode = data[12:12 + mode_size].decode("ascii", "replace")
    try:
        info = ImageMode.getmode(mode)
    except KeyError:
        raise ValueError(f"raw image mode {mode!r} is not an image mode") from None
    # the cell must hold exactly the pixels its header claims, checked before any allocation
    # (Pillow then holds at most 8x the cell: mode "1" keeps a byte per 1-bit pixel)
    row = (width + 7) // 8 if mode == "1" else \
        width * len(info.bands) * np.dtype(info.typestr).itemsize
    pixels = len(data) - 12 - mode_size
    if not width or not height or row * height != pixels:
        raise ValueError(f"raw {mode} image {width}x{height} needs {row * height} bytes of "
                         f"pixels, the cell holds {pixels}")
    try:
        image = Image.frombytes(mode, (width, height), data[12 + mode_size:])
        return PNG.encode(image)
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(f"raw {mode} image {width}x{height} cannot be stored as PNG: "
                         f"{exc}") from None


def npy(dtype, shape: tuple[int, ...], raw: bytes) -> bytes:
    """A ``.npy`` file of the array ``raw`` holds (C order).  ValueError if the sizes disagree."""
    dtype = np.dtype(dtype)
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"array dtype {dtype} has no fixed-size binary form")
    count = math.prod(int(d) for d in shape)  # Python ints: a crafted shape cannot wrap
    if count * dtype.itemsize != len(raw):
        raise ValueError(f"array of shape {tuple(shape)} and dtype {dtype} needs "
                         f"{count * dtype.itemsize} bytes, the sample holds {len(raw)}")
    out = io.BytesIO()
    np.save(out, np.frombuffer(raw, dtype).reshape(shape), allow_pickle=False)
    return out.getvalue()
