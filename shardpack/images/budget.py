"""The decode budget: an image's size from its header is checked against it (and Pillow's
decompression-bomb limit) before any pixel memory is taken, and a header that claims more pixels
than the file's compressed data can hold is refused (docs/images.md, "Decode budget")."""

from __future__ import annotations

import os
import struct

from shardpack.core.errors import DecodeError, ShardpackError

from .kinds import sniff

# The decode budget: 64 Mi pixels (8192 x 8192, 192 MiB of RGB).  12 MP photos, 8K frames
# (7680 x 4320) and 8192 x 8192 textures decode; a 13000 x 13000 PNG bomb (164 KB of deflated
# zeros, 1.8 GB to decode) does not.  docs/images.md, "Decode budget".
DEFAULT_MAX_PIXELS = 8192 * 8192
MAX_PIXELS_ENV = "SHARDPACK_MAX_PIXELS"


def decode_budget(max_pixels: int | None = None) -> int:
    """The decode budget in pixels (0: none): ``max_pixels`` when given, else the environment
    variable ``SHARDPACK_MAX_PIXELS`` (read at call time, so DataLoader workers and the CLI see
    it), else :data:`DEFAULT_MAX_PIXELS`.  A value that is no whole number >= 0 is a
    ShardpackError, never a DecodeError: ``on_error="skip"`` must not skip every image for it."""
    if max_pixels is None:
        raw = os.environ.get(MAX_PIXELS_ENV, "").strip()
        if not raw:
            return DEFAULT_MAX_PIXELS
        try:
            max_pixels = int(raw.replace("_", ""))
        except ValueError:
            max_pixels = -1
        if max_pixels < 0:
            raise ShardpackError(f"{MAX_PIXELS_ENV}={raw!r}: expected a whole number of pixels "
                                 "(0 for no decode budget)")
        return max_pixels
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 0:
        raise ShardpackError(f"max_pixels={max_pixels!r}: expected a whole number of pixels "
                             "(0 for no decode budget, None for the default)")
    return max_pixels


def check_size(width: int, height: int, max_pixels: int | None = None) -> None:
    """Raise DecodeError for an image over the decode budget (:func:`decode_budget`) or over
    Pillow's decompression-bomb limit (read at call time, so raising or clearing
    ``PIL.Image.MAX_IMAGE_PIXELS`` works here as it does in Pillow).  Both apply: the smaller
    one decides.

    Args:
        width: the image's width in pixels.
        height: its height.
        max_pixels: the decode budget (None: :func:`decode_budget`'s default).
    """
    from PIL import Image

    pixels = width * height
    budget = decode_budget(max_pixels)
    if budget and pixels > budget:
        raise DecodeError(f"image too large: {width:,}x{height:,} = {pixels:,} pixels, over the "
                          f"decode budget of {budget:,} pixels (raise it with {MAX_PIXELS_ENV} "
                          "or max_pixels= if the image is real)")
    if Image.MAX_IMAGE_PIXELS and pixels > 2 * Image.MAX_IMAGE_PIXELS:
        raise DecodeError(too_large_message(pixels))


# Conservative upper bounds on what a file's compressed bytes can hold (docs/images.md, "Decode
# budget"): deflate codes a 258-byte match in 2 bits at best, so PNG's filtered data is at most
# 1032 x its IDAT bytes; a Huffman-coded JPEG (sequential, progressive or lossless) codes every
# 8 x 8 block of its full-resolution component with at least a 1-bit DC code, so it holds at most
# 512 pixels per byte of scan data.  Arithmetic-coded JPEG, WebP (boolean-arithmetic VP8,
# zero-bit VP8L codes), GIF, RLE BMP and compressed TIFF have no useful bound: the budget
# alone guards them.
DEFLATE_MAX_RATIO = 1032
JPEG_PIXELS_PER_BYTE = 64 * 8
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_JPEG_HUFFMAN_SOF = (0xC0, 0xC1, 0xC2, 0xC3)


def capacity_reason(data: bytes) -> str | None:
    """Why the header claims more pixels than the file's compressed data can hold, or None (also
    for formats without a bound and for structures it does not parse: the decode judges those).
    Cheap: a header and chunk walk."""
    fmt = sniff(data)
    if fmt == "PNG":
        return _png_capacity(data)
    if fmt == "JPEG":
        return _jpeg_capacity(data)
    return None


def _png_capacity(data: bytes) -> str | None:
    n = len(data)
    if n < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    channels = _PNG_CHANNELS.get(colour)
    if channels is None:
        return None
    pos, stored = 8, 0
    while pos + 12 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IDAT":
            stored += length
        elif kind == b"IEND":
            break
        pos += 12 + length
    # filter bytes left out (and an interlaced image's extra ones): the bound only gets looser
    needed = (width * height * depth * channels + 7) // 8
    if needed > DEFLATE_MAX_RATIO * stored:
        return (f"corrupt PNG: header says {width:,}x{height:,} pixels ({needed:,} bytes of "
                f"{depth}-bit samples), more than its {stored:,} bytes of image data can hold "
                f"(deflate expands at most {DEFLATE_MAX_RATIO}x)")
    return None


def _jpeg_capacity(data: bytes) -> str | None:
    n, pos, frame = len(data), 2, None
    while pos + 4 <= n:  # the segment walk of _check_jpeg, to the first scan
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2 or marker == 0xD9:
            return None
        if frame is None and 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > n:
                return None
            height, width = struct.unpack_from(">HH", data, pos + 5)
            frame = marker, width, height
        pos += 2 + length
        if marker == 0xDA:
            break
    else:
        return None
    if frame is None or frame[0] not in _JPEG_HUFFMAN_SOF:
        return None
    _, width, height = frame
    scan = max(0, n - pos)  # everything after the first scan header (later scans included)
    if width * height > JPEG_PIXELS_PER_BYTE * scan:
        return (f"corrupt JPEG: header says {width:,}x{height:,} pixels, more than its {scan:,} "
                f"bytes of scan data can hold (at least 1 bit per 8x8 block)")
    return None


def too_large_message(pixels: int) -> str:
    """The message for an image over Pillow's decompression-bomb limit.

    Args:
        pixels: the image's pixel count.
    """
    from PIL import Image

    return (f"image too large: {pixels:,} pixels, over the decompression-bomb limit of "
            f"{2 * Image.MAX_IMAGE_PIXELS:,} (raise PIL.Image.MAX_IMAGE_PIXELS if it is real)")
