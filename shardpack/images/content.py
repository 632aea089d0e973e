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

import numpy as np

from shardpack.core.errors import DecodeError

from .budget import (
    DEFAULT_MAX_PIXELS, MAX_PIXELS_ENV, capacity_reason, check_size, decode_budget,
)
from .checks import check_image
from .formats.base import rgb_array
from .formats.jpeg import JPEG_PIXELS_PER_BYTE
from .formats.png import DEFLATE_MAX_RATIO
from .kinds import (
    IMAGE_EXTENSIONS, IMAGE_WORDS, content_format, describe_content, image_format,
    is_image_field, sniff, sniffed_kind,
)
from .registry import codec_named

# what this module held before it was split by concern: every caller imports from here
__all__ = [
    "DEFAULT_MAX_PIXELS", "DEFLATE_MAX_RATIO", "IMAGE_EXTENSIONS", "IMAGE_WORDS",
    "JPEG_PIXELS_PER_BYTE", "MAX_PIXELS_ENV", "capacity_reason", "check_image",
    "check_image_full", "check_size", "content_format", "decode_budget", "decode_rgb",
    "describe_content", "header_size", "image_format", "is_image_field", "rgb_array", "sniff",
]


def check_image_full(data, field: str, max_pixels: int | None = None) -> str | None:
    """:func:`check_image`, then the header's size against what the file can hold
    (:func:`capacity_reason`), then a full decode as training does it (:func:`decode_rgb`, within
    the decode budget ``max_pixels``; Pillow's ``LOAD_TRUNCATED_IMAGES`` is left False, so
    truncated pixel data fails).  None if fine.

    Args:
        data: the image file's bytes.
        field: the field name (not an image field: no check).
        max_pixels: the decode budget (None: :func:`decode_budget`'s default).
    """
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


def header_size(data) -> tuple[int, int] | None:
    """(width, height) from the image's own header (:func:`shardpack.images.headers.read_header`: no
    pixels decoded), or None where it cannot be parsed (the decoder then says why).

    Args:
        data: the image file's bytes.
    """
    from shardpack.images.headers import HeaderShort, read_header

    try:
        return read_header([(0, data)], len(data))[0]
    except (HeaderShort, ValueError):
        return None


def decode_rgb(data, min_side: int = 0, max_pixels: int | None = None) -> np.ndarray:
    """Any supported image -> uint8 ``[H, W, 3]`` (first frame; rules in the module docstring;
    EXIF orientation not applied).  Bad data raises :class:`DecodeError` with a one-line reason.

    Args:
        data: the image file's bytes.
        min_side: a JPEG may come back scaled down by 1/2 to 1/8 in the decoder (its DCT
            scaling, far cheaper than a full decode), never below ``min_side`` on either side.
        max_pixels: the decode budget (:func:`decode_budget`), checked against the header's
            size before any decoder runs (the header's size, whatever the DCT scaling).
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    fmt = sniffed_kind(data) if data else None
    if fmt is None:
        raise DecodeError("cannot decode image: "
                          + (describe_content(data) if data else "empty (0 bytes)"))
    size = header_size(data)
    if size is not None:
        check_size(*size, max_pixels)
    codec = codec_named(fmt)
    pixels = codec.decode(data, min_side, max_pixels)
    if not isinstance(pixels, str):
        return pixels
    detail = codec.check(data) or pixels
    raise DecodeError(f"cannot decode {fmt}: {detail[:1].lower()}{detail[1:]}")
