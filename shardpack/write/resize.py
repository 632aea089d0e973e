"""Pack-time preprocessing: shrink images once while packing, so the training loop never decodes
pixels it will throw away.

Rule (docs/packing.md, docs/images.md): JPEG, PNG and WebP images whose shorter side is longer than
``short_side`` are resized so the shorter side equals it (aspect kept) and re-encoded in their own
format, the one their bytes hold, whatever the field name says (JPEG and WebP at ``quality``, PNG
lossless).  EXIF orientation is NOT applied (decoders here do not apply it either): the original
EXIF block and ICC profile are copied into the new file, so the packed image carries the same
orientation tag as the source.  Smaller images are kept byte for byte: shardpack never upscales.
GIF, BMP, TIFF and animated images pass through unchanged (no sensible lossless re-encode that
keeps every frame and bit depth), but, like every image, are checked first
(:func:`shardpack.images.checks.check_image`).  Other fields pass through unchanged.
"""

from __future__ import annotations

import io

from shardpack.core.errors import BrokenImageError, DecodeError, SKIP_BAD
from shardpack.images.content import check_image, check_size, image_format, sniff

REENCODED = ("JPEG", "PNG", "WEBP")  # formats resized; the others pass through once checked

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
    fmt = sniff(data)  # the content's format, which may differ from the field name's
    if fmt not in REENCODED:
        return data
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
            if fmt == "JPEG":
                img.draft("RGB", size)  # DCT-domain downscale: decode at 1/2, 1/4 or 1/8
            img = img.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
            if fmt == "JPEG" and img.mode not in ("RGB", "L", "CMYK"):
                img = img.convert("RGB")
            out = io.BytesIO()
            kwargs = {"quality": quality} if fmt in ("JPEG", "WEBP") else {"optimize": False}
            img.save(out, fmt, **kwargs, **keep)
            return out.getvalue()
    except DecodeError as exc:
        raise BrokenImageError(f"cannot resize: {exc.message}", path=path,
                               hint=f"remove it, or pass {SKIP_BAD} to skip and count it") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BrokenImageError(f"cannot resize: not a valid {fmt} image ({exc})", path=path,
                          hint=f"remove it, or pass {SKIP_BAD} to skip and count it") from None
