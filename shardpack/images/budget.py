"""The decode budget: an image's size from its header is checked against it (and Pillow's
decompression-bomb limit) before any pixel memory is taken, and a header that claims more pixels
than the file's compressed data can hold is refused (docs/images.md, "Decode budget")."""

from __future__ import annotations

import os

from shardpack.core.errors import DecodeError, ShardpackError

# The decode budget: 64 Mi pixels (8192 x 8192, 192 MiB of RGB).  12 MP photos, 8K frames
# (7680 x 4320) and 8192 x 8192 textures decode; a 13000 x 13000 PNG bomb (164 KB of deflated
# zeros, 1.8 GB to decode) does not.  docs/images.md, "Decode budget".
DEFAULT_MAX_PIXELS = 8192 * 8192
MAX_PIXELS_ENV = "SHARDPACK_MAX_PIXELS"


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


def pixel_limit(max_pixels: int | None = None) -> int:
    """The most pixels :func:`check_size` lets through (0: no limit): the smaller of the decode
    budget and Pillow's decompression-bomb limit, for code that checks many sizes at once.

    Args:
        max_pixels: the decode budget (None: :func:`decode_budget`'s default).
    """
    from PIL import Image

    limits = [n for n in (decode_budget(max_pixels), 2 * (Image.MAX_IMAGE_PIXELS or 0)) if n]
    return min(limits) if limits else 0


def check_size(width: int, height: int, max_pixels: int | None = None) -> None:
    """Raise DecodeError for an image over the decode budget (:func:`decode_budget`) or over
    Pillow's decompression-bomb limit (read at call time, so raising or clearing
    ``PIL.Image.MAX_IMAGE_PIXELS`` works here as it does in Pillow).  Both apply: the smaller
    one decides.

    Args:
        width: the image's width in pixels.
        height: its height.
        max_pixels: the decode budget (None: :func:`decode_budget`'s default).
    """
    from PIL import Image

    pixels = width * height
    budget = decode_budget(max_pixels)
    if budget and pixels > budget:
        raise DecodeError(f"image too large: {width:,}x{height:,} = {pixels:,} pixels, over the "
                          f"decode budget of {budget:,} pixels (raise it with {MAX_PIXELS_ENV} "
                          "or max_pixels= if the image is real)")
    if Image.MAX_IMAGE_PIXELS and pixels > 2 * Image.MAX_IMAGE_PIXELS:
        raise DecodeError(too_large_message(pixels))


def capacity_reason(data: bytes) -> str | None:
    """Why the header claims more pixels than the file's compressed data can hold, or None (also
    for formats without a bound and for structures it does not parse: the decode judges those).
    Cheap: a header and chunk walk, the format's own (:meth:`Codec.capacity
    <shardpack.images.formats.base.Codec.capacity>`: PNG's deflate bound, JPEG's bits per block;
    docs/images.md, "Decode budget")."""
    from shardpack.images.registry import sniff_codec

    codec = sniff_codec(data)
    return codec.capacity(data) if codec is not None else None


def too_large_message(pixels: int) -> str:
    """The message for an image over Pillow's decompression-bomb limit.

    Args:
        pixels: the image's pixel count.
    """
    from PIL import Image

    return (f"image too large: {pixels:,} pixels, over the decompression-bomb limit of "
            f"{2 * Image.MAX_IMAGE_PIXELS:,} (raise PIL.Image.MAX_IMAGE_PIXELS if it is real)")
