"""TIFF (and BigTIFF): decoded by Pillow; passes ``pack --resize`` unchanged."""

from __future__ import annotations

import struct

from shardpack.images.formats.base import Codec


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


_TIFF_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}


def _check_tiff(data: bytes) -> str | None:
    n, order = len(data), "<" if data[:1] == b"I" else ">"
    if data[2:4] in (b"+\0", b"\0+"):  # BigTIFF: only the first IFD offset is checked
        if n < 16 or struct.unpack_from(order + "Q", data, 8)[0] + 8 > n:
            return "truncated TIFF: first IFD is past the end of the file"
        return None
    if n < 8:
        return "truncated TIFF: file ends inside the header"
    ifd = struct.unpack_from(order + "I", data, 4)[0]
    if ifd < 8 or ifd + 2 > n:
        return f"truncated TIFF: first IFD at byte {ifd} is outside the {n}-byte file"
    count = struct.unpack_from(order + "H", data, ifd)[0]
    if ifd + 6 + 12 * count > n:
        return "truncated TIFF: first IFD runs past the end of the file"
    arrays = {}
    for at in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind, values, where = struct.unpack_from(order + "HHII", data, at)
        size = _TIFF_SIZES.get(kind, 1) * values
        if size > 4 and where + size > n:
            return f"truncated TIFF: tag {tag} data runs past the end of the file"
        if tag in (273, 279, 324, 325) and kind in (3, 4):  # strip/tile offsets and byte counts
            code = "H" if kind == 3 else "I"
            arrays[tag] = struct.unpack_from(f"{order}{values}{code}", data,
                                             at + 8 if size <= 4 else where)
    for offsets, counts in ((arrays.get(273), arrays.get(279)), (arrays.get(324), arrays.get(325))):
        if offsets and counts and max(map(int.__add__, offsets, counts)) > n:
            return "truncated TIFF: image data runs past the end of the file"
    following = struct.unpack_from(order + "I", data, ifd + 2 + 12 * count)[0]
    if following and following + 2 > n:
        return "truncated TIFF: next IFD is past the end of the file"
    return None


class TiffCodec(Codec):
    """TIFF in either byte order, classic or BigTIFF."""

    name = "TIFF"
    extensions = ("tif", "tiff")
    magics = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")
    lossless = True

    def size(self, get) -> tuple[int, int]:
        """(width, height) of the first image directory (swapped by a transposing
        orientation, as Pillow does)."""
        return _tiff_size(get)

    def check(self, data: bytes) -> str | None:
        """The first directory's data and the image data within the file."""
        return _check_tiff(data)


TIFF = TiffCodec()
