"""WebP: decoded by Pillow; ``pack --resize`` re-encodes it at the pack's quality."""

from __future__ import annotations

import struct

from shardpack.images.formats.base import Codec


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


def _check_webp(data: bytes) -> str | None:
    n = len(data)
    if n < 20:
        return "truncated WEBP: file ends inside the header"
    end = struct.unpack_from("<I", data, 4)[0] + 8
    if n < end:
        return f"truncated WEBP: file is {n} bytes, its RIFF header says {end}"
    pos, image = 12, False
    while pos + 8 <= end:
        kind, size = struct.unpack_from("<4sI", data, pos)
        pos += 8 + size + (size & 1)  # chunks are padded to even sizes
        if pos > end + (size & 1):
            return f"corrupt WEBP: {kind.decode('latin-1')!r} chunk runs past the RIFF data"
        image |= kind in (b"VP8 ", b"VP8L", b"ANMF")
    return None if image else "corrupt WEBP: no image data chunk"


class WebpCodec(Codec):
    """WebP: lossy (VP8), lossless (VP8L), extended (VP8X), animated."""

    name = "WEBP"
    extensions = ("webp",)
    magics = (b"RIFF",)  # and "WEBP" at byte 8: :meth:`sniff`
    reencodes = True

    def sniff(self, head: bytes) -> bool:
        """RIFF, then WEBP at byte 8."""
        return head[:4] == b"RIFF" and head[8:12] == b"WEBP"

    def size(self, get) -> tuple[int, int]:
        """(width, height) from the first image-describing chunk."""
        return _webp_size(get)

    def check(self, data: bytes) -> str | None:
        """The RIFF size against the file's, and the chunk walk."""
        return _check_webp(data)

    def save_options(self, quality: int) -> dict:
        """At ``quality``."""
        return {"quality": quality}


WEBP = WebpCodec()
