"""Image sizes from headers: ((width, height), format) of an image file from its own structure,
without decoding pixels, and from as few of its bytes as that structure needs (``info --stats``
reads headers of ranges of shard bytes; the preview sizes its cells).  Kept apart from
:mod:`shardpack.images`, which checks and decodes images."""

from __future__ import annotations

import io
import struct

from shardpack.core.errors import DecodeError
from shardpack.images.content import decode_rgb
from shardpack.images.kinds import content_format, describe_content
from shardpack.images.registry import sniff_codec


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


def read_header(parts, size: int) -> tuple[tuple[int, int], str]:
    """((width, height), format) from the header of an image file of ``size`` bytes, of which
    ``parts`` holds some windows ``(offset, bytes)`` (the first at offset 0; the whole file in
    one window is fine).  No pixels are decoded, and the format's own structure says where the
    size is, however far in (large APPn segments of a JPEG, a TIFF directory at the end).
    Raises :class:`HeaderShort` naming the bytes it needs next when ``parts`` lacks them, and
    ValueError for bytes it cannot parse (no supported format, a structure it does not expect,
    a header cut off by the end of the file): :func:`header_info` then asks Pillow."""
    get = _Parts(parts, size).get
    codec = sniff_codec(get(0, min(size, 18)))
    if codec is None:
        raise ValueError("not a supported image format")
    fmt = codec.name
    try:
        width, height = codec.size(get)
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
