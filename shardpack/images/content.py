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
import re

import numpy as np

from shardpack.core.errors import DecodeError, ShardpackError

from .budget import (
    DEFAULT_MAX_PIXELS, DEFLATE_MAX_RATIO, JPEG_PIXELS_PER_BYTE, MAX_PIXELS_ENV, capacity_reason,
    check_size, decode_budget, too_large_message,
)
from .checks import STRUCTURE_CHECKS, check_image
from .kinds import (
    IMAGE_EXTENSIONS, IMAGE_WORDS, content_format, describe_content, image_format,
    is_image_field, sniff, sniffed_kind,
)

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
    failure = None
    if fmt == "JPEG":  # libjpeg-turbo via simplejpeg; Pillow for CMYK/YCCK and what it refuses
        pixels, failure = _simplejpeg_rgb(data, min_side, max_pixels)
        if pixels is not None:
            return pixels
    pixels = _pillow_rgb(data, fmt, min_side, max_pixels)
    if not isinstance(pixels, str):
        return pixels
    detail = STRUCTURE_CHECKS[fmt](data) or failure or pixels
    raise DecodeError(f"cannot decode {fmt}: {detail[:1].lower()}{detail[1:]}")


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


def _pillow_rgb(data: bytes, fmt: str, min_side: int, max_pixels: int | None):
    """The image decoded by Pillow as ``fmt``: its pixels, or why Pillow failed (a string).
    The budget's refusals and a decompression bomb raise."""
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
        raise DecodeError(too_large_message(int(count.group(1))) if count else str(exc)) from None
    except Exception as exc:  # Pillow raises many types for bad data
        if isinstance(exc, Image.UnidentifiedImageError):  # its message holds an object repr
            return "Pillow does not recognise the data"
        return str(exc) or type(exc).__name__


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
