"""Image formats: which fields hold images, a cheap structural check of image bytes, and decoding of
every supported format to 8-bit RGB.  The rules and the reasons for them are in docs/images.md:
the bytes, not the field name, decide an image's format (a PNG named .jpg is a valid image); RGB
drops alpha, keeps the high byte of 16-bit samples, looks palettes up, converts CMYK with Pillow,
takes the first frame, and does NOT apply EXIF orientation.  Every decode first reads the size from
the header and refuses an image over the decode budget (:func:`decode_budget`) or Pillow's
decompression-bomb limit, before any pixel memory is taken; the full check also refuses a header
that claims more pixels than the file's compressed data can hold (:func:`capacity_reason`).
"""

from __future__ import annotations

import io
import os
import re
import struct

import numpy as np

from shardpack.core.errors import DecodeError, ShardpackError

IMAGE_EXTENSIONS = {"jpg": "JPEG", "jpeg": "JPEG", "jpe": "JPEG", "jfif": "JPEG", "png": "PNG",
                    "webp": "WEBP", "gif": "GIF", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF"}
IMAGE_WORDS = ("image", "img")  # image fields that do not name a format (Parquet/HF image columns)

_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"),
          (b"GIF89a", "GIF"), (b"II*\0", "TIFF"), (b"MM\0*", "TIFF"), (b"II+\0", "TIFF"),
          (b"MM\0+", "TIFF"))
_EOI = b"\xff\xd9"

# The decode budget: 64 Mi pixels (8192 x 8192, 192 MiB of RGB).  12 MP photos, 8K frames
# (7680 x 4320) and 8192 x 8192 textures decode; a 13000 x 13000 PNG bomb (164 KB of deflated
# zeros, 1.8 GB to decode) does not.  docs/images.md, "Decode budget".
DEFAULT_MAX_PIXELS = 8192 * 8192
MAX_PIXELS_ENV = "SHARDPACK_MAX_PIXELS"
_BMP_HEADERS = (12, 40, 52, 56, 64, 108, 124)  # the DIB header sizes BMP writers use


def image_format(field: str) -> str | None:
    """Format named by the field's last dot-separated part ("JPEG", "PNG", ...), "" for a generic
    image field (format unknown: sniff the bytes), None for a field that is not an image."""
    last = field.rsplit(".", 1)[-1].lower()
    return "" if last in IMAGE_WORDS else IMAGE_EXTENSIONS.get(last)


def is_image_field(field: str) -> bool:
    return image_format(field) is not None


def sniff(data) -> str | None:
    """Format from the leading magic bytes, or None if they are no supported image."""
    head = bytes(data[:18])
    for magic, fmt in _MAGIC:
        if head.startswith(magic):
            return fmt
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    # "BM" alone is too weak (text may start so): also require a known DIB header size
    if head[:2] == b"BM" and int.from_bytes(head[14:18], "little") in _BMP_HEADERS:
        return "BMP"
    return None


def content_format(data) -> str | None:
    """The format shardpack decodes these bytes (or their first bytes) as; None for content that
    is no supported image (no decode can read it)."""
    return _kind(bytes(data[:18]))


def _kind(data: bytes) -> str | None:
    """The format whose structural check applies: the sniffed one; a JPEG start-of-image followed
    by garbage is a corrupt JPEG, and a cut-off signature a truncated image, not "other data"."""
    found = sniff(data)
    if found or data[:2] == b"\xff\xd8":
        return found or "JPEG"
    if 2 <= len(data) < 18:
        for magic, fmt in _MAGIC + ((b"BM", "BMP"), (b"RIFF", "WEBP")):
            if data[:len(magic)] == magic[:len(data)]:
                return fmt
    return None


_CONTENT = ((b"%PDF", "is a PDF document"), (b"PK\x03\x04", "is a ZIP archive"),
            (b"\x1f\x8b", "is gzip data"), (b"\xff\x0a", "is JPEG XL data (not supported)"),
            (b"<?xml", "looks like XML"), (b"{", "looks like JSON"), (b"[", "looks like JSON"))


def describe_content(data: bytes) -> str:
    """What bytes that are no supported image look like, for the error message."""
    head = data[:512]
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html")) or b"<body" in text or b"<head" in text:
        return "content looks like HTML"
    if b"<svg" in text:
        return "content is an SVG drawing (not supported)"
    if head[4:8] == b"ftyp":  # ISO media: HEIF/AVIF stills or video
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"mif1", b"msf1", b"hevc", b"avif"):
            return f"content is {'AVIF' if brand == b'avif' else 'HEIC'} image data (not supported)"
        return "content is MP4/QuickTime video data"
    for magic, what in _CONTENT:
        if text.startswith(magic.lower()):
            return f"content {what}"
    if data.count(0) == len(data):
        return f"content is all zero bytes ({len(data)} bytes)"
    if all(32 <= b < 127 or b in b"\t\n\r" for b in head):
        return "content looks like text"
    return "content is unrecognised binary data"


def check_image(data, field: str) -> str | None:
    """None if the image bytes look whole, else a short one-line reason.  Cheap: header and
    chunk walks, no pixel decode (a few microseconds for a 100 KB JPEG).  An image whose content is
    another supported format than the field name says is accepted (checked as what it is).
    Fields that are not image fields are not checked (None)."""
    expected = image_format(field)
    if expected is None:
        return None
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    if not data:
        return "empty image file (0 bytes)"
    fmt = _kind(data)
    if fmt is None:
        return f"not {'a ' + expected if expected else 'an'} image: {describe_content(data)}"
    return _CHECKS[fmt](data)


_JPEG_CUT = "truncated JPEG: file ends inside the headers, before the image data"


def _check_jpeg(data: bytes) -> str | None:
    # Walk the marker segments by their lengths up to the first scan: an EXIF thumbnail (a whole
    # JPEG, EOI included, inside APP1) is skipped by its segment length and never counts.
    n, pos, frame = len(data), 2, False
    while True:
        if pos + 2 > n:
            return _JPEG_CUT
        if data[pos] != 0xFF:
            return f"corrupt JPEG: no marker at byte {pos}"
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        if marker == 0xD9:
            return "corrupt JPEG: end-of-image marker before any image data"
        if pos + 4 > n:
            return _JPEG_CUT
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2:
            return f"corrupt JPEG: bad segment length at byte {pos}"
        pos += 2 + length
        if marker == 0xDA:
            break
        frame |= 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC)
    if pos > n - 2:
        return _JPEG_CUT
    if not frame:
        return "corrupt JPEG: image data before any frame header"
    # FF D9 cannot occur inside entropy-coded data (FF is stuffed there), so one anywhere after the
    # scan header is the end of the image; data appended after it (motion photos) is fine.  The
    # end-of-file test first: rfind is C speed but reads the whole file when EOI is missing.
    if data[-2:] != _EOI and data.rfind(_EOI, pos) < 0:
        return "truncated JPEG: no end-of-image marker after the scan data"
    return None


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
    if n < 26 or n < 14 + header or header not in _BMP_HEADERS:
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


_CHECKS = {"JPEG": _check_jpeg, "PNG": _check_png, "GIF": _check_gif, "WEBP": _check_webp,
           "BMP": _check_bmp, "TIFF": _check_tiff}


def check_image_full(data, field: str, max_pixels: int | None = None) -> str | None:
    """:func:`check_image`, then the header's size against what the file can hold
    (:func:`capacity_reason`), then a full decode as training does it (:func:`decode_rgb`, within
    the decode budget ``max_pixels``; Pillow's ``LOAD_TRUNCATED_IMAGES`` is left False, so
    truncated pixel data fails).  None if fine."""
    reason = check_image(data, field)
    if reason or image_format(field) is None:
        return reason
    if not isinstance(data, (bytes, bytearray)):
        data = bytes(data)
    reason = capacity_reason(data)
    if reason:
        return reason
    try:
        decode_rgb(data, max_pixels=max_pixels)
    except DecodeError as exc:
        return exc.message
    return None


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
    one decides."""
    from PIL import Image

    pixels = width * height
    budget = decode_budget(max_pixels)
    if budget and pixels > budget:
        raise DecodeError(f"image too large: {width:,}x{height:,} = {pixels:,} pixels, over the "
                          f"decode budget of {budget:,} pixels (raise it with {MAX_PIXELS_ENV} "
                          "or max_pixels= if the image is real)")
    if Image.MAX_IMAGE_PIXELS and pixels > 2 * Image.MAX_IMAGE_PIXELS:
        raise DecodeError(_too_large(pixels))


def header_size(data) -> tuple[int, int] | None:
    """(width, height) from the image's own header (:func:`shardpack.images.headers.read_header`: no
    pixels decoded), or None where it cannot be parsed (the decoder then says why)."""
    from shardpack.images.headers import HeaderShort, read_header

    try:
        return read_header([(0, data)], len(data))[0]
    except (HeaderShort, ValueError):
        return None


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


def _too_large(pixels: int) -> str:
    from PIL import Image

    return (f"image too large: {pixels:,} pixels, over the decompression-bomb limit of "
            f"{2 * Image.MAX_IMAGE_PIXELS:,} (raise PIL.Image.MAX_IMAGE_PIXELS if it is real)")


def decode_rgb(data, min_side: int = 0, max_pixels: int | None = None) -> np.ndarray:
    """Any supported image -> uint8 ``[H, W, 3]`` (first frame; rules in the module docstring;
    EXIF orientation not applied).  Bad data raises :class:`DecodeError` with a one-line reason.
    ``min_side``: a JPEG may come back scaled down by 1/2 to 1/8 in the decoder (its DCT
    scaling, far cheaper than a full decode), never below ``min_side`` on either side.
    ``max_pixels``: the decode budget (:func:`decode_budget`), checked against the header's
    size before any decoder runs (the header's size, whatever the DCT scaling)."""
    if not isinstance(data, bytes):
        data = bytes(data)
    fmt = _kind(data) if data else None
    if fmt is None:
        raise DecodeError("cannot decode image: "
                          + (describe_content(data) if data else "empty (0 bytes)"))
    size = header_size(data)
    if size is not None:
        check_size(*size, max_pixels)
    failure = None
    if fmt == "JPEG":  # libjpeg-turbo via simplejpeg; Pillow for CMYK/YCCK and what it refuses
        import simplejpeg

        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError as exc:
            failure, colorspace = str(exc), None
        else:
            check_size(width, height, max_pixels)
        if colorspace not in (None, "CMYK", "YCCK"):
            try:
                return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=min_side,
                                              min_width=min_side)
            except ValueError as exc:
                failure = str(exc)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as image:
            check_size(*image.size, max_pixels)  # (headers our parser did not read)
            if min_side and fmt == "JPEG":  # (CMYK, YCCK: the same DCT scaling in Pillow)
                image.draft(image.mode, (min_side, min_side))
            image.load()
            return rgb_array(image)
    except ShardpackError:  # the budget's refusal, or a bad budget setting: as they are
        raise
    except Image.DecompressionBombError as exc:
        count = re.search(r"(\d+) pixels", str(exc))
        raise DecodeError(_too_large(int(count.group(1))) if count else str(exc)) from None
    except Exception as exc:  # Pillow raises many types for bad data
        if isinstance(exc, Image.UnidentifiedImageError):  # its message holds an object repr
            exc = "Pillow does not recognise the data"
        failure = failure or str(exc) or type(exc).__name__
    detail = _CHECKS[fmt](data) or failure
    raise DecodeError(f"cannot decode {fmt}: {detail[:1].lower()}{detail[1:]}") from None


def rgb_array(image) -> np.ndarray:
    """A loaded Pillow image -> uint8 ``[H, W, 3]`` by shardpack's rules: 16-bit (and 32-bit int)
    samples keep their high byte, where Pillow's ``convert("RGB")`` clips them at 255; palettes are
    looked up directly (transparency ignored, no warning); alpha is dropped; every other mode
    (CMYK, LA, 1-bit, YCbCr) goes through Pillow's ``convert("RGB")``."""
    mode = image.mode
    if mode == "RGB":
        return np.asarray(image)
    if mode.startswith("I") or mode == "F":  # I;16, I;16B, I;16L, I (32-bit), F (float)
        samples = np.asarray(image)
        samples = np.clip(samples, 0, 255) if mode == "F" else np.clip(samples, 0, 65535) >> 8
        gray = samples.astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if mode == "P" and image.palette is not None:
        palette = np.zeros((256, 3), np.uint8)
        colours = np.frombuffer(bytes(image.getpalette("RGB") or ()), np.uint8).reshape(-1, 3)
        palette[:len(colours)] = colours[:256]
        return palette[np.asarray(image)]
    if mode == "RGBA":
        return np.ascontiguousarray(np.asarray(image)[:, :, :3])
    return np.asarray(image.convert("RGB"))
