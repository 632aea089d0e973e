"""Cheap structural checks of image bytes: header and chunk walks, no pixel decode (a few
microseconds for a 100 KB JPEG).  Each check returns None for bytes that look whole, else a
one-line reason (docs/images.md, "Quick check")."""

from __future__ import annotations

import struct

from .kinds import BMP_HEADERS, describe_content, image_format, sniffed_kind

EOI = b"\xff\xd9"


def check_image(data, field: str) -> str | None:
    """None if the image bytes look whole, else a short one-line reason.  Cheap: header and
    chunk walks, no pixel decode (a few microseconds for a 100 KB JPEG).  An image whose content is
    another supported format than the field name says is accepted (checked as what it is).
    Fields that are not image fields are not checked (None).

    Args:
        data: the image file's bytes.
        field: the field name (its extension names the expected format).
    """
    expected = image_format(field)
    if expected is None:
        return None
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    if not data:
        return "empty image file (0 bytes)"
    fmt = sniffed_kind(data)
    if fmt is None:
        return f"not {'a ' + expected if expected else 'an'} image: {describe_content(data)}"
    return STRUCTURE_CHECKS[fmt](data)


JPEG_CUT = "truncated JPEG: file ends inside the headers, before the image data"


def _check_jpeg(data: bytes) -> str | None:
    scan = _jpeg_scan_start(data)
    if isinstance(scan, str):
        return scan
    pos, frame = scan
    if pos > len(data) - 2:
        return JPEG_CUT
    if not frame:
        return "corrupt JPEG: image data before any frame header"
    # FF D9 cannot occur inside entropy-coded data (FF is stuffed there), so one anywhere after the
    # scan header is the end of the image; data appended after it (motion photos) is fine.  The
    # end-of-file test first: rfind is C speed but reads the whole file when EOI is missing.
    if data[-2:] != EOI and data.rfind(EOI, pos) < 0:
        return "truncated JPEG: no end-of-image marker after the scan data"
    return None


def _jpeg_scan_start(data: bytes) -> tuple[int, bool] | str:
    """``(where the first scan's data starts, whether a frame header came before it)``, or why
    the segment walk failed.  The walk follows segment lengths: an EXIF thumbnail (a whole
    JPEG, EOI included, inside APP1) is skipped by its segment length and never counts."""
    n, pos, frame = len(data), 2, False
    while True:
        if pos + 2 > n:
            return JPEG_CUT
        if data[pos] != 0xFF:
            return f"corrupt JPEG: no marker at byte {pos}"
        marker = data[pos + 1]
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD7:
            pos += 1 if marker == 0xFF else 2  # a fill byte; markers without a length
            continue
        if marker == 0xD9:
            return "corrupt JPEG: end-of-image marker before any image data"
        if pos + 4 > n:
            return JPEG_CUT
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return f"corrupt JPEG: bad segment length at byte {pos}"
        pos += 2 + length
        if marker == 0xDA:
            return pos, frame
        frame |= 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC)


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


STRUCTURE_CHECKS = {"JPEG": _check_jpeg, "PNG": _check_png, "GIF": _check_gif, "WEBP": _check_webp,
           "BMP": _check_bmp, "TIFF": _check_tiff}
