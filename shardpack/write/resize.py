"""Pack-time preprocessing: shrink images once while packing, so the training loop never decodes
pixels it will throw away.

Rule (docs/packing.md, docs/images.md): images of a format whose codec re-encodes
(:attr:`Codec.reencodes <shardpack.images.formats.base.Codec.reencodes>`: JPEG, PNG and WebP) whose
shorter side is longer than ``short_side`` are resized so the shorter side equals it (aspect kept)
and re-encoded in their own format, the one their bytes hold, whatever the field name says (JPEG
and WebP at ``quality``, PNG lossless).  EXIF orientation is NOT applied (decoders here do not
apply it either): the original EXIF block and ICC profile are copied into the new file, so the
packed image carries the same orientation tag as the source.  Smaller images are kept byte for
byte: shardpack never upscales.
GIF, BMP, TIFF and animated images pass through unchanged (no sensible lossless re-encode that
keeps every frame and bit depth), but, like every image, are checked first
(:func:`shardpack.images.checks.check_image`).  Other fields pass through unchanged.
"""

from __future__ import annotations

import io

from shardpack.core.errors import BrokenImageError, DecodeError, SKIP_BAD
from shardpack.images.content import check_image, check_size, image_format
from shardpack.images.registry import sniff_codec

__all__ = ["resize_image"]


def resize_image(data: bytes, field: str, short_side: int, quality: int, path: str) -> bytes:
    """The image bytes of ``field``, checked, and resized by the module's rule when their
    shorter side is longer than ``short_side``; raises :class:`BrokenImageError` for an image
    that cannot be read.

    Args:
        data: the image file's bytes.
        field: the field name (its extension names the expected format).
        short_side: the shorter side's length after resizing, in pixels.
        quality: JPEG and WebP quality of the re-encoded image.
        path: the source file, for errors.
    """
    from PIL import Image  # imported here: only packs with --resize need Pillow

    named = image_format(field)
    reason = check_image(data, field)
    if reason:
        raise BrokenImageError(f"cannot resize: not a valid {named or 'image'}"
                          f"{' image' if named else ''} ({reason})", path=path,
                          hint=f"remove it, or pass {SKIP_BAD} to skip and count it")
    codec = sniff_codec(data)  # the content's format, which may differ from the field name's
    if codec is None or not codec.reencodes:  # the others pass through once checked
        return data
    fmt = codec.name
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as img:
            w, h = img.size
            check_size(w, h)  # the decode budget, from the header, before any pixel
            if min(w, h) <= short_side or getattr(img, "n_frames", 1) > 1:
                img.verify()  # still refuse a corrupt image, even when it is kept as it is
                return data
            scale = short_side / min(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            keep = {k: img.info[k] for k in ("exif", "icc_profile") if img.info.get(k)}
            img = codec.prepare(img, size).resize(size, Image.Resampling.BICUBIC,
                                                  reducing_gap=3.0)
            return codec.reencode(img, quality, keep)
    except DecodeError as exc:
        raise BrokenImageError(f"cannot resize: {exc.message}", path=path,
                               hint=f"remove it, or pass {SKIP_BAD} to skip and count it") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BrokenImageError(f"cannot resize: not a valid {fmt} image ({exc})", path=path,
                          hint=f"remove it, or pass {SKIP_BAD} to skip and count it") from None
