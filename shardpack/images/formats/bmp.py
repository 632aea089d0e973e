"""BMP: decoded by Pillow; passes ``pack --resize`` unchanged."""

from __future__ import annotations

import struct

from shardpack.images.formats.base import Codec

BMP_HEADERS = (12, 40, 52, 56, 64, 108, 124)  # the DIB header sizes BMP writers use


def _bmp_size(get) -> tuple[int, int]:
    header = int.from_bytes(get(14, 4), "little")
    if header == 12:  # OS/2 core header: 16-bit unsigned sizes
        return struct.unpack("<HH", get(18, 4))
    width, height = struct.unpack("<Ii", get(18, 8))
    return width, abs(height)  # a negative height: rows stored top-down


def _check_bmp(data: bytes) -> str | None:
    n = len(data)
    header = int.from_bytes(data[14:18], "little") if n >= 18 else 0
    if n < 26 or n < 14 + header or header not in BMP_HEADERS:
        return "truncated BMP: file ends inside the header"
    declared, offset = struct.unpack_from("<I4xI", data, 2)
    if header == 12:  # OS/2 core header: 16-bit sizes, no compression
        (width, height, _, bits), compression, size = struct.unpack_from("<4H", data, 18), 0, 0
    else:
        width, height, _, bits, compression, size = struct.unpack_from("<iiHHII", data, 18)
    if not 14 + header <= offset <= n:
        return f"truncated BMP: pixel data offset {offset} is outside the {n}-byte file"
    if declared > n:
        return f"truncated BMP: file is {n} bytes, its header says {declared}"
    if compression in (0, 3, 6):  # uncompressed: rows padded to 4 bytes
        size = (width * bits + 31) // 32 * 4 * abs(height)
    if offset + size > n:
        return f"truncated BMP: pixel data needs {offset + size} bytes, file has {n}"
    return None


class BmpCodec(Codec):
    """Windows and OS/2 bitmaps."""

    name = "BMP"
    extensions = ("bmp",)
    magics = (b"BM",)
    lossless = True

    def sniff(self, head: bytes) -> bool:
        """"BM" alone is too weak (text may start so): a known DIB header size too."""
        return head[:2] == b"BM" and int.from_bytes(head[14:18], "little") in BMP_HEADERS

    def size(self, get) -> tuple[int, int]:
        """(width, height) from the DIB header (a negative height: rows stored top-down)."""
        return _bmp_size(get)

    def check(self, data: bytes) -> str | None:
        """The header's sizes against the file's."""
        return _check_bmp(data)


BMP = BmpCodec()
