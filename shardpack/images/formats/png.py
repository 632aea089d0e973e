"""PNG: decoded by Pillow; ``pack --resize`` re-encodes it losslessly."""

from __future__ import annotations

import struct

from shardpack.images.formats.base import Codec

# Conservative upper bounds on what a file's compressed bytes can hold (docs/images.md, "Decode
# budget"): deflate codes a 258-byte match in 2 bits at best, so PNG's filtered data is at most
# 1032 x its IDAT bytes; a Huffman-coded JPEG (sequential, progressive or lossless) codes every
# 8 x 8 block of its full-resolution component with at least a 1-bit DC code, so it holds at most
# 512 pixels per byte of scan data.  Arithmetic-coded JPEG, WebP (boolean-arithmetic VP8,
# zero-bit VP8L codes), GIF, RLE BMP and compressed TIFF have no useful bound: the budget
# alone guards them.
DEFLATE_MAX_RATIO = 1032
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_size(get) -> tuple[int, int]:
    head = get(0, 24)
    if head[12:16] != b"IHDR":
        raise ValueError("PNG's first chunk is not IHDR")
    return struct.unpack_from(">II", head, 16)


def _check_png(data: bytes) -> str | None:
    n, pos, has_data = len(data), 8, False
    while pos + 12 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if pos == 8 and kind != b"IHDR":
            return "corrupt PNG: first chunk is not IHDR"
        if not kind.isalpha():
            return f"corrupt PNG: bad chunk type at byte {pos}"
        pos += 12 + length  # length, type, data, CRC
        if pos > n:
            return f"truncated PNG: {kind.decode()} chunk runs past the end of the file"
        if kind == b"IEND":
            return None if has_data else "corrupt PNG: no IDAT (image data) chunk"
        has_data |= kind == b"IDAT"
    return "truncated PNG: no IEND chunk"


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


class PngCodec(Codec):
    """PNG: any bit depth and colour type, interlaced or not."""

    name = "PNG"
    extensions = ("png",)
    magics = (b"\x89PNG\r\n\x1a\n",)
    lossless = True
    reencodes = True

    def size(self, get) -> tuple[int, int]:
        """(width, height) from IHDR."""
        return _png_size(get)

    def check(self, data: bytes) -> str | None:
        """The chunk walk from IHDR to IEND, with image data between."""
        return _check_png(data)

    def capacity(self, data: bytes) -> str | None:
        """At most :data:`DEFLATE_MAX_RATIO` x the IDAT bytes of filtered pixel data."""
        return _png_capacity(data)

    def save_options(self, quality: int) -> dict:
        """Lossless (``quality`` does not apply), not optimised (a pack stays fast)."""
        return {"optimize": False}


PNG = PngCodec()
