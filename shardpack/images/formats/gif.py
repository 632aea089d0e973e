"""GIF: decoded by Pillow (the first frame); passes ``pack --resize`` unchanged."""

from __future__ import annotations

import struct

from shardpack.images.formats.base import Codec


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


def _check_gif(data: bytes) -> str | None:
    # Walk the block structure to the trailer (0x3B).  A trailer test alone would pass a file cut
    # just after a 0x3B data byte; the walk costs ~0.1 us per 255-byte sub-block.
    n = len(data)
    if n < 13:
        return "truncated GIF: no logical screen descriptor"
    flags = data[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # global colour table
    frames = 0
    while pos < n:
        block = data[pos]
        if block == 0x3B:
            return None if frames else "corrupt GIF: no image in the file"
        if block == 0x2C:  # image descriptor, local colour table, LZW code size
            if pos + 10 > n:
                break
            flags = data[pos + 9]
            pos += 11 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
            frames += 1
        elif block == 0x21:  # extension: label byte, then sub-blocks
            pos += 2
        else:
            return f"corrupt GIF: unknown block 0x{block:02x} at byte {pos}"
        while pos < n and data[pos]:  # sub-blocks until the zero-length terminator
            pos += data[pos] + 1
        pos += 1
    return "truncated GIF: file ends before the trailer"


class GifCodec(Codec):
    """GIF87a and GIF89a, animated or not (the first frame is the image)."""

    name = "GIF"
    extensions = ("gif",)
    magics = (b"GIF87a", b"GIF89a")
    lossless = True

    def size(self, get) -> tuple[int, int]:
        """Pillow's size: the logical screen, grown to hold the first frame."""
        return _gif_size(get)

    def check(self, data: bytes) -> str | None:
        """The block walk to the trailer, with an image before it."""
        return _check_gif(data)


GIF = GifCodec()
