"""Image sizes from headers: ((width, height), format) of an image file from its own structure,
without decoding pixels, and from as few of its bytes as that structure needs (``info --stats``
reads headers of ranges of shard bytes; the preview sizes its cells).  Kept apart from
:mod:`shardpack.images`, which checks and decodes images."""

from __future__ import annotations

import io
import struct

from shardpack.core.errors import DecodeError
from shardpack.images.content import decode_rgb
from shardpack.images.kinds import content_format, describe_content, sniff


class HeaderShort(Exception):
    """The bytes at hand end before the image's size: bytes ``[at, need)`` of the file hold (more
    of) its header.  :func:`read_header` raises it; the caller reads those bytes and asks again."""

    def __init__(self, at: int, need: int):
        super().__init__(f"the header needs bytes {at:,} to {need:,}")
        self.at, self.need = at, need


class _Parts:
    """Windows ``(offset, bytes)`` of one file of ``size`` bytes, for the header parsers."""

    def __init__(self, parts, size: int):
        self.parts, self.size = parts, size

    def get(self, pos: int, n: int) -> bytes:
        end = pos + n
        if end > self.size:  # a whole-file question: no read can answer it
            raise ValueError(f"truncated: the header runs past the end of the {self.size:,}-byte "
                             "file")
        for start, data in self.parts:
            if start <= pos and end <= start + len(data):
                return bytes(data[pos - start:end - start])
        raise HeaderShort(pos, end)


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # frame headers (not DHT, JPG, DAC)


def _jpeg_size(get) -> tuple[int, int]:
    # Walk the segments by their lengths to the first frame header.  APPn segments (EXIF with a
    # thumbnail, an ICC profile split over many APP2 segments, XMP, Photoshop APP13) may hold
    # hundreds of KB before it; each is skipped by its length, never scanned.  Anything the walk
    # does not expect is a ValueError: the caller then asks Pillow, which tolerates more.
    pos = 2
    while True:
        marker = get(pos, 2)
        if marker[0] != 0xFF:
            raise ValueError(f"no JPEG marker at byte {pos}")
        kind = marker[1]
        if kind == 0xFF:  # fill byte
            pos += 1
            continue
        if kind in (0x00, 0x01, 0xD8) or 0xD0 <= kind <= 0xD7:  # no length (FF00: as Pillow)
            pos += 2
            continue
        if kind in (0xD9, 0xDA):
            raise ValueError("no JPEG frame header before the image data")
        if kind < 0xC0:  # reserved: neither Pillow nor libjpeg reads on
            raise ValueError(f"unknown JPEG marker 0x{kind:02x} at byte {pos}")
        length = int.from_bytes(get(pos + 2, 2), "big")
        if length < 2:
            raise ValueError(f"bad JPEG segment length at byte {pos}")
        if kind in _SOF:
            height, width = struct.unpack(">HH", get(pos + 5, 4))
            return width, height
        pos += 2 + length


def _png_size(get) -> tuple[int, int]:
    head = get(0, 24)
    if head[12:16] != b"IHDR":
        raise ValueError("PNG's first chunk is not IHDR")
    return struct.unpack_from(">II", head, 16)


def _gif_size(get) -> tuple[int, int]:
    # Pillow's size: the logical screen, grown to hold the first frame where it reaches past it
    # (so the blocks before the first image descriptor are walked: comments, XMP, NETSCAPE loop)
    head = get(0, 13)
    width, height = struct.unpack_from("<HH", head, 6)
    pos = 13 + (3 << ((head[10] & 7) + 1) if head[10] & 0x80 else 0)  # global colour table
    while True:
        block = get(pos, 1)[0]
        if block == 0x2C:  # image descriptor: left, top, width, height
            x, y, w, h = struct.unpack("<4H", get(pos + 1, 8))
            return max(width, x + w), max(height, y + h)
        if block != 0x21:
            raise ValueError(f"GIF block 0x{block:02x} at byte {pos} before the first image")
        pos += 2  # extension: introducer, label, then sub-blocks to a zero-length one
        while n := get(pos, 1)[0]:
            pos += n + 1
        pos += 1


def _webp_size(get) -> tuple[int, int]:
    # The first image-describing chunk: VP8X (extended: ICCP/EXIF/XMP/ALPH/ANIM chunks follow it,
    # and it holds the canvas size itself), or a plain VP8 (lossy) / VP8L (lossless) bitstream.
    pos = 12
    while True:
        kind, size = struct.unpack("<4sI", get(pos, 8))
        if kind == b"VP8X":
            data = get(pos + 8, 10)
            return (1 + int.from_bytes(data[4:7], "little"),
                    1 + int.from_bytes(data[7:10], "little"))
        if kind == b"VP8 ":  # frame tag (3 bytes), start code, 14-bit sizes + 2-bit scales
            data = get(pos + 8, 10)
            if data[3:6] != b"\x9d\x01\x2a":
                raise ValueError("WEBP VP8 chunk without the key frame start code")
            width, height = struct.unpack_from("<HH", data, 6)
            return width & 0x3FFF, height & 0x3FFF
        if kind == b"VP8L":  # signature, then 14-bit width-1 and height-1
            data = get(pos + 8, 5)
            if data[0] != 0x2F:
                raise ValueError("WEBP VP8L chunk without its signature")
            bits = int.from_bytes(data[1:5], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        pos += 8 + size + (size & 1)  # chunks are padded to even sizes


def _bmp_size(get) -> tuple[int, int]:
    header = int.from_bytes(get(14, 4), "little")
    if header == 12:  # OS/2 core header: 16-bit unsigned sizes
        return struct.unpack("<HH", get(18, 4))
    width, height = struct.unpack("<Ii", get(18, 8))
    return width, abs(height)  # a negative height: rows stored top-down


_TIFF_INT = {3: "H", 4: "I", 16: "Q"}  # SHORT, LONG, LONG8 (BigTIFF)


def _tiff_size(get) -> tuple[int, int]:
    # The first IFD, wherever the file puts it (libtiff writes it after the image data): its
    # ImageWidth and ImageLength, SHORT or LONG, in either byte order.  Orientation 5-8 (a
    # transpose) swaps them, as Pillow's size and decode do.
    order = "<" if get(0, 2) == b"II" else ">"
    if get(2, 2) in (b"+\0", b"\0+"):  # BigTIFF: 8-byte counts and offsets, 20-byte entries
        ifd = struct.unpack(order + "Q", get(8, 8))[0]
        count = struct.unpack(order + "Q", get(ifd, 8))[0]
        first, entry, count_code = ifd + 8, 20, "Q"
    else:
        ifd = struct.unpack(order + "I", get(4, 4))[0]
        count = struct.unpack(order + "H", get(ifd, 2))[0]
        first, entry, count_code = ifd + 2, 12, "I"
    if not ifd or not count:
        raise ValueError("TIFF without an image directory")
    table = get(first, entry * count)
    found = {}
    for at in range(0, entry * count, entry):
        tag, kind = struct.unpack_from(order + "HH", table, at)
        code = _TIFF_INT.get(kind)
        if tag not in (256, 257, 274) or code is None or (code == "Q" and entry == 12):
            continue
        values = struct.unpack_from(order + count_code, table, at + 4)[0]
        inline = 4 + struct.calcsize(count_code)  # the value field: 4 bytes, BigTIFF's 8
        if values >= 1 and struct.calcsize(code) <= entry - inline:
            found[tag] = struct.unpack_from(order + code, table, at + inline)[0]
    if 256 not in found or 257 not in found:
        raise ValueError("TIFF image directory without ImageWidth and ImageLength")
    size = found[256], found[257]
    return size[::-1] if found.get(274) in (5, 6, 7, 8) else size


_SIZES = {"JPEG": _jpeg_size, "PNG": _png_size, "GIF": _gif_size, "WEBP": _webp_size,
          "BMP": _bmp_size, "TIFF": _tiff_size}


def read_header(parts, size: int) -> tuple[tuple[int, int], str]:
    """((width, height), format) from the header of an image file of ``size`` bytes, of which
    ``parts`` holds some windows ``(offset, bytes)`` (the first at offset 0; the whole file in
    one window is fine).  No pixels are decoded, and the format's own structure says where the
    size is, however far in (large APPn segments of a JPEG, a TIFF directory at the end).
    Raises :class:`HeaderShort` naming the bytes it needs next when ``parts`` lacks them, and
    ValueError for bytes it cannot parse (no supported format, a structure it does not expect,
    a header cut off by the end of the file): :func:`header_info` then asks Pillow."""
    get = _Parts(parts, size).get
    fmt = sniff(get(0, min(size, 18)))
    if fmt is None:
        raise ValueError("not a supported image format")
    try:
        width, height = _SIZES[fmt](get)
    except struct.error as exc:  # (get returns what it was asked for: a parser bug, if any)
        raise ValueError(f"cannot parse the {fmt} header: {exc}") from None
    if not width or not height:
        raise ValueError(f"{fmt} header says {width}x{height} pixels")
    return (width, height), fmt


def header_info(data) -> tuple[tuple[int, int], str]:
    """((width, height), format) of a whole image file: from its header (:func:`read_header`:
    no pixels decoded, and a large image is a size here, not an error).  Where that parse fails,
    Pillow opens the header (it tolerates junk between JPEG segments and the like); where Pillow
    fails too, the image is decoded (:func:`decode_rgb`), so an image that decodes always has a
    size.  Raises :class:`DecodeError` with the reason for one that does not.

    Args:
        data: the whole image file's bytes.
    """
    import warnings

    from PIL import Image

    try:
        return read_header([(0, data)], len(data))
    except (HeaderShort, ValueError):
        pass
    data = bytes(data)
    fmt = content_format(data) if data else None
    if fmt is None:
        raise DecodeError(f"not an image: {describe_content(data) if data else 'empty (0 bytes)'}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=[fmt]) as image:
                return image.size, image.format
        except Exception:  # noqa: BLE001, S110 - Pillow raises many types; the decode says why
            pass
    pixels = decode_rgb(data)
    return (pixels.shape[1], pixels.shape[0]), fmt
