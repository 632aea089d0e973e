"""JPEG: libjpeg-turbo decodes it (simplejpeg; Pillow for CMYK/YCCK and what simplejpeg refuses),
at a DCT scale where a smaller image will do; the region decoder and nvJPEG take it too."""

from __future__ import annotations

import struct

import numpy as np

from shardpack.images.budget import check_size
from shardpack.images.formats.base import Codec, pillow_rgb

EOI = b"\xff\xd9"
JPEG_CUT = "truncated JPEG: file ends inside the headers, before the image data"

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


JPEG_PIXELS_PER_BYTE = 64 * 8
_JPEG_HUFFMAN_SOF = (0xC0, 0xC1, 0xC2, 0xC3)


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


def _simplejpeg_rgb(data: bytes, min_side: int,
                    max_pixels: int | None) -> tuple[np.ndarray | None, str | None]:
    """A JPEG decoded by libjpeg-turbo: ``(pixels, None)``; ``(None, why)`` where simplejpeg
    fails; ``(None, None)`` for CMYK and YCCK, which Pillow converts."""
    import simplejpeg

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        return None, str(exc)
    check_size(width, height, max_pixels)
    if colorspace in ("CMYK", "YCCK"):
        return None, None
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=min_side,
                                      min_width=min_side), None
    except ValueError as exc:
        return None, str(exc)


class JpegCodec(Codec):
    """JPEG (JFIF, EXIF): baseline, progressive, lossless; Gray, RGB/YCbCr, CMYK, YCCK."""

    name = "JPEG"
    extensions = ("jpg", "jpeg", "jpe", "jfif")
    magics = (b"\xff\xd8\xff",)
    reencodes = nvjpeg = region = True

    def sniff(self, head: bytes) -> bool:
        """The full signature; a start-of-image followed by garbage is still a (corrupt) JPEG
        for the checks: :meth:`claims`."""
        return head.startswith(self.magics[0])

    def claims(self, head: bytes) -> bool:
        """A start-of-image marker, whatever follows: bytes a JPEG decoder would try."""
        return head[:2] == b"\xff\xd8"

    def size(self, get) -> tuple[int, int]:
        """(width, height) from the first frame header."""
        return _jpeg_size(get)

    def check(self, data: bytes) -> str | None:
        """The segment walk to the first scan, and an end-of-image marker after it."""
        return _check_jpeg(data)

    def capacity(self, data: bytes) -> str | None:
        """At most :data:`JPEG_PIXELS_PER_BYTE` pixels per byte of Huffman-coded scan data."""
        return _jpeg_capacity(data)

    def decode(self, data: bytes, min_side: int, max_pixels: int | None):
        """libjpeg-turbo (simplejpeg) at the smallest DCT scale over ``min_side``; Pillow for
        CMYK/YCCK and what simplejpeg refuses (its reason kept when Pillow fails too)."""
        pixels, failure = _simplejpeg_rgb(data, min_side, max_pixels)
        if pixels is not None:
            return pixels
        pixels = pillow_rgb(data, self.name, min_side, max_pixels, draft=True)
        return failure if isinstance(pixels, str) and failure else pixels

    def prepare(self, image, size: tuple[int, int]):
        """A DCT-domain downscale (decode at 1/2, 1/4 or 1/8) before the resize."""
        image.draft("RGB", size)
        return image

    def reencode(self, image, quality: int, keep: dict) -> bytes:
        """Saved in a mode JPEG holds."""
        if image.mode not in ("RGB", "L", "CMYK"):
            image = image.convert("RGB")
        return super().reencode(image, quality, keep)

    def save_options(self, quality: int) -> dict:
        """At ``quality``."""
        return {"quality": quality}


JPEG = JpegCodec()
